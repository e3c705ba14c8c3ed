//! Virtual time: nanoseconds since the start of a run, held in a plain `u64`.
//!
//! Every scenario runs on virtual time only: nothing here reads a wall clock or sleeps, so a
//! run with the same seed gives the same events in the same order on any machine. A `u64` of
//! nanoseconds covers 584 years, far past any run the validators accept, and keeps events
//! small (see [`queue`](crate::queue)).

use std::time::Duration;

/// A point in virtual time, or a span of it: nanoseconds.
pub type Nanos = u64;

/// Nanoseconds in a second.
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// Nanoseconds in a millisecond.
pub const NANOS_PER_MILLI: Nanos = 1_000_000;

/// `d` in nanoseconds, saturating at `u64::MAX`.
#[inline]
pub fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(Nanos::MAX)
}

/// `n` nanoseconds as a [`Duration`].
#[inline]
pub const fn duration(n: Nanos) -> Duration {
    Duration::from_nanos(n)
}

/// `n` nanoseconds in seconds.
#[inline]
pub fn seconds(n: Nanos) -> f64 {
    n as f64 / NANOS_PER_SEC as f64
}

/// `n` nanoseconds in milliseconds.
#[inline]
pub fn millis(n: Nanos) -> f64 {
    n as f64 / NANOS_PER_MILLI as f64
}

/// The instant of event number `k` in a stream of `rate` events per second starting at
/// `start`: `start + k / rate` seconds, rounded down to the nanosecond.
///
/// Computed from `k` each time rather than by adding an interval, so rounding never
/// accumulates and a million arrivals at 1000/s end exactly at 1000 s.
#[inline]
pub fn nth_of_rate(start: Nanos, k: u64, rate: f64) -> Nanos {
    start.saturating_add((k as f64 * NANOS_PER_SEC as f64 / rate) as Nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_trip_and_saturate() {
        assert_eq!(nanos(Duration::from_millis(1500)), 1_500_000_000);
        assert_eq!(duration(1_500_000_000), Duration::from_millis(1500));
        assert_eq!(nanos(Duration::MAX), u64::MAX);
        assert_eq!(seconds(2_500_000_000), 2.5);
        assert_eq!(millis(2_500_000), 2.5);
    }

    #[test]
    fn rate_streams_do_not_drift() {
        assert_eq!(nth_of_rate(0, 1_000_000, 1000.0), 1000 * NANOS_PER_SEC);
        assert_eq!(nth_of_rate(5, 3, 3.0), 5 + NANOS_PER_SEC);
    }
}
