//! The breaker table of a policy file (`breaker = { time = "10s", ... }`), read into a
//! [`BreakerConfig`] and written back from one; apart from `file.rs` so that each stays a
//! size one can read.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{FieldPath, PolicyError};
use crate::breaker::{BreakerConfig, Comparison};
use crate::health::{HealthConfig, WindowKind};

#[derive(Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ComparisonKind {
    #[default]
    AtLeast,
    Above,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBreaker {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    count: Option<u32>,
    #[serde(
        default,
        with = "crate::duration::serde_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    time: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    buckets: Option<u32>,
    #[serde(
        default,
        with = "crate::duration::serde_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    slow_call: Option<Duration>,
    #[serde(default)]
    count_never_retry: bool,
    #[serde(default = "default_failure_ratio")]
    failure_ratio: f64,
    #[serde(default = "default_slow_call_ratio")]
    slow_call_ratio: f64,
    #[serde(default)]
    comparison: ComparisonKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    minimum_throughput: Option<u32>,
    #[serde(default = "default_open", with = "crate::duration::serde_duration")]
    open: Duration,
    #[serde(
        default,
        with = "crate::duration::serde_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    max_open: Option<Duration>,
    #[serde(default = "default_growth")]
    growth: f64,
    #[serde(default)]
    jitter: f64,
    #[serde(default = "default_probes")]
    probes: u32,
    /// Held open: every call is refused (and answered by the fallback where one is set)
    /// until a policy without it is applied. Set by an operator or a rule for a downstream
    /// known to be down; written only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) isolated: bool,
}

fn default_failure_ratio() -> f64 {
    0.5
}
fn default_slow_call_ratio() -> f64 {
    1.0
}
fn default_open() -> Duration {
    Duration::from_secs(5)
}
fn default_growth() -> f64 {
    1.0
}
fn default_probes() -> u32 {
    1
}
/// The default time-window buckets: one per second of a 10 s window.
const DEFAULT_BUCKETS: u32 = 10;
/// Resilience4j's default minimum number of calls.
const DEFAULT_MINIMUM_THROUGHPUT: u32 = 100;

impl RawBreaker {
    pub(super) fn into_config(self, at: &FieldPath) -> Result<BreakerConfig, PolicyError> {
        let mut window = match (self.count, self.time) {
            (Some(calls), None) => {
                if self.buckets.is_some() {
                    return Err(at
                        .field("buckets")
                        .invalid("buckets belong to a time window (`time`), not a count window"));
                }
                HealthConfig::count(calls)
            }
            (None, Some(length)) => {
                HealthConfig::time(length, self.buckets.unwrap_or(DEFAULT_BUCKETS))
            }
            _ => {
                return Err(at.invalid(
                    "set exactly one window: `count` (the last N calls) or `time` (the calls of the last duration)",
                ));
            }
        };
        if let Some(slow) = self.slow_call {
            window = window.with_slow_call_threshold(slow);
        }
        window = window.with_never_retry_as_failure(self.count_never_retry);
        let minimum = self.minimum_throughput.unwrap_or(match window.kind() {
            WindowKind::Count { calls } => calls.min(DEFAULT_MINIMUM_THROUGHPUT),
            WindowKind::Time { .. } => DEFAULT_MINIMUM_THROUGHPUT,
        });
        let comparison = match self.comparison {
            ComparisonKind::AtLeast => Comparison::AtLeast,
            ComparisonKind::Above => Comparison::Above,
        };
        Ok(BreakerConfig::new(window)
            .with_failure_ratio(self.failure_ratio)
            .with_slow_call_ratio(self.slow_call_ratio)
            .with_comparison(comparison)
            .with_minimum_throughput(minimum)
            .with_open_duration(self.open)
            .with_growth(self.growth, self.max_open.unwrap_or(self.open))
            .with_jitter(self.jitter)
            .with_permitted_probes(self.probes))
    }
}

impl From<BreakerConfig> for RawBreaker {
    fn from(config: BreakerConfig) -> Self {
        let window = config.window();
        let (count, time, buckets) = match window.kind() {
            WindowKind::Count { calls } => (Some(calls), None, None),
            WindowKind::Time { length, buckets } => (None, Some(length), Some(buckets)),
        };
        RawBreaker {
            count,
            time,
            buckets,
            slow_call: window.slow_call_threshold(),
            count_never_retry: window.never_retry_is_failure(),
            failure_ratio: config.failure_ratio(),
            slow_call_ratio: config.slow_call_ratio(),
            comparison: match config.comparison() {
                Comparison::AtLeast => ComparisonKind::AtLeast,
                Comparison::Above => ComparisonKind::Above,
            },
            minimum_throughput: Some(config.minimum_throughput()),
            open: config.open_duration(),
            max_open: Some(config.max_open_duration()),
            growth: config.growth(),
            jitter: config.jitter(),
            probes: config.permitted_probes(),
            isolated: false,
        }
    }
}
