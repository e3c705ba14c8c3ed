//! One health window per downstream: the metric source the breaker (and later the throttle and
//! the retrier) read.
//!
//! # Why one shared window?
//!
//! A retrier and a circuit breaker that keep separate statistics about the same downstream
//! disagree exactly when it matters: the retrier keeps retrying into a downstream the breaker has
//! given up on, or the breaker counts every retry as fresh evidence and trips twice as fast as
//! the real failure rate says. Keeping *one* window per downstream, shared in an
//! [`Arc`](std::sync::Arc), gives every policy the same picture.
//!
//! # What is a call?
//!
//! Every attempt that reaches the downstream is one call, **retries included**: a request that
//! fails, is retried and fails again is two failed calls, because the downstream saw two
//! requests. A retry storm therefore moves the failure *ratio* only as fast as the failures the
//! downstream actually produces — retries add calls to both sides of the ratio, so they cannot
//! open a breaker that the same failures without retries would not open (they only reach the
//! minimum throughput sooner, which is the point: more traffic, more evidence). Calls that were
//! never sent (rejected by a breaker, a budget or a deadline) are not recorded.
//!
//! # What is a failure?
//!
//! Each call is sorted by its [`Outcome`]:
//!
//! | outcome | counted as |
//! | --- | --- |
//! | [`Outcome::Success`] | success |
//! | [`Outcome::Retryable`] | health failure |
//! | [`Outcome::Overloaded`] | health failure |
//! | [`Outcome::InDoubt`] | health failure (a timeout is the classic sign of a sick downstream) |
//! | [`Outcome::NeverRetry`] | a call, but **not** a health failure, unless [`HealthConfig::with_never_retry_as_failure`] |
//!
//! A deterministic failure (404, 422, and — by [`classify`](crate::classify)'s rules — 500/501)
//! says the downstream answered; counting it would let one client with a bad request open the
//! breaker for everyone. Every class is also counted separately in [`HealthCounts`].
//!
//! A call is *slow* when its elapsed time is strictly greater than the configured slow-call
//! threshold (as in Resilience4j); a slow call is counted as slow whatever its outcome.
//!
//! # Two shapes of window
//!
//! - [`HealthConfig::count`]: the last *N* calls, as a ring.
//! - [`HealthConfig::time`]: the last *T*, split into buckets of `T / buckets` on a
//!   [`CoarseMillis`] counter; the window covers the current bucket and the `buckets − 1`
//!   before it, so it holds between `T − T/buckets` and `T` of history.
//!
//! # Latency
//!
//! Every call's elapsed time also goes into a log-linear histogram per bucket (see
//! [`latency`]), so the same window answers "what is p99 of the recent calls?"
//! ([`HealthWindow::latency_percentile`]) for a hedging delay or a dashboard.
//!
//! # Cost
//!
//! A **time-based** window is built for the hot path: each recording thread owns the counts
//! of the current bucket (see the `time` module's notes), so a healthy call is recorded with
//! a few plain loads and stores and no lock, and two threads recording at once do not slow
//! each other down. Reading ([`HealthWindow::snapshot`]) locks the history and adds up the
//! live buckets and the recording threads' current ones. Memory: about 1 KiB per bucket plus
//! about 0.6 KiB per thread that has recorded.
//!
//! A **count-based** window must *evict* the call that falls out of the ring when a new one
//! arrives, and the eviction and the insertion must agree on the totals, in one global order
//! of calls; it keeps one short mutex per record, which keeps the totals exact and the code
//! obviously right, at the price of a lock on every call. Prefer a time-based window for a
//! downstream that sees many calls per second from many threads.
//!
//! Neither kind exposes its synchronisation, so either can change without changing callers.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::classify::Outcome;
use crate::clock::{Clock, CoarseMillis};

pub mod latency;
mod time;

use time::TimeStore;

/// The largest count-based window, in calls.
pub const MAX_WINDOW_CALLS: u32 = 1_000_000;
/// The largest number of buckets in a time-based window.
pub const MAX_WINDOW_BUCKETS: u32 = 10_000;

/// A configuration value that cannot work, naming the field.
///
/// ```
/// use stormguard::health::{HealthConfig, Problem};
///
/// let err = HealthConfig::count(0).validate().unwrap_err();
/// assert_eq!(err.field, "window.calls");
/// assert_eq!(err.problem, Problem::Zero);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("invalid configuration: {field} {problem}")]
pub struct InvalidConfig {
    /// The offending field, as `section.field` (for example `"breaker.failure_ratio"`).
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: Problem,
}

/// What is wrong with a configuration value.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum Problem {
    /// Zero where at least one is needed.
    #[error("must not be zero")]
    Zero,
    /// A ratio that is NaN or outside `0..=1`.
    #[error("must be a number in 0..=1, got {0}")]
    NotARatio(f64),
    /// A factor that is NaN, infinite or below 1.
    #[error("must be a finite number >= 1, got {0}")]
    BelowOne(f64),
    /// Larger than the supported maximum.
    #[error("must be at most {0}")]
    TooLarge(u64),
    /// Smaller than another field it must not be smaller than (named here).
    #[error("must not be less than {0}")]
    LessThan(&'static str),
    /// A value that can never be reached (named here), so the setting could never take effect.
    #[error("can never be reached: {0}")]
    Unreachable(&'static str),
}

impl InvalidConfig {
    pub(crate) const fn new(field: &'static str, problem: Problem) -> Self {
        InvalidConfig { field, problem }
    }
}

/// The shape of a [`HealthWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowKind {
    /// The last `calls` calls.
    Count {
        /// How many calls the window holds.
        calls: u32,
    },
    /// The calls of the last `length`, in `buckets` buckets.
    Time {
        /// How much history the window covers (at bucket granularity).
        length: Duration,
        /// How many buckets `length` is split into; more buckets, smoother eviction.
        buckets: u32,
    },
}

/// How a [`HealthWindow`] counts.
///
/// # Default
///
/// [`HealthConfig::count`]`(100)` with no slow-call threshold and
/// [`Outcome::NeverRetry`] not counted as a failure.
///
/// ```
/// use std::time::Duration;
/// use stormguard::health::HealthConfig;
///
/// let config = HealthConfig::time(Duration::from_secs(10), 10)
///     .with_slow_call_threshold(Duration::from_secs(2));
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HealthConfig {
    kind: WindowKind,
    slow_call_threshold: Option<Duration>,
    never_retry_is_failure: bool,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig::count(100)
    }
}

impl HealthConfig {
    /// A window over the last `calls` calls.
    pub const fn count(calls: u32) -> Self {
        HealthConfig {
            kind: WindowKind::Count { calls },
            slow_call_threshold: None,
            never_retry_is_failure: false,
        }
    }

    /// A window over the last `length`, split into `buckets` buckets.
    pub const fn time(length: Duration, buckets: u32) -> Self {
        HealthConfig {
            kind: WindowKind::Time { length, buckets },
            slow_call_threshold: None,
            never_retry_is_failure: false,
        }
    }

    /// Calls that take strictly longer than `threshold` are counted as slow.
    pub const fn with_slow_call_threshold(mut self, threshold: Duration) -> Self {
        self.slow_call_threshold = Some(threshold);
        self
    }

    /// Whether [`Outcome::NeverRetry`] counts as a health failure (default `false`; see the
    /// [module documentation](self#what-is-a-failure)).
    pub const fn with_never_retry_as_failure(mut self, yes: bool) -> Self {
        self.never_retry_is_failure = yes;
        self
    }

    /// The window's shape.
    pub const fn kind(&self) -> WindowKind {
        self.kind
    }

    /// The slow-call threshold, if any.
    pub const fn slow_call_threshold(&self) -> Option<Duration> {
        self.slow_call_threshold
    }

    /// Whether [`Outcome::NeverRetry`] counts as a health failure.
    pub const fn never_retry_is_failure(&self) -> bool {
        self.never_retry_is_failure
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        match self.kind {
            WindowKind::Count { calls } => {
                if calls == 0 {
                    return Err(InvalidConfig::new("window.calls", Problem::Zero));
                }
                if calls > MAX_WINDOW_CALLS {
                    return Err(InvalidConfig::new(
                        "window.calls",
                        Problem::TooLarge(MAX_WINDOW_CALLS as u64),
                    ));
                }
            }
            WindowKind::Time { length, buckets } => {
                let length_ms = length.as_millis();
                if length_ms == 0 {
                    return Err(InvalidConfig::new("window.length", Problem::Zero));
                }
                if buckets == 0 {
                    return Err(InvalidConfig::new("window.buckets", Problem::Zero));
                }
                let max = u128::from(MAX_WINDOW_BUCKETS).min(length_ms);
                if u128::from(buckets) > max {
                    // Each bucket must span at least one millisecond.
                    return Err(InvalidConfig::new(
                        "window.buckets",
                        Problem::TooLarge(max as u64),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether `outcome` is a health failure under this configuration.
    pub const fn is_failure(&self, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Success => false,
            Outcome::NeverRetry => self.never_retry_is_failure,
            Outcome::Retryable | Outcome::Overloaded { .. } | Outcome::InDoubt => true,
        }
    }

    /// Whether a call that took `elapsed` is slow under this configuration.
    pub fn is_slow(&self, elapsed: Duration) -> bool {
        self.slow_call_threshold.is_some_and(|t| elapsed > t)
    }
}

/// Totals over a window (or over one bucket of it).
///
/// ```
/// use stormguard::health::HealthCounts;
///
/// let counts = HealthCounts { calls: 4, successes: 3, retryable: 1, failures: 1, ..Default::default() };
/// assert_eq!(counts.failure_ratio(), 0.25);
/// assert_eq!(counts.slow_call_ratio(), 0.0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HealthCounts {
    /// Every recorded call.
    pub calls: u64,
    /// [`Outcome::Success`] calls.
    pub successes: u64,
    /// [`Outcome::Retryable`] calls.
    pub retryable: u64,
    /// [`Outcome::Overloaded`] calls.
    pub overloaded: u64,
    /// [`Outcome::InDoubt`] calls.
    pub in_doubt: u64,
    /// [`Outcome::NeverRetry`] calls.
    pub never_retry: u64,
    /// Calls that count as health failures (see [`HealthConfig::is_failure`]).
    pub failures: u64,
    /// Calls slower than the slow-call threshold, whatever their outcome.
    pub slow: u64,
}

impl HealthCounts {
    /// `failures / calls`, or 0 with no calls.
    pub fn failure_ratio(&self) -> f64 {
        ratio(self.failures, self.calls)
    }

    /// `slow / calls`, or 0 with no calls.
    pub fn slow_call_ratio(&self) -> f64 {
        ratio(self.slow, self.calls)
    }

    fn add(&mut self, other: &HealthCounts) {
        self.calls += other.calls;
        self.successes += other.successes;
        self.retryable += other.retryable;
        self.overloaded += other.overloaded;
        self.in_doubt += other.in_doubt;
        self.never_retry += other.never_retry;
        self.failures += other.failures;
        self.slow += other.slow;
    }

    fn sub(&mut self, other: &HealthCounts) {
        self.calls -= other.calls;
        self.successes -= other.successes;
        self.retryable -= other.retryable;
        self.overloaded -= other.overloaded;
        self.in_doubt -= other.in_doubt;
        self.never_retry -= other.never_retry;
        self.failures -= other.failures;
        self.slow -= other.slow;
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// One call, packed into a byte for the count-based ring: the class in the low bits, then
/// the failure and slow flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Call(u8);

const CLASS_MASK: u8 = 0b0111;
const FAILURE: u8 = 0b1000;
const SLOW: u8 = 0b1_0000;

impl Call {
    fn new(config: &HealthConfig, outcome: Outcome, elapsed: Duration) -> Call {
        let class = match outcome {
            Outcome::Success => 0,
            Outcome::Retryable => 1,
            Outcome::Overloaded { .. } => 2,
            Outcome::InDoubt => 3,
            Outcome::NeverRetry => 4,
        };
        let failure = if config.is_failure(outcome) {
            FAILURE
        } else {
            0
        };
        let slow = if config.is_slow(elapsed) { SLOW } else { 0 };
        Call(class | failure | slow)
    }

    /// A health failure or a slow call: a call that may move a breaker.
    const fn is_bad(self) -> bool {
        self.0 & (FAILURE | SLOW) != 0
    }

    fn counts(self) -> HealthCounts {
        let mut c = HealthCounts {
            calls: 1,
            failures: u64::from(self.0 & FAILURE != 0),
            slow: u64::from(self.0 & SLOW != 0),
            ..HealthCounts::default()
        };
        match self.0 & CLASS_MASK {
            0 => c.successes = 1,
            1 => c.retryable = 1,
            2 => c.overloaded = 1,
            3 => c.in_doubt = 1,
            _ => c.never_retry = 1,
        }
        c
    }
}

/// A count-based window: the last `calls` calls in a ring, with running totals.
#[derive(Debug)]
struct Ring {
    /// Each call and its latency bucket.
    calls: Vec<(Call, u8)>,
    /// Where the next call goes.
    next: usize,
    /// How many slots hold a call.
    len: usize,
    totals: HealthCounts,
    latency: Box<[u64; latency::BUCKETS]>,
}

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
        let store = match config.kind {
            WindowKind::Count { calls } => Store::Count(Mutex::new(Ring {
                calls: vec![(Call(0), 0); calls as usize],
                next: 0,
                len: 0,
                totals: HealthCounts::default(),
                latency: Box::new([0; latency::BUCKETS]),
            })),
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

    /// Records one call (one attempt: see the [module documentation](self#what-is-a-call)).
    ///
    /// On a time-based window this is a handful of uncontended loads and stores (see
    /// [cost](self#cost)); read the totals with [`snapshot`](Self::snapshot).
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
            Store::Count(ring) => Recorded::Totals(self.record_in_ring(ring, call, bucket)),
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

    fn record_in_ring(&self, ring: &Mutex<Ring>, call: Call, bucket: usize) -> HealthCounts {
        let mut ring = lock(ring);
        let Ring {
            calls,
            next,
            len,
            totals,
            latency,
        } = &mut *ring;
        if *len == calls.len() {
            let (old, old_bucket) = calls[*next];
            totals.sub(&old.counts());
            latency[usize::from(old_bucket)] -= 1;
        } else {
            *len += 1;
        }
        // `bucket < latency::BUCKETS <= 256`.
        calls[*next] = (call, bucket as u8);
        *next = (*next + 1) % calls.len();
        totals.add(&call.counts());
        latency[bucket] += 1;
        *totals
    }

    /// The window's current totals.
    pub fn snapshot(&self) -> HealthCounts {
        match &self.store {
            Store::Count(ring) => lock(ring).totals,
            Store::Time(store) => store
                .totals(self.millis.now(), false)
                .health(self.config.never_retry_is_failure),
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
            Store::Count(ring) => {
                let mut ring = lock(ring);
                ring.next = 0;
                ring.len = 0;
                ring.totals = HealthCounts::default();
                ring.latency.fill(0);
            }
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code panics while holding these locks, so a poisoned lock still holds consistent
    // totals.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use proptest::prelude::*;

    fn outcome(i: u8) -> Outcome {
        match i % 5 {
            0 => Outcome::Success,
            1 => Outcome::Retryable,
            2 => Outcome::Overloaded { retry_after: None },
            3 => Outcome::InDoubt,
            _ => Outcome::NeverRetry,
        }
    }

    /// Records and reads the totals back.
    fn rec(w: &HealthWindow, outcome: Outcome, elapsed: Duration) -> HealthCounts {
        w.record(outcome, elapsed);
        w.snapshot()
    }

    fn model_counts(config: &HealthConfig, calls: &[(Outcome, Duration)]) -> HealthCounts {
        let mut c = HealthCounts::default();
        for (o, e) in calls {
            c.calls += 1;
            match o {
                Outcome::Success => c.successes += 1,
                Outcome::Retryable => c.retryable += 1,
                Outcome::Overloaded { .. } => c.overloaded += 1,
                Outcome::InDoubt => c.in_doubt += 1,
                Outcome::NeverRetry => c.never_retry += 1,
            }
            let failure = match o {
                Outcome::Success => false,
                Outcome::NeverRetry => config.never_retry_is_failure(),
                _ => true,
            };
            c.failures += u64::from(failure);
            c.slow += u64::from(config.slow_call_threshold().is_some_and(|t| *e > t));
        }
        c
    }

    #[test]
    fn validation_names_the_field() {
        let cases = [
            (HealthConfig::count(0), "window.calls", Problem::Zero),
            (
                HealthConfig::count(MAX_WINDOW_CALLS + 1),
                "window.calls",
                Problem::TooLarge(MAX_WINDOW_CALLS as u64),
            ),
            (
                HealthConfig::time(Duration::ZERO, 10),
                "window.length",
                Problem::Zero,
            ),
            (
                HealthConfig::time(Duration::from_micros(900), 1),
                "window.length",
                Problem::Zero,
            ),
            (
                HealthConfig::time(Duration::from_secs(1), 0),
                "window.buckets",
                Problem::Zero,
            ),
            (
                HealthConfig::time(Duration::from_millis(5), 6),
                "window.buckets",
                Problem::TooLarge(5),
            ),
        ];
        for (config, field, problem) in cases {
            let err = HealthWindow::new(config, ManualClock::new().clock()).expect_err("must fail");
            assert_eq!((err.field, err.problem), (field, problem), "{config:?}");
            assert!(err.to_string().contains(field));
        }
    }

    #[test]
    fn never_retry_is_a_call_but_not_a_failure_by_default() {
        let clock = ManualClock::new();
        let w = HealthWindow::new(HealthConfig::count(10), clock.clock()).expect("must succeed");
        let c = rec(&w, Outcome::NeverRetry, Duration::ZERO);
        assert_eq!((c.calls, c.never_retry, c.failures), (1, 1, 0));
        let w = HealthWindow::new(
            HealthConfig::count(10).with_never_retry_as_failure(true),
            clock.clock(),
        )
        .expect("must succeed");
        assert_eq!(rec(&w, Outcome::NeverRetry, Duration::ZERO).failures, 1);
    }

    #[test]
    fn slow_means_strictly_longer_than_the_threshold() {
        let config = HealthConfig::count(10).with_slow_call_threshold(Duration::from_secs(1));
        let w = HealthWindow::new(config, ManualClock::new().clock()).expect("must succeed");
        assert_eq!(rec(&w, Outcome::Success, Duration::from_secs(1)).slow, 0);
        assert_eq!(
            rec(&w, Outcome::InDoubt, Duration::from_millis(1001)).slow,
            1
        );
    }

    #[test]
    fn time_window_evicts_whole_buckets() {
        let clock = ManualClock::new();
        let w = HealthWindow::new(
            HealthConfig::time(Duration::from_secs(10), 10),
            clock.clock(),
        )
        .expect("must succeed");
        rec(&w, Outcome::Retryable, Duration::ZERO); // bucket 0
        clock.advance(Duration::from_millis(9_999)); // bucket 9: bucket 0 still inside
        rec(&w, Outcome::Success, Duration::ZERO);
        assert_eq!(w.snapshot().calls, 2);
        clock.advance(Duration::from_millis(1)); // bucket 10: bucket 0 falls out
        assert_eq!(
            w.snapshot(),
            model_counts(w.config(), &[(Outcome::Success, Duration::ZERO)])
        );
        w.reset();
        assert_eq!(w.snapshot(), HealthCounts::default());
    }

    #[test]
    fn window_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<HealthWindow>();
    }

    #[test]
    fn time_window_counts_every_threads_calls_once() {
        const THREADS: usize = 4;
        const CALLS: usize = 1_000;
        let clock = ManualClock::new();
        let w = HealthWindow::new(
            HealthConfig::time(Duration::from_secs(10), 10),
            clock.clock(),
        )
        .expect("must succeed");
        let record_all = |w: &HealthWindow| {
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    s.spawn(move || {
                        for i in 0..CALLS {
                            w.record(outcome((i + t) as u8), Duration::from_millis(i as u64));
                        }
                    });
                }
            })
        };
        record_all(&w);
        let all: Vec<_> = (0..THREADS)
            .flat_map(|t| {
                (0..CALLS).map(move |i| (outcome((i + t) as u8), Duration::from_millis(i as u64)))
            })
            .collect();
        let mut expected = model_counts(w.config(), &all);
        assert_eq!(w.snapshot(), expected);
        assert_eq!(w.latency_snapshot().calls(), (THREADS * CALLS) as u64);

        // A new bucket: only this thread moves its shard into the history; the others' stay
        // live in their shards. Nothing is counted twice or lost.
        clock.advance(Duration::from_secs(1));
        w.record(Outcome::Success, Duration::ZERO);
        expected.add(&model_counts(
            w.config(),
            &[(Outcome::Success, Duration::ZERO)],
        ));
        assert_eq!(w.snapshot(), expected);

        // A reset forgets every thread's counts, and new records count from zero.
        w.reset();
        assert_eq!(w.snapshot(), HealthCounts::default());
        assert_eq!(w.latency_percentile(0.5), None);
        record_all(&w);
        assert_eq!(w.snapshot().calls, (THREADS * CALLS) as u64);

        clock.advance(Duration::from_secs(10));
        assert_eq!(w.snapshot(), HealthCounts::default());
    }

    #[test]
    fn percentiles_cover_the_live_calls_only() {
        let clock = ManualClock::new();
        let w = HealthWindow::new(HealthConfig::time(Duration::from_secs(2), 2), clock.clock())
            .expect("must succeed");
        for _ in 0..10 {
            w.record(Outcome::Success, Duration::from_secs(5));
        }
        clock.advance(Duration::from_secs(1));
        for _ in 0..90 {
            w.record(Outcome::Success, Duration::from_millis(1));
        }
        let p50 = w.latency_percentile(0.5).expect("calls");
        assert!(p50 >= Duration::from_millis(1) && p50 < Duration::from_micros(1_250));
        let p95 = w.latency_percentile(0.95).expect("calls");
        assert!(p95 >= Duration::from_secs(5) && p95 < Duration::from_millis(6_250));
        clock.advance(Duration::from_secs(1));
        // The slow bucket has left the window.
        let p95 = w.latency_percentile(0.95).expect("calls");
        assert!(p95 < Duration::from_micros(1_250));
        assert_eq!(w.latency_percentile(f64::NAN), None);
    }

    proptest! {
        #[test]
        fn count_window_matches_the_last_n_calls(
            size in 1u32..20,
            never_retry_fails: bool,
            calls in prop::collection::vec((0u8..5, 0u64..2000), 0..200),
        ) {
            let config = HealthConfig::count(size)
                .with_slow_call_threshold(Duration::from_secs(1))
                .with_never_retry_as_failure(never_retry_fails);
            let w = HealthWindow::new(config, ManualClock::new().clock()).expect("must succeed");
            let mut seen = Vec::new();
            for (o, ms) in calls {
                let call = (outcome(o), Duration::from_millis(ms));
                seen.push(call);
                let got = rec(&w, call.0, call.1);
                let start = seen.len().saturating_sub(size as usize);
                prop_assert_eq!(got, model_counts(&config, &seen[start..]));
            }
        }

        /// Percentiles over a time window agree with the exact percentile of the live calls,
        /// to bucket precision, whatever the sequence of records and clock moves.
        #[test]
        fn time_window_percentiles_match_the_live_calls(
            steps in prop::collection::vec((0u64..3_000_000, 0u64..400), 1..150),
            q in 0.0f64..=1.0,
        ) {
            let clock = ManualClock::new();
            let (bucket_ms, buckets) = (250u64, 4u64);
            let config = HealthConfig::time(Duration::from_millis(bucket_ms * buckets), 4);
            let w = HealthWindow::new(config, clock.clock()).expect("must succeed");
            let mut seen: Vec<(u64, u64)> = Vec::new();
            for (micros, advance) in steps {
                clock.advance(Duration::from_millis(advance));
                let now = clock.elapsed().as_millis() as u64;
                w.record(Outcome::Success, Duration::from_micros(micros));
                seen.push((now, micros));
            }
            let now = clock.elapsed().as_millis() as u64;
            let mut live: Vec<u64> = seen
                .iter()
                .filter(|(t, _)| now / bucket_ms - t / bucket_ms < buckets)
                .map(|(_, m)| *m)
                .collect();
            live.sort_unstable();
            let got = w.latency_percentile(q);
            if live.is_empty() {
                prop_assert_eq!(got, None);
            } else {
                let rank = ((q * live.len() as f64).ceil() as usize).clamp(1, live.len());
                let exact = live[rank - 1];
                let got = got.expect("calls").as_micros() as u64;
                prop_assert!(got >= exact && got <= exact + exact / 4 + 1, "{} vs {}", got, exact);
            }
        }

        #[test]
        fn time_window_matches_the_calls_in_live_buckets(
            buckets in 1u32..8,
            bucket_ms in 1u64..50,
            steps in prop::collection::vec((0u8..5, 0u64..60), 0..200),
        ) {
            let clock = ManualClock::new();
            let config = HealthConfig::time(Duration::from_millis(bucket_ms * u64::from(buckets)), buckets);
            let w = HealthWindow::new(config, clock.clock()).expect("must succeed");
            let mut seen: Vec<(u64, Outcome)> = Vec::new();
            for (o, advance) in steps {
                clock.advance(Duration::from_millis(advance));
                let now = clock.elapsed().as_millis() as u64;
                seen.push((now, outcome(o)));
                let got = rec(&w, outcome(o), Duration::ZERO);
                let current = now / bucket_ms;
                let live: Vec<_> = seen
                    .iter()
                    .filter(|(t, _)| current - t / bucket_ms < u64::from(buckets))
                    .map(|(_, o)| (*o, Duration::ZERO))
                    .collect();
                prop_assert_eq!(got, model_counts(&config, &live));
            }
        }
    }
}
