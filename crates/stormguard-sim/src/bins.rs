//! Counts per time bin, in one flat vector.
//!
//! A bin is `width` nanoseconds; bin *i* counts what happened in `[i·width, (i+1)·width)`.
//! The vector is sized from the run's horizon up front and grows only if something lands past
//! it, so counting is an index and an add.

use crate::time::Nanos;

/// Counts per bin of virtual time.
///
/// # Example
///
/// ```
/// use stormguard_sim::bins::Bins;
///
/// let mut bins = Bins::new(100, 1_000);
/// bins.add(0);
/// bins.add(99);
/// bins.add(250);
/// assert_eq!(&bins.counts()[..3], &[2, 0, 1]);
/// assert_eq!(bins.peak(), Some((0, 2)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bins {
    width: Nanos,
    counts: Vec<u64>,
}

impl Bins {
    /// Bins of `width` (at least 1 ns) covering `[0, horizon]`.
    pub fn new(width: Nanos, horizon: Nanos) -> Self {
        let width = width.max(1);
        let len = usize::try_from(horizon / width + 1).unwrap_or(usize::MAX);
        Bins {
            width,
            counts: vec![0; len],
        }
    }

    /// Bin width in nanoseconds.
    pub fn width(&self) -> Nanos {
        self.width
    }

    /// The bin holding `at`.
    #[inline]
    pub fn index(&self, at: Nanos) -> usize {
        usize::try_from(at / self.width).unwrap_or(usize::MAX)
    }

    /// Counts one thing at `at`.
    #[inline]
    pub fn add(&mut self, at: Nanos) {
        self.add_n(at, 1);
    }

    /// Counts `n` things at `at`.
    #[inline]
    pub fn add_n(&mut self, at: Nanos, n: u64) {
        let i = self.index(at);
        if let Some(c) = self.counts.get_mut(i) {
            *c += n;
        } else {
            self.grow(i);
            if let Some(c) = self.counts.get_mut(i) {
                *c += n;
            }
        }
    }

    #[cold]
    fn grow(&mut self, i: usize) {
        let len = i.saturating_add(1).max(self.counts.len().saturating_mul(2));
        self.counts.resize(len, 0);
    }

    /// The counts, bin 0 first.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Sum over bins `[from, to)` (clamped to the bins that exist).
    pub fn sum(&self, from: usize, to: usize) -> u64 {
        let to = to.min(self.counts.len());
        self.counts.get(from..to).map_or(0, |s| s.iter().sum())
    }

    /// The fullest bin, the earliest of equals: `(index, count)`; `None` when nothing was
    /// counted.
    pub fn peak(&self) -> Option<(usize, u64)> {
        let mut best: Option<(usize, u64)> = None;
        for (i, &c) in self.counts.iter().enumerate() {
            if c > 0 && best.is_none_or(|(_, b)| c > b) {
                best = Some((i, c));
            }
        }
        best
    }

    /// Drops trailing empty bins past `keep` bins.
    pub fn truncate_trailing_zeros(&mut self, keep: usize) {
        let last = self
            .counts
            .iter()
            .rposition(|&c| c > 0)
            .map_or(0, |i| i + 1);
        self.counts.truncate(last.max(keep).min(self.counts.len()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_past_the_horizon() {
        let mut b = Bins::new(10, 20);
        b.add(1_000);
        assert_eq!(b.counts()[100], 1);
        assert_eq!(b.sum(0, 1_000), 1);
    }

    #[test]
    fn peak_prefers_the_earliest_of_equals() {
        let mut b = Bins::new(1, 10);
        b.add_n(3, 5);
        b.add_n(7, 5);
        assert_eq!(b.peak(), Some((3, 5)));
        assert_eq!(Bins::new(1, 10).peak(), None);
    }
}
