//! How a window counts: its shape, what is slow, what is a failure, and the checks that
//! refuse a window that could not work.

use std::time::Duration;

use crate::classify::Outcome;

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

/// The shape of a [`HealthWindow`](super::HealthWindow).
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

/// How a [`HealthWindow`](super::HealthWindow) counts.
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
    /// [module documentation](super#what-is-a-failure)).
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
