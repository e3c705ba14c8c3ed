//! The retry budget of an endpoint, as a policy writes it, and how it is built.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{FieldPath, PolicyError};
use crate::budget::{ConcurrencyBudget, InvalidBudget, RatioBudget, RetryBudget, TokenBucket};
use crate::clock::Clock;

/// A retry budget as a policy writes it: which kind, with which numbers. Build it once per
/// downstream ([`BudgetSpec::build`]) and share the result among every caller of that
/// downstream.
///
/// ```toml
/// budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
/// budget = { kind = "ratio", retry_ratio = 0.2, ttl = "10s", min_retries_per_sec = 10 }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum BudgetSpec {
    /// gRPC A6 `retryThrottling`.
    Grpc {
        /// 1..=1000.
        max_tokens: u32,
        /// Tokens regained per success, 0.001..=1 (three decimals kept).
        token_ratio: f64,
    },
    /// The seeds' bucket: a retry spends one token.
    SpendPerRetry {
        /// 1..=1000.
        max_tokens: u32,
        /// Tokens regained per success, 0.001..=1.
        token_ratio: f64,
    },
    /// The AWS SDK standard quota.
    AwsStandard,
    /// Finagle/Linkerd: retries up to a fraction of recent requests.
    Ratio {
        /// Fraction of requests that may be retried, 0..=1.
        retry_ratio: f64,
        /// The window, 1 s..=60 s.
        #[serde(with = "crate::duration::serde_duration")]
        ttl: Duration,
        /// Retries per second always allowed.
        #[serde(default)]
        min_retries_per_sec: u32,
    },
    /// Envoy: active retries up to a share of active requests.
    Concurrency {
        /// Percent of active requests, 0..=100.
        budget_percent: f64,
        /// Retries always allowed in flight.
        #[serde(default = "default_min_retry_concurrency")]
        min_retry_concurrency: u32,
    },
}

fn default_min_retry_concurrency() -> u32 {
    3
}

impl BudgetSpec {
    /// Checks every number; `at` names the budget in errors.
    pub(super) fn validate(&self, at: &FieldPath) -> Result<(), PolicyError> {
        match *self {
            BudgetSpec::Grpc {
                max_tokens,
                token_ratio,
            }
            | BudgetSpec::SpendPerRetry {
                max_tokens,
                token_ratio,
            } => {
                if !(1..=1000).contains(&max_tokens) {
                    return Err(at
                        .field("max_tokens")
                        .invalid(format!("must be in 1..=1000, got {max_tokens}")));
                }
                check_fraction(at.field("token_ratio"), token_ratio, 0.001)
            }
            BudgetSpec::AwsStandard => Ok(()),
            BudgetSpec::Ratio {
                retry_ratio, ttl, ..
            } => {
                check_fraction(at.field("retry_ratio"), retry_ratio, 0.0)?;
                if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
                    return Err(at
                        .field("ttl")
                        .invalid(format!("must be between 1s and 60s, got {ttl:?}")));
                }
                Ok(())
            }
            BudgetSpec::Concurrency { budget_percent, .. } => {
                if !(budget_percent.is_finite() && (0.0..=100.0).contains(&budget_percent)) {
                    return Err(at.field("budget_percent").invalid(format!(
                        "must be a finite number in 0..=100, got {budget_percent}"
                    )));
                }
                Ok(())
            }
        }
    }

    /// Builds the budget (validated first). Build it once per downstream and share it.
    ///
    /// ```
    /// use stormguard::budget::Withdrawal;
    /// use stormguard::clock::Clock;
    /// use stormguard::policy::BudgetSpec;
    ///
    /// let budget = BudgetSpec::Grpc { max_tokens: 10, token_ratio: 0.1 }.build(Clock::system())?;
    /// for _ in 0..5 {
    ///     budget.record_failure();
    /// }
    /// assert!(budget.withdraw(Withdrawal::Retry).is_err());
    /// # Ok::<(), stormguard::policy::PolicyError>(())
    /// ```
    pub fn build(&self, clock: Clock) -> Result<Arc<dyn RetryBudget>, PolicyError> {
        let at = FieldPath::root("budget");
        self.validate(&at)?;
        let invalid = |e: InvalidBudget| at.invalid(e);
        Ok(match *self {
            BudgetSpec::Grpc {
                max_tokens,
                token_ratio,
            } => Arc::new(TokenBucket::grpc(max_tokens, token_ratio).map_err(invalid)?),
            BudgetSpec::SpendPerRetry {
                max_tokens,
                token_ratio,
            } => Arc::new(TokenBucket::spend_per_retry(max_tokens, token_ratio).map_err(invalid)?),
            BudgetSpec::AwsStandard => Arc::new(TokenBucket::aws_standard()),
            BudgetSpec::Ratio {
                retry_ratio,
                ttl,
                min_retries_per_sec,
            } => Arc::new(
                RatioBudget::new(retry_ratio, ttl, min_retries_per_sec, clock).map_err(invalid)?,
            ),
            BudgetSpec::Concurrency {
                budget_percent,
                min_retry_concurrency,
            } => Arc::new(
                ConcurrencyBudget::new(budget_percent, min_retry_concurrency).map_err(invalid)?,
            ),
        })
    }
}

fn check_fraction(at: FieldPath, value: f64, min: f64) -> Result<(), PolicyError> {
    if value.is_finite() && (min..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(at.invalid(format!("must be a finite number in {min}..=1, got {value}")))
    }
}
