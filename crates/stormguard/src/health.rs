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
//! # Why a mutex?
//!
//! A count-based window must *evict* the call that falls out of the ring when a new one
//! arrives, and the eviction and the insertion must agree on the totals; doing both with
//! independent atomics lets a reader see totals that never existed (and the breaker's "opens
//! exactly when the thresholds say" then no longer holds). One short uncontended
//! [`Mutex`] per record keeps the totals exact and the code obviously right. The public API
//! ([`HealthWindow::record`], [`HealthWindow::snapshot`]) does not expose the lock, so it can be
//! replaced by per-core shards later without changing callers.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::classify::Outcome;
use crate::clock::{Clock, CoarseMillis};

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

const EMPTY_EPOCH: u64 = u64::MAX;

#[derive(Debug)]
enum Inner {
    Count {
        ring: Vec<Call>,
        /// Where the next call goes.
        next: usize,
        /// How many slots hold a call.
        len: usize,
        totals: HealthCounts,
    },
    Time {
        /// `(bucket number, counts)`; the bucket number is `millis / bucket_ms`.
        buckets: Vec<(u64, HealthCounts)>,
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
///
/// clock.advance(Duration::from_secs(11));
/// assert_eq!(window.snapshot().calls, 0);
/// ```
#[derive(Debug)]
pub struct HealthWindow {
    config: HealthConfig,
    millis: CoarseMillis,
    /// Bucket length for time-based windows (1 for count-based, unused).
    bucket_ms: u64,
    inner: Mutex<Inner>,
}

impl HealthWindow {
    /// A window reading time from `clock`; `Err` names the first invalid field.
    pub fn new(config: HealthConfig, clock: Clock) -> Result<Self, InvalidConfig> {
        config.validate()?;
        Ok(Self::build(config, clock))
    }

    /// Builds a window from a configuration already known to be valid (a preset).
    pub(crate) fn build(config: HealthConfig, clock: Clock) -> Self {
        let (bucket_ms, inner) = match config.kind {
            WindowKind::Count { calls } => (
                1,
                Inner::Count {
                    ring: vec![Call(0); calls as usize],
                    next: 0,
                    len: 0,
                    totals: HealthCounts::default(),
                },
            ),
            WindowKind::Time { length, buckets } => {
                let length_ms = u64::try_from(length.as_millis()).unwrap_or(u64::MAX);
                (
                    (length_ms / u64::from(buckets)).max(1),
                    Inner::Time {
                        buckets: vec![(EMPTY_EPOCH, HealthCounts::default()); buckets as usize],
                    },
                )
            }
        };
        HealthWindow {
            config,
            millis: CoarseMillis::new(clock),
            bucket_ms,
            inner: Mutex::new(inner),
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

    /// Records one call (one attempt: see the [module documentation](self#what-is-a-call)) and
    /// returns the window's totals including it.
    pub fn record(&self, outcome: Outcome, elapsed: Duration) -> HealthCounts {
        let call = Call::new(&self.config, outcome, elapsed);
        let mut inner = self.lock();
        // Read the time under the lock, so that records reach the buckets in time order and a
        // late writer can never reset a newer bucket.
        let epoch = self.millis.now() / self.bucket_ms;
        match &mut *inner {
            Inner::Count {
                ring,
                next,
                len,
                totals,
            } => {
                if *len == ring.len() {
                    totals.sub(&ring[*next].counts());
                } else {
                    *len += 1;
                }
                ring[*next] = call;
                *next = (*next + 1) % ring.len();
                totals.add(&call.counts());
                *totals
            }
            Inner::Time { buckets } => {
                let n = buckets.len();
                let slot = &mut buckets[(epoch % n as u64) as usize];
                if slot.0 != epoch {
                    *slot = (epoch, HealthCounts::default());
                }
                slot.1.add(&call.counts());
                sum_buckets(buckets, epoch)
            }
        }
    }

    /// The window's current totals.
    pub fn snapshot(&self) -> HealthCounts {
        let epoch = self.millis.now() / self.bucket_ms;
        let inner = self.lock();
        match &*inner {
            Inner::Count { totals, .. } => *totals,
            Inner::Time { buckets } => sum_buckets(buckets, epoch),
        }
    }

    /// Forgets every recorded call (the breaker does this when it closes: the calls before
    /// an outage say nothing about the downstream after it).
    pub fn reset(&self) {
        let mut inner = self.lock();
        match &mut *inner {
            Inner::Count {
                next, len, totals, ..
            } => {
                *next = 0;
                *len = 0;
                *totals = HealthCounts::default();
            }
            Inner::Time { buckets } => {
                for b in buckets.iter_mut() {
                    *b = (EMPTY_EPOCH, HealthCounts::default());
                }
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // No code panics while holding the lock, so a poisoned lock still holds consistent
        // totals.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Sums the buckets that are among the last `buckets.len()` bucket numbers up to `epoch`.
fn sum_buckets(buckets: &[(u64, HealthCounts)], epoch: u64) -> HealthCounts {
    let n = buckets.len() as u64;
    let mut sum = HealthCounts::default();
    for (b_epoch, counts) in buckets {
        if *b_epoch != EMPTY_EPOCH && *b_epoch <= epoch && epoch - *b_epoch < n {
            sum.add(counts);
        }
    }
    sum
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
        let c = w.record(Outcome::NeverRetry, Duration::ZERO);
        assert_eq!((c.calls, c.never_retry, c.failures), (1, 1, 0));
        let w = HealthWindow::new(
            HealthConfig::count(10).with_never_retry_as_failure(true),
            clock.clock(),
        )
        .expect("must succeed");
        assert_eq!(w.record(Outcome::NeverRetry, Duration::ZERO).failures, 1);
    }

    #[test]
    fn slow_means_strictly_longer_than_the_threshold() {
        let config = HealthConfig::count(10).with_slow_call_threshold(Duration::from_secs(1));
        let w = HealthWindow::new(config, ManualClock::new().clock()).expect("must succeed");
        assert_eq!(w.record(Outcome::Success, Duration::from_secs(1)).slow, 0);
        assert_eq!(
            w.record(Outcome::InDoubt, Duration::from_millis(1001)).slow,
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
        w.record(Outcome::Retryable, Duration::ZERO); // bucket 0
        clock.advance(Duration::from_millis(9_999)); // bucket 9: bucket 0 still inside
        w.record(Outcome::Success, Duration::ZERO);
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
                let got = w.record(call.0, call.1);
                let start = seen.len().saturating_sub(size as usize);
                prop_assert_eq!(got, model_counts(&config, &seen[start..]));
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
                let got = w.record(outcome(o), Duration::ZERO);
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
