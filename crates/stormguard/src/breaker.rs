//! A circuit breaker: stop calling a downstream that is failing, and find out cheaply when it
//! has recovered.
//!
//! # Why a breaker, when there are retry budgets?
//!
//! A budget limits how much *extra* load retries add; it still lets every first attempt
//! through. When a downstream is down — not slow, not flaky, down — every one of those first
//! attempts waits for a timeout, holds a connection and a thread, and tells us nothing new. A
//! breaker notices the correlated failure in the shared [`HealthWindow`] and fails calls
//! *immediately* with [`BreakerOpen`], which also gives the downstream room to recover.
//!
//! # States
//!
//! - **Closed**: every call is admitted. After each recorded call, if the window holds at least
//!   `minimum_throughput` calls and its failure ratio or slow-call ratio crosses its threshold
//!   (see [`Comparison`]), the breaker opens.
//! - **Open**: every call is rejected with [`BreakerOpen`] for the open duration: `open_duration
//!   × growth^(n−1)` for the *n*-th consecutive open (growth 1 by default), capped at
//!   `max_open_duration`, then multiplied by a random factor in `[1 − jitter, 1 + jitter]` and
//!   capped again. The jitter keeps a fleet of clients that opened together from probing
//!   together.
//! - **Half-open**: the first [`try_acquire`](CircuitBreaker::try_acquire) after the open
//!   duration moves the breaker here (lazily: no timer runs). At most `permitted_probes` calls
//!   are admitted as probes. Any probe that fails (a health failure or a slow call) reopens the
//!   breaker; when `permitted_probes` probes have succeeded it closes, clears the window and
//!   resets the growth.
//! - **Isolated**: held open by [`isolate`](CircuitBreaker::isolate) until
//!   [`reset`](CircuitBreaker::reset).
//!
//! # How attempts are counted
//!
//! Every attempt is one call: the retrier acquires a permit for *each* attempt, retries
//! included, and records its outcome. A request that fails three times is three failed calls,
//! because the downstream saw three requests. Retries add to the number of calls as well as to
//! the number of failures, so a retry storm cannot push the failure *ratio* above what the
//! downstream actually produces; it can only reach `minimum_throughput` sooner. Calls the
//! breaker rejected were never sent and are not recorded. See also
//! [`health`](crate::health#what-is-a-call) for which outcomes are failures.
//!
//! # Permits
//!
//! [`try_acquire`](CircuitBreaker::try_acquire) returns a [`Permit`]; record the call's outcome
//! with [`Permit::record`]. A permit dropped **without** a record (the caller was cancelled,
//! or lost a hedge race) is *abandoned*: nothing is recorded in the window, because a
//! cancellation says nothing about the downstream, and a half-open probe slot it held is
//! returned, so another probe may be admitted (Resilience4j's `releasePermission` does the
//! same). A timeout that *you* enforce is not an abandonment: record it as
//! [`Outcome::InDoubt`].
//!
//! # Events
//!
//! State changes and rejections are reported to a [`BreakerObserver`] (no-op by default),
//! after the breaker's lock is released, so an observer may call back into the breaker.
//!
//! # Cost
//!
//! A closed breaker admits a call with one atomic load. Recording a healthy call on a
//! closed breaker over a time-based window takes no lock either: the window records it in the
//! recording thread's own shard (see [`health`](crate::health#cost)), and the breaker looks at
//! the totals only when they may have moved towards a threshold (a failed or slow call, a new
//! bucket; see `CircuitBreaker::record`'s notes in the source). Failed and slow calls, probes
//! and state changes take the breaker's mutex; a count-based window takes its own mutex on
//! every record (and the breaker's only to open). `benches/breaker.rs` measures the healthy path against recloser, failsafe
//! and tower-resilience.
//!
//! # Owned permits
//!
//! [`CircuitBreaker::try_acquire_owned`] gives an [`OwnedPermit`] holding an [`Arc`] of the
//! breaker, for futures that must be `'static` (tower services).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

use crate::classify::Outcome;
use crate::clock::Clock;
use crate::health::{
    HealthConfig, HealthCounts, HealthWindow, InvalidConfig, Problem, Recorded, WindowKind,
};

/// The breaker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls are admitted and recorded.
    Closed,
    /// Calls are rejected until the open duration has passed.
    Open,
    /// A bounded number of probes are admitted.
    HalfOpen,
    /// Held open by [`CircuitBreaker::isolate`].
    Isolated,
}

/// How a ratio is compared with its threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparison {
    /// Open when `ratio >= threshold` (Resilience4j, Polly).
    AtLeast,
    /// Open when `ratio > threshold` ("more than 50 %").
    Above,
}

impl Comparison {
    fn crosses(self, ratio: f64, threshold: f64) -> bool {
        match self {
            Comparison::AtLeast => ratio >= threshold,
            Comparison::Above => ratio > threshold,
        }
    }
}

/// A circuit breaker's configuration, including the window it builds for itself.
///
/// # Default
///
/// [`BreakerConfig::resilience4j_default`].
///
/// ```
/// use std::time::Duration;
/// use stormguard::breaker::BreakerConfig;
/// use stormguard::health::HealthConfig;
///
/// let config = BreakerConfig::new(HealthConfig::count(20))
///     .with_failure_ratio(0.5)
///     .with_minimum_throughput(10)
///     .with_open_duration(Duration::from_secs(5))
///     .with_growth(2.0, Duration::from_secs(60))
///     .with_jitter(0.2)
///     .with_permitted_probes(3);
/// assert!(config.validate().is_ok());
/// assert_eq!(
///     config.with_failure_ratio(f64::NAN).validate().unwrap_err().field,
///     "breaker.failure_ratio",
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerConfig {
    window: HealthConfig,
    failure_ratio: f64,
    slow_call_ratio: f64,
    comparison: Comparison,
    minimum_throughput: u32,
    open_duration: Duration,
    max_open_duration: Duration,
    growth: f64,
    jitter: f64,
    permitted_probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig::resilience4j_default()
    }
}

impl BreakerConfig {
    /// Resilience4j's defaults, with its `>=` comparison: `failureRateThreshold` 50 %,
    /// `slowCallRateThreshold` 100 %, `slowCallDurationThreshold` 60 s,
    /// `permittedNumberOfCallsInHalfOpenState` 10, `slidingWindowType` `COUNT_BASED`,
    /// `slidingWindowSize` 100, `minimumNumberOfCalls` 100, `waitDurationInOpenState` 60 s; no
    /// jitter, no growth.
    ///
    /// Source: the Resilience4j CircuitBreaker configuration table
    /// (<https://resilience4j.readme.io/docs/circuitbreaker>, "Create and configure a
    /// CircuitBreaker"; mirrored in Apache Camel's Resilience4j EIP page), which also states
    /// "if the failure rate is equal or greater than the threshold" the breaker opens.
    ///
    /// Difference: Resilience4j evaluates half-open probes by their failure *rate* once all
    /// are done; here any failed probe reopens the breaker.
    pub const fn resilience4j_default() -> Self {
        BreakerConfig {
            window: HealthConfig::count(100).with_slow_call_threshold(Duration::from_secs(60)),
            failure_ratio: 0.5,
            slow_call_ratio: 1.0,
            comparison: Comparison::AtLeast,
            minimum_throughput: 100,
            open_duration: Duration::from_secs(60),
            max_open_duration: Duration::from_secs(60),
            growth: 1.0,
            jitter: 0.0,
            permitted_probes: 10,
        }
    }

    /// Polly v8's circuit breaker defaults (the former "advanced" breaker): `FailureRatio`
    /// 0.1, `SamplingDuration` 30 s, `MinimumThroughput` 100, `BreakDuration` 5 s, one probe
    /// after the break ("if the first action after the break duration period results in a
    /// handled exception, the circuit will break again"), compared with `>=`. No slow-call
    /// threshold (Polly has none). The 30 s are split into 10 buckets.
    ///
    /// Source: Polly's `CircuitBreakerStrategyOptions`
    /// (<https://www.pollydocs.org/strategies/circuit-breaker#defaults> and
    /// <https://pollydocs.org/api/Polly.CircuitBreaker.CircuitBreakerStrategyOptions-1.html>).
    pub const fn polly_default() -> Self {
        BreakerConfig {
            window: HealthConfig::time(Duration::from_secs(30), 10),
            failure_ratio: 0.1,
            slow_call_ratio: 1.0,
            comparison: Comparison::AtLeast,
            minimum_throughput: 100,
            open_duration: Duration::from_secs(5),
            max_open_duration: Duration::from_secs(5),
            growth: 1.0,
            jitter: 0.0,
            permitted_probes: 1,
        }
    }

    /// The seeds' example: opens when *more than* 50 % of the calls within 10 s failed.
    ///
    /// "5xx" here means what the window counts as a failure: 502/503/504 ([`Outcome::Retryable`]),
    /// 429 and 503 with `Retry-After` ([`Outcome::Overloaded`]) and timeouts
    /// ([`Outcome::InDoubt`]); 500 and 501 classify as [`Outcome::NeverRetry`] and are not
    /// counted unless the window is built with
    /// [`with_never_retry_as_failure`](HealthConfig::with_never_retry_as_failure).
    ///
    /// The other numbers are this crate's choices, not the seeds': at least 20 calls in the
    /// window (Hystrix's `requestVolumeThreshold`), 10 buckets of 1 s, open 5 s doubling on
    /// each consecutive open up to 60 s, ±20 % jitter, 3 probes.
    pub const fn seeds_default() -> Self {
        BreakerConfig {
            window: HealthConfig::time(Duration::from_secs(10), 10),
            failure_ratio: 0.5,
            slow_call_ratio: 1.0,
            comparison: Comparison::Above,
            minimum_throughput: 20,
            open_duration: Duration::from_secs(5),
            max_open_duration: Duration::from_secs(60),
            growth: 2.0,
            jitter: 0.2,
            permitted_probes: 3,
        }
    }

    /// A breaker over `window` with Resilience4j's thresholds and durations.
    pub const fn new(window: HealthConfig) -> Self {
        let mut config = BreakerConfig::resilience4j_default();
        config.window = window;
        config
    }

    /// The window the breaker builds for itself in [`CircuitBreaker::new`].
    pub const fn with_window(mut self, window: HealthConfig) -> Self {
        self.window = window;
        self
    }

    /// Failure ratio (in `0..=1`) that opens the breaker.
    pub const fn with_failure_ratio(mut self, ratio: f64) -> Self {
        self.failure_ratio = ratio;
        self
    }

    /// Slow-call ratio (in `0..=1`) that opens the breaker. Slowness is defined by the
    /// window's [`slow-call threshold`](HealthConfig::with_slow_call_threshold); without one
    /// no call is slow.
    pub const fn with_slow_call_ratio(mut self, ratio: f64) -> Self {
        self.slow_call_ratio = ratio;
        self
    }

    /// How ratios are compared with thresholds.
    pub const fn with_comparison(mut self, comparison: Comparison) -> Self {
        self.comparison = comparison;
        self
    }

    /// Calls the window must hold before the ratios are looked at.
    pub const fn with_minimum_throughput(mut self, calls: u32) -> Self {
        self.minimum_throughput = calls;
        self
    }

    /// How long the breaker stays open the first time (also sets the cap to the same value
    /// if the cap was lower).
    pub const fn with_open_duration(mut self, duration: Duration) -> Self {
        self.open_duration = duration;
        if self.max_open_duration.as_nanos() < duration.as_nanos() {
            self.max_open_duration = duration;
        }
        self
    }

    /// Multiplies the open duration by `factor` on each consecutive open (an open from
    /// half-open), up to `max`.
    pub const fn with_growth(mut self, factor: f64, max: Duration) -> Self {
        self.growth = factor;
        self.max_open_duration = max;
        self
    }

    /// Spreads each open duration uniformly over `[d·(1 − jitter), d·(1 + jitter)]` (then
    /// caps it at the maximum).
    pub const fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Probes admitted in half-open; that many successes close the breaker.
    pub const fn with_permitted_probes(mut self, probes: u32) -> Self {
        self.permitted_probes = probes;
        self
    }

    /// The window configuration.
    pub const fn window(&self) -> &HealthConfig {
        &self.window
    }

    /// The failure-ratio threshold.
    pub const fn failure_ratio(&self) -> f64 {
        self.failure_ratio
    }

    /// The slow-call-ratio threshold.
    pub const fn slow_call_ratio(&self) -> f64 {
        self.slow_call_ratio
    }

    /// The minimum number of calls before the ratios count.
    pub const fn minimum_throughput(&self) -> u32 {
        self.minimum_throughput
    }

    /// The first open duration.
    pub const fn open_duration(&self) -> Duration {
        self.open_duration
    }

    /// The cap on any open duration.
    pub const fn max_open_duration(&self) -> Duration {
        self.max_open_duration
    }

    /// The number of half-open probes.
    pub const fn permitted_probes(&self) -> u32 {
        self.permitted_probes
    }

    /// The factor the open duration grows by on each consecutive open.
    pub const fn growth(&self) -> f64 {
        self.growth
    }

    /// The jitter spread of each open duration, in `0..=1`.
    pub const fn jitter(&self) -> f64 {
        self.jitter
    }

    /// How ratios are compared with thresholds.
    pub const fn comparison(&self) -> Comparison {
        self.comparison
    }

    /// Checks every field (the window's too); the error names the first bad one.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        self.window.validate()?;
        self.validate_breaker(&self.window)
    }

    fn validate_breaker(&self, window: &HealthConfig) -> Result<(), InvalidConfig> {
        let ratio = |field, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(InvalidConfig::new(field, Problem::NotARatio(v)))
            }
        };
        ratio("breaker.failure_ratio", self.failure_ratio)?;
        ratio("breaker.slow_call_ratio", self.slow_call_ratio)?;
        ratio("breaker.jitter", self.jitter)?;
        if self.minimum_throughput == 0 {
            return Err(InvalidConfig::new(
                "breaker.minimum_throughput",
                Problem::Zero,
            ));
        }
        if let WindowKind::Count { calls } = window.kind() {
            if self.minimum_throughput > calls {
                return Err(InvalidConfig::new(
                    "breaker.minimum_throughput",
                    Problem::Unreachable("more calls than the count-based window holds"),
                ));
            }
        }
        if self.open_duration.as_millis() == 0 {
            return Err(InvalidConfig::new("breaker.open_duration", Problem::Zero));
        }
        if self.max_open_duration < self.open_duration {
            return Err(InvalidConfig::new(
                "breaker.max_open_duration",
                Problem::LessThan("breaker.open_duration"),
            ));
        }
        if !(self.growth.is_finite() && self.growth >= 1.0) {
            return Err(InvalidConfig::new(
                "breaker.growth",
                Problem::BelowOne(self.growth),
            ));
        }
        if self.permitted_probes == 0 {
            return Err(InvalidConfig::new(
                "breaker.permitted_probes",
                Problem::Zero,
            ));
        }
        Ok(())
    }

    /// Whether these window totals open a closed breaker.
    pub fn should_open(&self, counts: &HealthCounts) -> bool {
        counts.calls >= u64::from(self.minimum_throughput)
            && (self
                .comparison
                .crosses(counts.failure_ratio(), self.failure_ratio)
                || self
                    .comparison
                    .crosses(counts.slow_call_ratio(), self.slow_call_ratio))
    }
}

/// Why a call was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The breaker is open.
    Open,
    /// The breaker is half-open and all its probes are in flight.
    ProbesBusy,
    /// The breaker was isolated by hand.
    Isolated,
}

/// The breaker rejected the call; it was not sent.
///
/// `retry_after` is when the breaker will next admit a call: the rest of the open duration
/// when open; when half-open with all probes busy or isolated, the configured (first) open
/// duration, as a hint — the real answer depends on the probes or on a person.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("circuit breaker {reason:?}: retry after {retry_after:?}")]
pub struct BreakerOpen {
    /// How long until the breaker may admit a call.
    pub retry_after: Duration,
    /// Why the call was rejected.
    pub reason: Rejection,
}

/// Why the state changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The window's failure ratio crossed its threshold.
    FailureRatio,
    /// The window's slow-call ratio crossed its threshold.
    SlowCallRatio,
    /// The open duration passed and a call arrived.
    OpenElapsed,
    /// A half-open probe failed or was slow.
    ProbeFailed,
    /// All half-open probes succeeded.
    ProbesSucceeded,
    /// [`CircuitBreaker::isolate`].
    Isolated,
    /// [`CircuitBreaker::reset`].
    Reset,
}

/// A state change event.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StateChange {
    /// The state before.
    pub from: BreakerState,
    /// The state after.
    pub to: BreakerState,
    /// Why.
    pub cause: Cause,
    /// When `to` is [`BreakerState::Open`]: for how long.
    pub open_for: Option<Duration>,
    /// The window's totals that opened the breaker (for [`Cause::FailureRatio`] and
    /// [`Cause::SlowCallRatio`]).
    pub counts: Option<HealthCounts>,
}

/// Receives breaker events; every method defaults to doing nothing.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use stormguard::breaker::{BreakerObserver, BreakerState, StateChange};
///
/// #[derive(Default)]
/// struct CountOpens(AtomicU32);
/// impl BreakerObserver for CountOpens {
///     fn state_changed(&self, change: &StateChange) {
///         if change.to == BreakerState::Open {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait BreakerObserver: Send + Sync {
    /// The state changed.
    fn state_changed(&self, change: &StateChange) {
        let _ = change;
    }

    /// A call was rejected.
    fn call_rejected(&self, rejected: &BreakerOpen) {
        let _ = rejected;
    }
}

impl BreakerObserver for () {}

impl<O: BreakerObserver + ?Sized> BreakerObserver for Arc<O> {
    fn state_changed(&self, change: &StateChange) {
        (**self).state_changed(change)
    }
    fn call_rejected(&self, rejected: &BreakerOpen) {
        (**self).call_rejected(rejected)
    }
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    Closed,
    Open { until_ms: u64 },
    HalfOpen { admitted: u32, succeeded: u32 },
    Isolated,
}

impl Phase {
    fn state(self) -> BreakerState {
        match self {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
            Phase::Isolated => BreakerState::Isolated,
        }
    }
}

#[derive(Debug)]
struct Core {
    phase: Phase,
    /// Bumped on every state change, so a permit from an earlier half-open period cannot
    /// count as a probe of the current one.
    epoch: u64,
    /// Opens since the breaker last closed (drives growth).
    consecutive_opens: u32,
    rng: SmallRng,
}

/// The lock-free mirror of the breaker's phase: the phase in the low bits, the epoch above.
const PHASE_BITS: u32 = 2;
const PHASE_MASK: u64 = (1 << PHASE_BITS) - 1;
const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
const ISOLATED: u64 = 3;
/// No evaluation of the closed state is current (see `CircuitBreaker::record`).
const NO_TOKEN: u64 = u64::MAX;

impl Phase {
    const fn code(self) -> u64 {
        match self {
            Phase::Closed => CLOSED,
            Phase::Open { .. } => OPEN,
            Phase::HalfOpen { .. } => HALF_OPEN,
            Phase::Isolated => ISOLATED,
        }
    }
}

/// A circuit breaker over a (possibly shared) [`HealthWindow`].
///
/// `Send + Sync`; share it in an [`Arc`] between the callers of one downstream.
///
/// ```
/// use std::time::Duration;
/// use stormguard::breaker::{BreakerConfig, BreakerState, CircuitBreaker};
/// use stormguard::classify::Outcome;
/// use stormguard::clock::ManualClock;
/// use stormguard::health::HealthConfig;
///
/// let clock = ManualClock::new();
/// let config = BreakerConfig::new(HealthConfig::count(4))
///     .with_minimum_throughput(4)
///     .with_open_duration(Duration::from_secs(5))
///     .with_permitted_probes(1);
/// let breaker = CircuitBreaker::new(config, clock.clock()).unwrap();
///
/// for outcome in [Outcome::Success, Outcome::Retryable, Outcome::Success, Outcome::InDoubt] {
///     let permit = breaker.try_acquire().unwrap();
///     permit.record(outcome, Duration::from_millis(10));
/// }
/// // 2 failures in 4 calls: 50 % >= 50 %.
/// assert_eq!(breaker.state(), BreakerState::Open);
/// assert_eq!(breaker.try_acquire().unwrap_err().retry_after, Duration::from_secs(5));
///
/// clock.advance(Duration::from_secs(5));
/// let probe = breaker.try_acquire().unwrap();
/// assert!(probe.is_probe());
/// probe.record(Outcome::Success, Duration::from_millis(10));
/// assert_eq!(breaker.state(), BreakerState::Closed);
/// ```
#[derive(Debug)]
pub struct CircuitBreaker<O = ()> {
    config: BreakerConfig,
    window: Arc<HealthWindow>,
    /// `phase code | epoch << PHASE_BITS`, written under `core`'s lock, read without it.
    state: AtomicU64,
    /// The window version at which the closed state was last evaluated and found unable to
    /// open on a healthy call, or [`NO_TOKEN`].
    eval_token: AtomicU64,
    core: Mutex<Core>,
    observer: O,
}

impl CircuitBreaker {
    /// A breaker with its own window built from `config`, on `clock`, with an OS-seeded
    /// jitter source.
    pub fn new(config: BreakerConfig, clock: Clock) -> Result<Self, InvalidConfig> {
        let window = Arc::new(HealthWindow::new(config.window, clock)?);
        Self::with_window(config, window)
    }

    /// A breaker reading a window shared with other policies. The window's own configuration
    /// is used; `config`'s window part is ignored.
    pub fn with_window(
        config: BreakerConfig,
        window: Arc<HealthWindow>,
    ) -> Result<Self, InvalidConfig> {
        config.validate_breaker(window.config())?;
        let config = config.with_window(*window.config());
        Ok(Self::from_parts(config, window))
    }

    /// [`BreakerConfig::resilience4j_default`] on [`Clock::default`].
    pub fn resilience4j_default() -> Self {
        Self::preset(BreakerConfig::resilience4j_default())
    }

    /// [`BreakerConfig::polly_default`] on [`Clock::default`].
    pub fn polly_default() -> Self {
        Self::preset(BreakerConfig::polly_default())
    }

    /// [`BreakerConfig::seeds_default`] on [`Clock::default`].
    pub fn seeds_default() -> Self {
        Self::preset(BreakerConfig::seeds_default())
    }

    fn preset(config: BreakerConfig) -> Self {
        // The presets are valid (a test checks each), so the window is built unchecked.
        let window = Arc::new(HealthWindow::build(config.window, Clock::default()));
        Self::from_parts(config, window)
    }

    fn from_parts(config: BreakerConfig, window: Arc<HealthWindow>) -> Self {
        CircuitBreaker {
            config,
            window,
            state: AtomicU64::new(CLOSED),
            eval_token: AtomicU64::new(NO_TOKEN),
            core: Mutex::new(Core {
                phase: Phase::Closed,
                epoch: 0,
                consecutive_opens: 0,
                rng: SmallRng::from_os_rng(),
            }),
            observer: (),
        }
    }
}

/// What a permit remembers: whether it is a probe, and of which half-open period.
#[derive(Clone, Copy, Debug)]
struct Ticket {
    probe: bool,
    epoch: u64,
}

impl<O: BreakerObserver> CircuitBreaker<O> {
    /// Reports events to `observer` instead.
    pub fn with_observer<P: BreakerObserver>(self, observer: P) -> CircuitBreaker<P> {
        CircuitBreaker {
            config: self.config,
            window: self.window,
            state: self.state,
            eval_token: self.eval_token,
            core: self.core,
            observer,
        }
    }

    /// Seeds the jitter source, for reproducible open durations.
    pub fn with_seed(self, seed: u64) -> Self {
        self.lock().rng = SmallRng::seed_from_u64(seed);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// The window this breaker reads (share it with other policies).
    pub fn window(&self) -> &Arc<HealthWindow> {
        &self.window
    }

    /// The current state (one atomic load). An open breaker whose open duration has passed
    /// still reports [`BreakerState::Open`] until the next [`try_acquire`](Self::try_acquire).
    pub fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) & PHASE_MASK {
            CLOSED => BreakerState::Closed,
            OPEN => BreakerState::Open,
            HALF_OPEN => BreakerState::HalfOpen,
            _ => BreakerState::Isolated,
        }
    }

    /// Admits a call, or rejects it. Record the call's outcome on the returned [`Permit`].
    ///
    /// A closed breaker admits with one atomic load and no lock.
    #[inline]
    pub fn try_acquire(&self) -> Result<Permit<'_, O>, BreakerOpen> {
        let ticket = self.acquire()?;
        Ok(Permit {
            breaker: self,
            ticket,
            done: false,
        })
    }

    /// [`try_acquire`](Self::try_acquire) for a breaker in an [`Arc`]: the permit owns a
    /// reference to the breaker, so it can travel in a `'static` future (a tower service's
    /// response future, a spawned task).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use stormguard::breaker::{BreakerConfig, CircuitBreaker};
    /// use stormguard::classify::Outcome;
    /// use stormguard::clock::Clock;
    ///
    /// let breaker = Arc::new(CircuitBreaker::new(BreakerConfig::seeds_default(), Clock::system()).unwrap());
    /// let permit = breaker.try_acquire_owned().unwrap();
    /// std::thread::spawn(move || permit.record(Outcome::Success, Duration::from_millis(3)))
    ///     .join()
    ///     .unwrap();
    /// assert_eq!(breaker.window().snapshot().successes, 1);
    /// ```
    #[inline]
    pub fn try_acquire_owned(self: &Arc<Self>) -> Result<OwnedPermit<O>, BreakerOpen> {
        let ticket = self.acquire()?;
        Ok(OwnedPermit {
            breaker: Arc::clone(self),
            ticket,
            done: false,
        })
    }

    #[inline]
    fn acquire(&self) -> Result<Ticket, BreakerOpen> {
        let state = self.state.load(Ordering::Acquire);
        if state & PHASE_MASK == CLOSED {
            return Ok(Ticket {
                probe: false,
                epoch: state >> PHASE_BITS,
            });
        }
        self.acquire_slow()
    }

    #[cold]
    fn acquire_slow(&self) -> Result<Ticket, BreakerOpen> {
        let mut core = self.lock();
        let hint = self.config.open_duration;
        let (result, event) = match core.phase {
            Phase::Closed => (Ok(false), None),
            Phase::Open { until_ms } => {
                let now = self.window.now_millis();
                if now >= until_ms {
                    let event = self.transition(
                        &mut core,
                        Phase::HalfOpen {
                            admitted: 1,
                            succeeded: 0,
                        },
                        Cause::OpenElapsed,
                        None,
                        None,
                    );
                    (Ok(true), Some(event))
                } else {
                    let rejected = BreakerOpen {
                        retry_after: Duration::from_millis(until_ms - now),
                        reason: Rejection::Open,
                    };
                    (Err(rejected), None)
                }
            }
            Phase::HalfOpen {
                admitted,
                succeeded,
            } => {
                if admitted < self.config.permitted_probes {
                    core.phase = Phase::HalfOpen {
                        admitted: admitted + 1,
                        succeeded,
                    };
                    (Ok(true), None)
                } else {
                    let rejected = BreakerOpen {
                        retry_after: hint,
                        reason: Rejection::ProbesBusy,
                    };
                    (Err(rejected), None)
                }
            }
            Phase::Isolated => (
                Err(BreakerOpen {
                    retry_after: hint,
                    reason: Rejection::Isolated,
                }),
                None,
            ),
        };
        let epoch = core.epoch;
        drop(core);
        if let Some(event) = event {
            self.observer.state_changed(&event);
        }
        match result {
            Ok(probe) => Ok(Ticket { probe, epoch }),
            Err(rejected) => {
                self.observer.call_rejected(&rejected);
                Err(rejected)
            }
        }
    }

    /// Holds the breaker open until [`reset`](Self::reset).
    pub fn isolate(&self) {
        let mut core = self.lock();
        let event = self.transition(&mut core, Phase::Isolated, Cause::Isolated, None, None);
        drop(core);
        self.observer.state_changed(&event);
    }

    /// Closes the breaker, clears the window and the growth.
    pub fn reset(&self) {
        let mut core = self.lock();
        core.consecutive_opens = 0;
        self.window.reset();
        let event = self.transition(&mut core, Phase::Closed, Cause::Reset, None, None);
        drop(core);
        self.observer.state_changed(&event);
    }

    /// Records a call admitted with `ticket`.
    ///
    /// The fast path: a healthy call (neither a failure nor slow) on a closed breaker over a
    /// time-based window cannot open the breaker unless the totals changed in some other way
    /// since they were last looked at — a failed or slow call, a new bucket, a reset, each of
    /// which changes the window's version — or the last look found the window so close to
    /// its thresholds that one more call could tip it (which ignores the minimum throughput,
    /// so it errs towards looking). Healthy calls only lower both ratios, so when neither
    /// holds the totals are not read at all. A count-based window returns its totals with
    /// every record (it computes them under its lock anyway), and the breaker's lock is taken
    /// only when they open it.
    #[inline]
    fn record(&self, ticket: Ticket, outcome: Outcome, elapsed: Duration) {
        let recorded = self.window.record_call(outcome, elapsed);
        if !ticket.probe {
            if self.state.load(Ordering::Acquire) & PHASE_MASK != CLOSED {
                // A call admitted in an earlier state: it is in the window, but it does not
                // move the state machine.
                return;
            }
            match recorded {
                Recorded::Version { version, bad } => {
                    if !bad && self.eval_token.load(Ordering::Acquire) == version {
                        return;
                    }
                }
                // A count-based window hands back its totals: decide without the lock
                // unless they open the breaker.
                Recorded::Totals(counts) => {
                    if !self.config.should_open(&counts) {
                        return;
                    }
                }
            }
        }
        self.record_slow(ticket, outcome, elapsed, recorded);
    }

    #[cold]
    fn record_slow(&self, ticket: Ticket, outcome: Outcome, elapsed: Duration, rec: Recorded) {
        let bad = self.config.window.is_failure(outcome) || self.config.window.is_slow(elapsed);
        let mut core = self.lock();
        let event = match core.phase {
            Phase::Closed if !ticket.probe => {
                let (counts, version) = match rec {
                    Recorded::Totals(counts) => (counts, None),
                    Recorded::Version { .. } => {
                        // Read the version before the totals: a change after this read makes
                        // the token stale.
                        let version = self.window.version();
                        (self.window.snapshot(), Some(version))
                    }
                };
                if self.config.should_open(&counts) {
                    let cause = if self
                        .config
                        .comparison
                        .crosses(counts.failure_ratio(), self.config.failure_ratio)
                    {
                        Cause::FailureRatio
                    } else {
                        Cause::SlowCallRatio
                    };
                    Some(self.open(&mut core, cause, Some(counts)))
                } else {
                    let token = match version {
                        Some(v) if !self.one_more_call_could_open(&counts) => v,
                        _ => NO_TOKEN,
                    };
                    self.eval_token.store(token, Ordering::Release);
                    None
                }
            }
            Phase::HalfOpen {
                admitted,
                succeeded,
            } if ticket.probe && ticket.epoch == core.epoch => {
                if bad {
                    Some(self.open(&mut core, Cause::ProbeFailed, None))
                } else if succeeded + 1 >= self.config.permitted_probes {
                    core.consecutive_opens = 0;
                    self.window.reset();
                    Some(self.transition(
                        &mut core,
                        Phase::Closed,
                        Cause::ProbesSucceeded,
                        None,
                        None,
                    ))
                } else {
                    core.phase = Phase::HalfOpen {
                        admitted,
                        succeeded: succeeded + 1,
                    };
                    None
                }
            }
            // A call admitted in an earlier state: it is in the window, but it does not move
            // the state machine.
            _ => None,
        };
        drop(core);
        if let Some(event) = event {
            self.observer.state_changed(&event);
        }
    }

    /// Whether the ratios with one more call added (a healthy one: the best case for the
    /// breaker) still cross a threshold. Healthy calls only lower the ratios, so when this is
    /// false no run of healthy calls can open the breaker.
    fn one_more_call_could_open(&self, counts: &HealthCounts) -> bool {
        let calls = counts.calls as f64 + 1.0;
        let c = &self.config;
        c.comparison
            .crosses(counts.failures as f64 / calls, c.failure_ratio)
            || c.comparison
                .crosses(counts.slow as f64 / calls, c.slow_call_ratio)
    }

    fn abandon(&self, ticket: Ticket) {
        if !ticket.probe {
            return;
        }
        let mut core = self.lock();
        if let Phase::HalfOpen {
            admitted,
            succeeded,
        } = core.phase
        {
            if core.epoch == ticket.epoch {
                core.phase = Phase::HalfOpen {
                    admitted: admitted.saturating_sub(1),
                    succeeded,
                };
            }
        }
    }

    fn open(&self, core: &mut Core, cause: Cause, counts: Option<HealthCounts>) -> StateChange {
        core.consecutive_opens = core.consecutive_opens.saturating_add(1);
        let open_for = self.open_duration(core);
        let now = self.window.now_millis();
        let until_ms = now.saturating_add(u64::try_from(open_for.as_millis()).unwrap_or(u64::MAX));
        self.transition(
            core,
            Phase::Open { until_ms },
            cause,
            Some(open_for),
            counts,
        )
    }

    /// `open_duration · growth^(n−1)`, capped, jittered, capped again; whole milliseconds,
    /// at least 1 ms.
    fn open_duration(&self, core: &mut Core) -> Duration {
        let c = &self.config;
        let cap = c.max_open_duration.as_secs_f64() * 1000.0;
        let exponent = i32::try_from(core.consecutive_opens.saturating_sub(1)).unwrap_or(i32::MAX);
        let base = (c.open_duration.as_secs_f64() * 1000.0 * c.growth.powi(exponent)).min(cap);
        let jittered = if c.jitter > 0.0 {
            let u = (core.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            base * (1.0 - c.jitter + 2.0 * c.jitter * u)
        } else {
            base
        };
        Duration::from_millis(jittered.min(cap).max(1.0) as u64)
    }

    fn transition(
        &self,
        core: &mut Core,
        to: Phase,
        cause: Cause,
        open_for: Option<Duration>,
        counts: Option<HealthCounts>,
    ) -> StateChange {
        let from = core.phase.state();
        core.phase = to;
        core.epoch = core.epoch.wrapping_add(1) & (u64::MAX >> PHASE_BITS);
        self.eval_token.store(NO_TOKEN, Ordering::Release);
        self.state
            .store(to.code() | (core.epoch << PHASE_BITS), Ordering::Release);
        StateChange {
            from,
            to: to.state(),
            cause,
            open_for,
            counts,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        // No code panics while holding the lock, so a poisoned lock still holds a valid state.
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Permission to make one call; record its outcome with [`Permit::record`].
///
/// Dropping a permit without recording *abandons* the call: nothing is recorded, and a probe
/// slot is returned (see the [module documentation](self#permits)).
#[derive(Debug)]
#[must_use = "record the call's outcome with Permit::record"]
pub struct Permit<'a, O: BreakerObserver = ()> {
    breaker: &'a CircuitBreaker<O>,
    ticket: Ticket,
    done: bool,
}

impl<O: BreakerObserver> Permit<'_, O> {
    /// Records the call's outcome and how long it took.
    #[inline]
    pub fn record(mut self, outcome: Outcome, elapsed: Duration) {
        self.done = true;
        self.breaker.record(self.ticket, outcome, elapsed);
    }

    /// Whether this call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.ticket.probe
    }
}

impl<O: BreakerObserver> Drop for Permit<'_, O> {
    #[inline]
    fn drop(&mut self) {
        if !self.done {
            self.breaker.abandon(self.ticket);
        }
    }
}

/// A [`Permit`] that owns a reference to its breaker: from
/// [`CircuitBreaker::try_acquire_owned`]. Same rules: record the outcome, or drop it to
/// abandon the call.
#[derive(Debug)]
#[must_use = "record the call's outcome with OwnedPermit::record"]
pub struct OwnedPermit<O: BreakerObserver = ()> {
    breaker: Arc<CircuitBreaker<O>>,
    ticket: Ticket,
    done: bool,
}

impl<O: BreakerObserver> OwnedPermit<O> {
    /// Records the call's outcome and how long it took.
    #[inline]
    pub fn record(mut self, outcome: Outcome, elapsed: Duration) {
        self.done = true;
        self.breaker.record(self.ticket, outcome, elapsed);
    }

    /// Whether this call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.ticket.probe
    }

    /// The breaker this permit belongs to.
    pub fn breaker(&self) -> &Arc<CircuitBreaker<O>> {
        &self.breaker
    }
}

impl<O: BreakerObserver> Drop for OwnedPermit<O> {
    #[inline]
    fn drop(&mut self) {
        if !self.done {
            self.breaker.abandon(self.ticket);
        }
    }
}

#[cfg(test)]
mod tests;
