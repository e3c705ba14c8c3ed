//! Latencies of successful answers, counted on the event loop's path at the cost of a few
//! instructions, and handed to an HDR histogram for the report's percentiles.
//!
//! Recording into [`hdrhistogram::Histogram`] keeps its minimum, maximum and total up to
//! date and checks its range at every value: several times the cost of the count itself,
//! paid at every successful request of the run. Here a value is counted in a log-linear
//! bucket of our own, the histogram's own buckets (two significant digits: one per value
//! below 256, then 128 linear sub-buckets per power of two, aligned on the same powers of
//! two), and [`fill`] records each count at its bucket's lowest value: the histogram ends
//! with exactly the counts it would have had from the values themselves, so its percentiles
//! are the same.
//!
//! Not finer: the counts are incremented in no order at all (one per successful request, at
//! its latency), so their size is what stays in the first-level cache. Buckets twice as fine
//! as the histogram's (this module's first form) cost a cache miss at most increments on the
//! what-if bench.
//!
//! [`fill`]: Latencies::fill

use hdrhistogram::Histogram;

use crate::time::Nanos;

/// Values below this are counted one per bucket.
const LINEAR: u64 = 256;
/// Sub-buckets per power of two from [`LINEAR`] on (the top 8 bits of the value, less the
/// leading one).
const SUB: u64 = 128;

/// Counts of values in log-linear buckets.
#[derive(Clone, Debug, Default)]
pub(super) struct Latencies {
    counts: Vec<u64>,
}

impl Latencies {
    /// The bucket of `value`.
    #[inline]
    fn index(value: Nanos) -> usize {
        if value < LINEAR {
            return value as usize;
        }
        // The bit of the leading one: 8 and up.
        let top = u64::from(63 - value.leading_zeros());
        let sub = (value >> (top - 7)) - SUB;
        (LINEAR + (top - 8) * SUB + sub) as usize
    }

    /// The lowest value of bucket `index`.
    fn lowest(index: usize) -> Nanos {
        let index = index as u64;
        if index < LINEAR {
            return index;
        }
        let top = (index - LINEAR) / SUB + 8;
        let sub = (index - LINEAR) % SUB + SUB;
        sub << (top - 7)
    }

    /// Counts `value`.
    #[inline(always)]
    pub(super) fn record(&mut self, value: Nanos) {
        let i = Latencies::index(value);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        } else {
            self.grow(i);
        }
    }

    #[cold]
    fn grow(&mut self, i: usize) {
        self.counts.resize(i + 1, 0);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
    }

    /// Whether nothing was counted.
    pub(super) fn is_empty(&self) -> bool {
        self.counts.iter().all(|&c| c == 0)
    }

    /// Records every count into `histogram` (whose buckets each hold whole buckets of ours).
    pub(super) fn fill(&self, histogram: &mut Histogram<u64>) {
        for (i, &count) in self.counts.iter().enumerate().filter(|(_, c)| **c > 0) {
            histogram.saturating_record_n(Latencies::lowest(i), count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::SmallRng};

    #[test]
    fn buckets_are_contiguous_and_each_value_is_in_its_own() {
        for i in 0..(LINEAR as usize + 40 * SUB as usize) {
            let low = Latencies::lowest(i);
            assert_eq!(Latencies::index(low), i);
            assert_eq!(Latencies::index(Latencies::lowest(i + 1) - 1), i);
        }
    }

    /// The percentiles of a histogram filled from the buckets are those of one given every
    /// value, for values from a nanosecond to a day.
    #[test]
    fn percentiles_match_recording_every_value() {
        let mut rng = SmallRng::seed_from_u64(3);
        for spread in [600u64, 20_000, 5_000_000, 86_400_000_000_000] {
            let mut direct =
                Histogram::<u64>::new_with_bounds(1, 86_400_000_000_000, 2).expect("bounds");
            let mut ours = Latencies::default();
            let bits = 64 - spread.leading_zeros();
            for _ in 0..20_000 {
                // Shifted right by a random amount, so every power of two up to `spread`
                // gets values.
                let v = (rng.random_range(1..=spread) >> rng.random_range(0..bits)).max(1);
                direct.saturating_record(v);
                ours.record(v);
            }
            let mut filled = direct.clone();
            filled.reset();
            ours.fill(&mut filled);
            assert_eq!(filled.len(), direct.len());
            for q in [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0] {
                assert_eq!(
                    filled.value_at_quantile(q),
                    direct.value_at_quantile(q),
                    "spread {spread}, q {q}"
                );
            }
        }
    }
}
