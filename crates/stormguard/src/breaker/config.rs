//! The breaker's configuration: thresholds, durations, probes, and the presets of the
//! libraries it is compared with (Resilience4j, Polly, the seeds).

use std::time::Duration;

use crate::health::{HealthConfig, HealthCounts, InvalidConfig, Problem, WindowKind};

/// How a ratio is compared with its threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparison {
    /// Open when `ratio >= threshold` (Resilience4j, Polly).
    AtLeast,
    /// Open when `ratio > threshold` ("more than 50 %").
    Above,
}

impl Comparison {
    pub(super) fn crosses(self, ratio: f64, threshold: f64) -> bool {
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
    pub(super) window: HealthConfig,
    pub(super) failure_ratio: f64,
    pub(super) slow_call_ratio: f64,
    pub(super) comparison: Comparison,
    pub(super) minimum_throughput: u32,
    pub(super) open_duration: Duration,
    pub(super) max_open_duration: Duration,
    pub(super) growth: f64,
    pub(super) jitter: f64,
    pub(super) permitted_probes: u32,
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
    /// "5xx" here means what the window counts as a failure: 502/503/504 ([`Outcome::Retryable`](crate::classify::Outcome::Retryable)),
    /// 429 and 503 with `Retry-After` ([`Outcome::Overloaded`](crate::classify::Outcome::Overloaded)) and timeouts
    /// ([`Outcome::InDoubt`](crate::classify::Outcome::InDoubt)); 500 and 501 classify as [`Outcome::NeverRetry`](crate::classify::Outcome::NeverRetry) and are not
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

    /// The window the breaker builds for itself in [`CircuitBreaker::new`](super::CircuitBreaker::new).
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

    pub(super) fn validate_breaker(&self, window: &HealthConfig) -> Result<(), InvalidConfig> {
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
