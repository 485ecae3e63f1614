//! Latency histograms with fixed buckets in milliseconds, and quantile estimates from them.

use serde::{Deserialize, Serialize};

/// Upper bounds (inclusive, ms) of the finite buckets; one more bucket holds everything above
/// the last bound.
pub const BUCKETS_MS: [u64; 16] =
    [10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 900_000, 3_600_000];

/// The bucket of a `ms` sample: the index of the first bound `>= ms`, or `BUCKETS_MS.len()`.
pub fn bucket_of(ms: u64) -> usize {
    BUCKETS_MS.iter().position(|bound| ms <= *bound).unwrap_or(BUCKETS_MS.len())
}

/// Samples of one latency, counted per bucket (not cumulative).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    /// Samples recorded.
    pub count: u64,
    /// Sum of the samples, ms.
    pub sum_ms: u64,
    /// Samples per bucket: `BUCKETS_MS.len() + 1` entries, the last one above every bound.
    pub buckets: Vec<u64>,
}

impl Histogram {
    /// No samples.
    pub fn new() -> Self {
        Self { count: 0, sum_ms: 0, buckets: vec![0; BUCKETS_MS.len() + 1] }
    }

    /// Adds one sample.
    pub fn record(&mut self, ms: u64) {
        self.count += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
        self.buckets[bucket_of(ms)] += 1;
    }

    /// Estimates the `q` quantile (`0.0..=1.0`) in ms by linear interpolation inside the bucket
    /// holding it, as Prometheus' `histogram_quantile` does; a quantile in the overflow bucket
    /// is reported as the last bound. `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let mut below = 0u64;
        for (index, &in_bucket) in self.buckets.iter().enumerate() {
            if in_bucket > 0 && (below + in_bucket) as f64 >= rank {
                let Some(&upper) = BUCKETS_MS.get(index) else {
                    return Some(BUCKETS_MS[BUCKETS_MS.len() - 1] as f64);
                };
                let lower = if index == 0 { 0 } else { BUCKETS_MS[index - 1] };
                let within = ((rank - below as f64) / in_bucket as f64).clamp(0.0, 1.0);
                return Some(lower as f64 + (upper - lower) as f64 * within);
            }
            below += in_bucket;
        }
        Some(BUCKETS_MS[BUCKETS_MS.len() - 1] as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_land_in_the_first_bucket_whose_bound_holds_them() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(10), 0);
        assert_eq!(bucket_of(11), 1);
        assert_eq!(bucket_of(1_000), 6);
        assert_eq!(bucket_of(1_001), 7);
        assert_eq!(bucket_of(3_600_000), BUCKETS_MS.len() - 1);
        assert_eq!(bucket_of(3_600_001), BUCKETS_MS.len());
        assert_eq!(bucket_of(u64::MAX), BUCKETS_MS.len());
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let mut histogram = Histogram::new();
        assert_eq!(histogram.quantile(0.5), None);
        for _ in 0..100 {
            histogram.record(80);
        }
        assert_eq!(histogram.count, 100);
        assert_eq!(histogram.sum_ms, 8_000);
        assert_eq!(histogram.buckets[3], 100);
        assert_eq!(histogram.quantile(0.5), Some(75.0), "halfway between 50 and 100");
        assert_eq!(histogram.quantile(1.0), Some(100.0));

        for _ in 0..100 {
            histogram.record(2_000);
        }
        assert_eq!(histogram.quantile(0.25), Some(75.0));
        assert_eq!(histogram.quantile(0.75), Some(1_750.0), "halfway between 1000 and 2500");
    }

    #[test]
    fn the_overflow_bucket_reports_the_last_bound() {
        let mut histogram = Histogram::new();
        histogram.record(5);
        histogram.record(10_000_000);
        assert_eq!(histogram.quantile(0.99), Some(3_600_000.0));
        assert_eq!(histogram.quantile(0.5), Some(10.0));
    }
}
