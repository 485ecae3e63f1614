//! Percentiles of a sample of latencies, and the median of a figure across runs.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// p50, p95 and p99 of a sample, in milliseconds (nearest rank).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Percentiles {
    /// Median.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
}

impl Percentiles {
    /// The percentiles of `sample` (all zero when it is empty).
    pub fn of(sample: &[Duration]) -> Self {
        let mut sorted = sample.to_vec();
        sorted.sort_unstable();
        let at = |q: f64| {
            if sorted.is_empty() {
                return 0.0;
            }
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            sorted[rank - 1].as_secs_f64() * 1e3
        };
        Self { p50_ms: at(0.50), p95_ms: at(0.95), p99_ms: at(0.99) }
    }

    /// The median of each percentile across `runs`.
    pub fn median(runs: &[Self]) -> Self {
        Self {
            p50_ms: median(runs.iter().map(|p| p.p50_ms)),
            p95_ms: median(runs.iter().map(|p| p.p95_ms)),
            p99_ms: median(runs.iter().map(|p| p.p99_ms)),
        }
    }
}

/// The median of `values` (the mean of the middle two for an even count; 0 when empty).
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.into_iter().collect();
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_and_ordered() {
        let sample: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let p = Percentiles::of(&sample);
        assert_eq!((p.p50_ms, p.p95_ms, p.p99_ms), (50.0, 95.0, 99.0));
        let one = Percentiles::of(&[Duration::from_micros(1500)]);
        assert_eq!((one.p50_ms, one.p99_ms), (1.5, 1.5));
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
    }

    #[test]
    fn medians_take_the_middle() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median([]), 0.0);
        let runs = [
            Percentiles { p50_ms: 1.0, p95_ms: 5.0, p99_ms: 9.0 },
            Percentiles { p50_ms: 3.0, p95_ms: 4.0, p99_ms: 7.0 },
            Percentiles { p50_ms: 2.0, p95_ms: 6.0, p99_ms: 8.0 },
        ];
        assert_eq!(Percentiles::median(&runs), Percentiles { p50_ms: 2.0, p95_ms: 5.0, p99_ms: 8.0 });
    }
}
