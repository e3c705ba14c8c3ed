//! Log-linear latency buckets: the histogram behind
//! [`HealthWindow::latency_percentile`](super::HealthWindow::latency_percentile).
//!
//! # Why log-linear buckets?
//!
//! A percentile over recent calls must be cheap to *record* (every call records) and good
//! enough to *read* (a hedging delay, a dashboard). Keeping every latency is neither cheap nor
//! bounded; an HDR-style log-linear histogram is both: the range is split into powers of two
//! and each power into [`SUB_BUCKETS`] equal parts, so recording is one increment at an index
//! computed with a `leading_zeros`, and every bucket is at most 25 % as wide as the values in
//! it. The window keeps one such histogram per time slot (and per recording thread), so old
//! latencies leave with their slot.
//!
//! Latencies are kept in whole microseconds from 0 to [`MAX_LATENCY`] (about 71 minutes);
//! longer calls are counted in the last bucket.

use std::time::Duration;

/// Sub-buckets per power of two: 4, so a bucket is at most a quarter of its lower bound wide.
pub const SUB_BUCKETS: usize = 4;
const SUB_BITS: u32 = 2;
/// The largest latency told apart from longer ones: 2³² − 1 µs, about 71.6 minutes.
pub const MAX_LATENCY: Duration = Duration::from_micros(u32::MAX as u64);
/// Buckets in one histogram.
pub(crate) const BUCKETS: usize = (32 - SUB_BITS as usize + 1) * SUB_BUCKETS;

/// The bucket a latency falls in.
#[inline]
pub(crate) fn bucket_of(elapsed: Duration) -> usize {
    let secs = elapsed.as_secs();
    let micros = if secs > u64::from(u32::MAX) / 1_000_000 {
        u64::from(u32::MAX)
    } else {
        (secs * 1_000_000 + u64::from(elapsed.subsec_micros())).min(u64::from(u32::MAX))
    };
    bucket_of_micros(micros)
}

#[inline]
fn bucket_of_micros(micros: u64) -> usize {
    if micros < SUB_BUCKETS as u64 {
        return micros as usize;
    }
    // exp >= SUB_BITS: the power of two the value falls in.
    let exp = 63 - micros.leading_zeros();
    let sub = (micros >> (exp - SUB_BITS)) as usize & (SUB_BUCKETS - 1);
    (exp - SUB_BITS + 1) as usize * SUB_BUCKETS + sub
}

/// The smallest latency, in microseconds, that falls in `bucket`.
fn lower_bound(bucket: usize) -> u64 {
    if bucket < SUB_BUCKETS {
        return bucket as u64;
    }
    let exp = (bucket / SUB_BUCKETS) as u32 + SUB_BITS - 1;
    let sub = (bucket % SUB_BUCKETS) as u64;
    (SUB_BUCKETS as u64 + sub) << (exp - SUB_BITS)
}

/// The largest latency, in microseconds, that falls in `bucket` ("highest equivalent value").
fn upper_bound(bucket: usize) -> u64 {
    if bucket + 1 >= BUCKETS {
        u64::from(u32::MAX)
    } else {
        lower_bound(bucket + 1) - 1
    }
}

/// The `q`-quantile of a histogram (counts per bucket, `total` their sum): the highest
/// latency of the bucket holding the call of rank ⌈q·total⌉ (at least 1). `None` when the
/// histogram is empty or `q` is not in `0..=1`.
pub(crate) fn quantile(counts: &[u64; BUCKETS], q: f64) -> Option<Duration> {
    if !(0.0..=1.0).contains(&q) {
        return None;
    }
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (bucket, &n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(Duration::from_micros(upper_bound(bucket)));
        }
    }
    // Unreachable: the counts sum to `total >= rank`.
    Some(MAX_LATENCY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_tile_the_range_without_gaps() {
        assert_eq!(lower_bound(0), 0);
        for b in 1..BUCKETS {
            assert_eq!(lower_bound(b), upper_bound(b - 1) + 1, "bucket {b}");
            assert_eq!(bucket_of_micros(lower_bound(b)), b);
            assert_eq!(bucket_of_micros(upper_bound(b)), b);
        }
        assert_eq!(upper_bound(BUCKETS - 1), u64::from(u32::MAX));
        assert_eq!(bucket_of(Duration::MAX), BUCKETS - 1);
        assert_eq!(bucket_of(Duration::from_secs(4_295)), BUCKETS - 1);
        assert_eq!(bucket_of(MAX_LATENCY), BUCKETS - 1);
    }

    #[test]
    fn quantile_rejects_bad_q_and_empty_histograms() {
        let mut counts = [0u64; BUCKETS];
        assert_eq!(quantile(&counts, 0.5), None);
        counts[bucket_of(Duration::from_millis(10))] = 1;
        for q in [f64::NAN, -0.1, 1.1, f64::INFINITY] {
            assert_eq!(quantile(&counts, q), None);
        }
        let p = quantile(&counts, 0.0).expect("one call");
        assert!(p >= Duration::from_millis(10) && p < Duration::from_micros(12_500));
    }

    proptest! {
        /// The reported value is never below the true value and at most 25 % (or 1 µs)
        /// above it.
        #[test]
        fn every_latency_lands_in_a_bucket_at_most_a_quarter_wide(micros in 0u64..(1 << 33)) {
            let b = bucket_of(Duration::from_micros(micros));
            let clamped = micros.min(u64::from(u32::MAX));
            prop_assert!(lower_bound(b) <= clamped && clamped <= upper_bound(b));
            let width = upper_bound(b) - lower_bound(b);
            prop_assert!(width * 4 <= lower_bound(b).max(1) || width == 0);
        }

        /// Percentiles of a random sample match the exact percentile to bucket precision.
        #[test]
        fn quantiles_match_the_sorted_sample(
            mut sample in prop::collection::vec(0u64..10_000_000, 1..300),
            q in 0.0f64..=1.0,
        ) {
            let mut counts = [0u64; BUCKETS];
            for &m in &sample {
                counts[bucket_of(Duration::from_micros(m))] += 1;
            }
            sample.sort_unstable();
            let rank = ((q * sample.len() as f64).ceil() as usize).clamp(1, sample.len());
            let exact = sample[rank - 1];
            let got = quantile(&counts, q).expect("non-empty").as_micros() as u64;
            prop_assert!(got >= exact, "{got} < {exact}");
            prop_assert!(got <= exact + exact / 4 + 1, "{got} vs {exact}");
        }
    }
}
