//! Latency histograms in whole milliseconds, and quantile estimates from them.
//!
//! The buckets are 1 ms wide up to [`EXACT_UP_TO_MS`], then grow by a tenth each up to an hour
//! ([`BUCKETS_MS`]), so a quantile read inside a bucket is off by at most the bucket's width
//! (about 10% of the value; 5% on average). Each histogram also keeps its smallest and largest
//! sample, and every quantile lies between them: one sample, or identical ones, give exactly
//! that value, the 100th percentile is the largest sample, and a quantile in the overflow bucket
//! (above an hour) is the largest sample.

use serde::{Deserialize, Serialize};

/// Buckets are 1 ms wide up to here (ms).
pub const EXACT_UP_TO_MS: u64 = 20;
/// The last bound (ms): an hour. Samples above it land in the overflow bucket.
pub const LAST_BOUND_MS: u64 = 3_600_000;

/// Fixed point of the geometric bounds: millionths of a millisecond.
const SCALE: u64 = 1_000_000;

/// The bound after `scaled` (the previous geometric bound, in millionths) and `bound` (the
/// previous bound, ms): a tenth more, rounded to a whole ms, at least 1 ms more.
const fn next_bound(scaled: u64, bound: u64) -> (u64, u64) {
    let scaled = scaled / 10 * 11;
    let rounded = (scaled + SCALE / 2) / SCALE;
    (scaled, if rounded > bound { rounded } else { bound + 1 })
}

/// How many bounds [`bounds`] makes.
const fn bound_count() -> usize {
    let (mut scaled, mut bound, mut count) = (EXACT_UP_TO_MS * SCALE, EXACT_UP_TO_MS, EXACT_UP_TO_MS as usize);
    loop {
        (scaled, bound) = next_bound(scaled, bound);
        if bound >= LAST_BOUND_MS {
            return count + 1;
        }
        count += 1;
    }
}

/// 1, 2, … [`EXACT_UP_TO_MS`], then ×1.1 per bound (rounded) while below [`LAST_BOUND_MS`],
/// then [`LAST_BOUND_MS`].
const fn bounds<const N: usize>() -> [u64; N] {
    let mut out = [0; N];
    let mut i = 0;
    while i < EXACT_UP_TO_MS as usize {
        out[i] = i as u64 + 1;
        i += 1;
    }
    let (mut scaled, mut bound) = (EXACT_UP_TO_MS * SCALE, EXACT_UP_TO_MS);
    while i < N - 1 {
        (scaled, bound) = next_bound(scaled, bound);
        out[i] = bound;
        i += 1;
    }
    out[N - 1] = LAST_BOUND_MS;
    out
}

/// Upper bounds (inclusive, ms) of the finite buckets; one more bucket holds everything above
/// the last bound. Bucket `i` holds the samples in `(BUCKETS_MS[i - 1], BUCKETS_MS[i]]` (from 0
/// for the first).
pub const BUCKETS_MS: [u64; bound_count()] = bounds();

/// The bucket of a `ms` sample: the index of the first bound `>= ms`, or `BUCKETS_MS.len()`.
pub fn bucket_of(ms: u64) -> usize {
    BUCKETS_MS.partition_point(|bound| *bound < ms)
}

/// A histogram field that no histogram has.
#[derive(Debug, thiserror::Error)]
#[error("no histogram field {0:?}")]
pub struct UnknownField(pub String);

/// Samples of one latency, counted per bucket (not cumulative), with their extremes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    /// Samples recorded.
    pub count: u64,
    /// Sum of the samples, ms.
    pub sum_ms: u64,
    /// The smallest sample, ms (0 without samples).
    pub min_ms: u64,
    /// The largest sample, ms (0 without samples).
    pub max_ms: u64,
    /// Samples per bucket: `BUCKETS_MS.len() + 1` entries, the last one above every bound.
    pub buckets: Vec<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// No samples.
    pub fn new() -> Self {
        Self { count: 0, sum_ms: 0, min_ms: 0, max_ms: 0, buckets: vec![0; BUCKETS_MS.len() + 1] }
    }

    /// Adds one sample.
    pub fn record(&mut self, ms: u64) {
        let first = self.count == 0;
        self.count += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
        self.min_ms = if first { ms } else { self.min_ms.min(ms) };
        self.max_ms = if first { ms } else { self.max_ms.max(ms) };
        self.buckets[bucket_of(ms)] += 1;
    }

    /// Adds every sample of `other` (the histogram of both sample sets).
    pub fn merge(&mut self, other: &Histogram) {
        if other.count == 0 {
            return;
        }
        let first = self.count == 0;
        self.count += other.count;
        self.sum_ms = self.sum_ms.saturating_add(other.sum_ms);
        self.min_ms = if first { other.min_ms } else { self.min_ms.min(other.min_ms) };
        self.max_ms = if first { other.max_ms } else { self.max_ms.max(other.max_ms) };
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine += theirs;
        }
    }

    /// Estimates the `q` quantile (`0.0..=1.0`) in ms: the bucket holding it is found by rank,
    /// and the value interpolated linearly between the least and the greatest whole ms the
    /// bucket may hold, both kept within the smallest and largest sample (a bucket `(lo, hi]`
    /// holds `lo + 1 ..= hi`). A quantile in the overflow bucket is the largest sample. `None`
    /// without samples.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let mut below = 0u64;
        for (index, &in_bucket) in self.buckets.iter().enumerate() {
            if in_bucket > 0 && (below + in_bucket) as f64 >= rank {
                let Some(&upper) = BUCKETS_MS.get(index) else { break };
                let lower = if index == 0 { 0 } else { BUCKETS_MS[index - 1] + 1 };
                let within_samples = |bound: u64| bound.max(self.min_ms).min(self.max_ms);
                let (lower, upper) = (within_samples(lower), within_samples(upper));
                let within = ((rank - below as f64) / in_bucket as f64).clamp(0.0, 1.0);
                return Some(lower as f64 + (upper - lower) as f64 * within);
            }
            below += in_bucket;
        }
        Some(self.max_ms as f64)
    }

    /// The fields a store keeps it in, with their values: `count`, `sum`, `min`, `max`, and
    /// the index of every bucket holding samples. [`Histogram::set_field`] reads them back.
    pub fn fields(&self) -> Vec<(String, u64)> {
        let mut fields = vec![
            ("count".to_owned(), self.count),
            ("sum".to_owned(), self.sum_ms),
            ("min".to_owned(), self.min_ms),
            ("max".to_owned(), self.max_ms),
        ];
        let held = self.buckets.iter().enumerate().filter(|(_, n)| **n > 0);
        fields.extend(held.map(|(index, n)| (index.to_string(), *n)));
        fields
    }

    /// Sets `field` (one of [`Histogram::fields`]) to `value`.
    pub fn set_field(&mut self, field: &str, value: u64) -> Result<(), UnknownField> {
        let slot = match field {
            "count" => &mut self.count,
            "sum" => &mut self.sum_ms,
            "min" => &mut self.min_ms,
            "max" => &mut self.max_ms,
            bucket => bucket
                .parse::<usize>()
                .ok()
                .and_then(|index| self.buckets.get_mut(index))
                .ok_or_else(|| UnknownField(field.to_owned()))?,
        };
        *slot = value;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(samples: impl IntoIterator<Item = u64>) -> Histogram {
        let mut histogram = Histogram::new();
        for ms in samples {
            histogram.record(ms);
        }
        histogram
    }

    #[test]
    fn bounds_are_whole_ms_then_a_tenth_apart_up_to_an_hour() {
        assert_eq!(BUCKETS_MS[..20], (1..=20).collect::<Vec<_>>()[..]);
        assert_eq!(BUCKETS_MS[20..24], [22, 24, 27, 29]);
        assert_eq!(*BUCKETS_MS.last().unwrap(), LAST_BOUND_MS);
        for pair in BUCKETS_MS.windows(2) {
            assert!(pair[0] < pair[1], "{pair:?}");
            let ratio = pair[1] as f64 / pair[0] as f64;
            assert!(pair[1] <= EXACT_UP_TO_MS || ratio < 1.13, "{pair:?}: {ratio}");
        }
        assert!(BUCKETS_MS.len() < 160, "{}", BUCKETS_MS.len());
    }

    #[test]
    fn samples_land_in_the_first_bucket_whose_bound_holds_them() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 0);
        assert_eq!(bucket_of(2), 1);
        assert_eq!(bucket_of(20), 19);
        assert_eq!(bucket_of(21), 20);
        assert_eq!(bucket_of(22), 20);
        assert_eq!(bucket_of(3_600_000), BUCKETS_MS.len() - 1);
        assert_eq!(bucket_of(3_600_001), BUCKETS_MS.len());
        assert_eq!(bucket_of(u64::MAX), BUCKETS_MS.len());
    }

    #[test]
    fn one_sample_is_every_quantile() {
        assert_eq!(Histogram::new().quantile(0.5), None);
        let histogram = of([80]);
        for q in [0.0, 0.5, 0.95, 0.99, 1.0] {
            assert_eq!(histogram.quantile(q), Some(80.0), "q {q}");
        }
        assert_eq!((histogram.count, histogram.sum_ms, histogram.min_ms, histogram.max_ms), (1, 80, 80, 80));
    }

    #[test]
    fn identical_samples_are_every_quantile() {
        for ms in [1, 7, 80, 1_234, 3_599_999] {
            let histogram = of([ms, ms, ms]);
            for q in [0.0, 0.5, 0.99, 1.0] {
                assert_eq!(histogram.quantile(q), Some(ms as f64), "{ms} at q {q}");
            }
        }
        assert_eq!(of([1, 1]).quantile(0.99), Some(1.0), "two samples of 1 ms: the mean, not a bucket bound");
    }

    #[test]
    fn the_median_of_1_to_100_is_within_5_percent_of_50() {
        let histogram = of(1..=100);
        let p50 = histogram.quantile(0.5).unwrap();
        assert!((p50 - 50.0).abs() <= 2.5, "p50 {p50}");
        assert_eq!(histogram.quantile(0.1), Some(10.0), "exact below 20 ms");
        assert_eq!(histogram.quantile(0.0), Some(1.0));
        assert_eq!(histogram.quantile(1.0), Some(100.0));
        let p99 = histogram.quantile(0.99).unwrap();
        assert!((94.0..=100.0).contains(&p99), "p99 {p99}");
    }

    #[test]
    fn quantiles_never_pass_the_largest_sample() {
        for samples in [vec![80, 81], vec![5, 900, 901, 950], vec![13, 14, 15, 16, 17, 130, 131]] {
            let histogram = of(samples.iter().copied());
            let max = *samples.iter().max().unwrap() as f64;
            let min = *samples.iter().min().unwrap() as f64;
            for q in [0.0, 0.5, 0.9, 0.95, 0.99, 1.0] {
                let value = histogram.quantile(q).unwrap();
                assert!((min..=max).contains(&value), "{samples:?} q {q}: {value}");
            }
            assert_eq!(histogram.quantile(1.0), Some(max), "{samples:?}");
        }
    }

    #[test]
    fn the_overflow_bucket_reports_the_largest_sample() {
        let histogram = of([5, 10_000_000]);
        assert_eq!(histogram.quantile(0.99), Some(10_000_000.0));
        assert_eq!(histogram.quantile(0.5), Some(5.0));
        assert_eq!(of([4_000_000, 9_000_000]).quantile(0.5), Some(9_000_000.0));
    }

    #[test]
    fn merged_histograms_are_the_histogram_of_both_sample_sets() {
        let mut merged = Histogram::new();
        merged.merge(&of([]));
        assert_eq!(merged, Histogram::new());
        merged.merge(&of([30, 5_000]));
        merged.merge(&Histogram::new());
        merged.merge(&of([7, 80, 4_000_000]));
        assert_eq!(merged, of([30, 5_000, 7, 80, 4_000_000]));
    }

    #[test]
    fn fields_read_back_into_the_same_histogram() {
        let histogram = of([3, 80, 80, 5_000, 4_000_000]);
        let mut read = Histogram::new();
        for (field, value) in histogram.fields() {
            read.set_field(&field, value).unwrap();
        }
        assert_eq!(read, histogram);
        assert_eq!(histogram.fields().len(), 4 + 4, "only the buckets holding samples");
        assert!(read.set_field("9999", 1).is_err());
        assert!(read.set_field("median", 1).is_err());
    }
}
