//! The window itself: records calls into the store its shape needs, and reads totals and
//! latency percentiles back.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::config::{HealthConfig, InvalidConfig, WindowKind};
use super::counts::{Call, HealthCounts};
use super::latency;
use super::ring::Ring;
use super::time::TimeStore;
use crate::classify::Outcome;
use crate::clock::{Clock, CoarseMillis};

// A window is made once per downstream and lives in an `Arc`: its size does not matter, and
// boxing the time store would add a pointer chase to every record.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Store {
    Count(Mutex<Ring>),
    Time(TimeStore),
}

/// What a record tells the breaker: the totals (count-based windows compute them under the
/// same lock anyway) or the window's version (time-based windows, see
/// [`HealthWindow::version`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Recorded {
    Totals(HealthCounts),
    /// The window's version after the record, and whether the call was a failure or slow.
    Version {
        version: u64,
        bad: bool,
    },
}

/// A per-downstream sliding window of call outcomes and latencies.
///
/// `Send + Sync`; share it in an [`Arc`](std::sync::Arc) between every policy that reads the
/// same downstream.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::Outcome;
/// use stormguard::clock::ManualClock;
/// use stormguard::health::{HealthConfig, HealthWindow};
///
/// let clock = ManualClock::new();
/// let config = HealthConfig::time(Duration::from_secs(10), 10)
///     .with_slow_call_threshold(Duration::from_secs(1));
/// let window = HealthWindow::new(config, clock.clock()).unwrap();
///
/// window.record(Outcome::Success, Duration::from_millis(20));
/// window.record(Outcome::Retryable, Duration::from_secs(2));
/// let counts = window.snapshot();
/// assert_eq!((counts.calls, counts.failures, counts.slow), (2, 1, 1));
/// // The median of 20 ms and 2 s is the first of them (to within a quarter).
/// let p50 = window.latency_percentile(0.5).unwrap();
/// assert!(p50 >= Duration::from_millis(20) && p50 < Duration::from_millis(25));
///
/// clock.advance(Duration::from_secs(11));
/// assert_eq!(window.snapshot().calls, 0);
/// assert_eq!(window.latency_percentile(0.5), None);
/// ```
#[derive(Debug)]
pub struct HealthWindow {
    config: HealthConfig,
    millis: CoarseMillis,
    store: Store,
}

impl HealthWindow {
    /// A window reading time from `clock`; `Err` names the first invalid field.
    pub fn new(config: HealthConfig, clock: Clock) -> Result<Self, InvalidConfig> {
        config.validate()?;
        Ok(Self::build(config, clock))
    }

    /// Builds a window from a configuration already known to be valid (a preset).
    pub(crate) fn build(config: HealthConfig, clock: Clock) -> Self {
        let store = match config.kind() {
            WindowKind::Count { calls } => Store::Count(Mutex::new(Ring::new(calls))),
            WindowKind::Time { length, buckets } => {
                let length_ms = u64::try_from(length.as_millis()).unwrap_or(u64::MAX);
                let bucket_ms = (length_ms / u64::from(buckets)).max(1);
                Store::Time(TimeStore::new(bucket_ms, buckets))
            }
        };
        HealthWindow {
            config,
            millis: CoarseMillis::new(clock),
            store,
        }
    }

    /// The configuration this window counts by.
    pub fn config(&self) -> &HealthConfig {
        &self.config
    }

    /// The clock this window reads.
    pub fn clock(&self) -> &Clock {
        self.millis.clock()
    }

    /// Milliseconds on this window's time base (zero at creation).
    pub fn now_millis(&self) -> u64 {
        self.millis.now()
    }

    /// Records one call (one attempt: see the [module documentation](super#what-is-a-call)).
    ///
    /// On a time-based window this is a handful of uncontended loads and stores (see
    /// [cost](super#cost)); read the totals with [`snapshot`](Self::snapshot).
    #[inline]
    pub fn record(&self, outcome: Outcome, elapsed: Duration) {
        let _ = self.record_call(outcome, elapsed);
    }

    /// Records one call and tells the breaker what it needs to decide whether to look at the
    /// totals.
    #[inline]
    pub(crate) fn record_call(&self, outcome: Outcome, elapsed: Duration) -> Recorded {
        let call = Call::new(&self.config, outcome, elapsed);
        let bucket = latency::bucket_of(elapsed);
        match &self.store {
            Store::Count(ring) => Recorded::Totals(record_in_ring(ring, call, bucket)),
            Store::Time(store) => {
                store.record(self.millis.now(), call, bucket);
                let bad = call.is_bad();
                if bad {
                    store.version().fetch_add(1, Ordering::Release);
                }
                Recorded::Version {
                    version: store.version().load(Ordering::Acquire),
                    bad,
                }
            }
        }
    }

    /// The window's current totals.
    pub fn snapshot(&self) -> HealthCounts {
        match &self.store {
            Store::Count(ring) => lock(ring).totals,
            Store::Time(store) => store
                .totals(self.millis.now(), false)
                .health(self.config.never_retry_is_failure()),
        }
    }

    /// The `q`-quantile (`0.5` for the median, `0.99` for p99) of the latencies of the calls
    /// in the window, whatever their outcome; `None` when the window is empty or `q` is not a
    /// number in `0..=1`.
    ///
    /// The answer is the highest latency of the histogram bucket holding the call of rank
    /// ⌈q·calls⌉ (at least 1): never below the true quantile, and at most 25 % (or 1 µs) above
    /// it. Latencies are kept in whole microseconds up to
    /// [`MAX_LATENCY`](latency::MAX_LATENCY); see [`latency`].
    ///
    /// Reading adds up every live bucket (and, for a time-based window, every recording
    /// thread's current one); to read several quantiles at once take a
    /// [`latency_snapshot`](Self::latency_snapshot).
    pub fn latency_percentile(&self, q: f64) -> Option<Duration> {
        self.latency_snapshot().percentile(q)
    }

    /// The latency histogram of the calls in the window.
    pub fn latency_snapshot(&self) -> LatencySnapshot {
        let counts = match &self.store {
            Store::Count(ring) => lock(ring).latency.clone(),
            Store::Time(store) => match store.totals(self.millis.now(), true).into_latency() {
                Some(latency) => latency,
                None => Box::new([0; latency::BUCKETS]),
            },
        };
        LatencySnapshot { counts }
    }

    /// A number that changes whenever a time-based window's totals may have changed other
    /// than by a call that is neither a failure nor slow: a failed or slow call, a new
    /// bucket, a reset. The breaker reads it to skip looking at the totals after a healthy
    /// call when nothing else changed. Count-based windows always report 0.
    pub(crate) fn version(&self) -> u64 {
        match &self.store {
            Store::Count(_) => 0,
            Store::Time(store) => store.version().load(Ordering::Acquire),
        }
    }

    /// Forgets every recorded call (the breaker does this when it closes: the calls before
    /// an outage say nothing about the downstream after it).
    pub fn reset(&self) {
        match &self.store {
            Store::Count(ring) => lock(ring).reset(),
            Store::Time(store) => store.reset(),
        }
    }
}

/// A copy of a window's latency histogram, to read several quantiles from one snapshot.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::Outcome;
/// use stormguard::clock::ManualClock;
/// use stormguard::health::{HealthConfig, HealthWindow};
///
/// let window = HealthWindow::new(HealthConfig::count(100), ManualClock::new().clock()).unwrap();
/// for ms in 1..=100 {
///     window.record(Outcome::Success, Duration::from_millis(ms));
/// }
/// let latency = window.latency_snapshot();
/// assert_eq!(latency.calls(), 100);
/// let (p50, p99) = (latency.percentile(0.5).unwrap(), latency.percentile(0.99).unwrap());
/// assert!(p50 >= Duration::from_millis(50) && p50 <= Duration::from_micros(62_500));
/// assert!(p99 >= Duration::from_millis(99) && p99 <= Duration::from_micros(123_750));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencySnapshot {
    counts: Box<[u64; latency::BUCKETS]>,
}

impl LatencySnapshot {
    /// Calls in the histogram.
    pub fn calls(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `q`-quantile, as [`HealthWindow::latency_percentile`] computes it.
    pub fn percentile(&self, q: f64) -> Option<Duration> {
        latency::quantile(&self.counts, q)
    }
}

/// Records into a count-based ring under its lock, out of line: inlined, the lock's code
/// would grow the breaker's record path, whose hot case is a time-based window (the
/// disassembly of `benches/breaker.rs` is the same as before the window's files were split).
#[inline(never)]
fn record_in_ring(ring: &Mutex<Ring>, call: Call, bucket: usize) -> HealthCounts {
    lock(ring).record(call, bucket)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code panics while holding these locks, so a poisoned lock still holds consistent
    // totals.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
