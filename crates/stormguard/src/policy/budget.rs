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
#[serde(from = "RawBudget", into = "RawBudget")]
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
        ttl: Duration,
        /// Retries per second always allowed.
        min_retries_per_sec: u32,
    },
    /// Envoy: active retries up to a share of active requests.
    Concurrency {
        /// Percent of active requests, 0..=100.
        budget_percent: f64,
        /// Retries always allowed in flight.
        min_retry_concurrency: u32,
    },
}

fn default_min_retry_concurrency() -> u32 {
    3
}

/// The file's form of a [`BudgetSpec`]. serde lets extra fields through on a unit variant of
/// an internally tagged enum (`{ kind = "aws_standard", max_tokens = 5 }`), so the file
/// writes `aws_standard` as an empty struct variant, whose unknown fields are refused.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum RawBudget {
    Grpc {
        max_tokens: u32,
        token_ratio: f64,
    },
    SpendPerRetry {
        max_tokens: u32,
        token_ratio: f64,
    },
    AwsStandard {},
    Ratio {
        retry_ratio: f64,
        #[serde(with = "crate::duration::serde_duration")]
        ttl: Duration,
        #[serde(default)]
        min_retries_per_sec: u32,
    },
    Concurrency {
        budget_percent: f64,
        #[serde(default = "default_min_retry_concurrency")]
        min_retry_concurrency: u32,
    },
}

impl From<RawBudget> for BudgetSpec {
    fn from(raw: RawBudget) -> Self {
        match raw {
            RawBudget::Grpc {
                max_tokens,
                token_ratio,
            } => BudgetSpec::Grpc {
                max_tokens,
                token_ratio,
            },
            RawBudget::SpendPerRetry {
                max_tokens,
                token_ratio,
            } => BudgetSpec::SpendPerRetry {
                max_tokens,
                token_ratio,
            },
            RawBudget::AwsStandard {} => BudgetSpec::AwsStandard,
            RawBudget::Ratio {
                retry_ratio,
                ttl,
                min_retries_per_sec,
            } => BudgetSpec::Ratio {
                retry_ratio,
                ttl,
                min_retries_per_sec,
            },
            RawBudget::Concurrency {
                budget_percent,
                min_retry_concurrency,
            } => BudgetSpec::Concurrency {
                budget_percent,
                min_retry_concurrency,
            },
        }
    }
}

impl From<BudgetSpec> for RawBudget {
    fn from(spec: BudgetSpec) -> Self {
        match spec {
            BudgetSpec::Grpc {
                max_tokens,
                token_ratio,
            } => RawBudget::Grpc {
                max_tokens,
                token_ratio,
            },
            BudgetSpec::SpendPerRetry {
                max_tokens,
                token_ratio,
            } => RawBudget::SpendPerRetry {
                max_tokens,
                token_ratio,
            },
            BudgetSpec::AwsStandard => RawBudget::AwsStandard {},
            BudgetSpec::Ratio {
                retry_ratio,
                ttl,
                min_retries_per_sec,
            } => RawBudget::Ratio {
                retry_ratio,
                ttl,
                min_retries_per_sec,
            },
            BudgetSpec::Concurrency {
                budget_percent,
                min_retry_concurrency,
            } => RawBudget::Concurrency {
                budget_percent,
                min_retry_concurrency,
            },
        }
    }
}

impl BudgetSpec {
    /// Checks every number by building the budget (the constructors hold the one set of
    /// rules, shared with the CLI); `at` names the budget in errors.
    pub(crate) fn validate(&self, at: &FieldPath) -> Result<(), PolicyError> {
        self.make(Clock::system())
            .map(drop)
            .map_err(|e| invalid(at, e))
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
        self.make(clock)
            .map_err(|e| invalid(&FieldPath::root("budget"), e))
    }

    fn make(&self, clock: Clock) -> Result<Arc<dyn RetryBudget>, InvalidBudget> {
        Ok(match *self {
            BudgetSpec::Grpc {
                max_tokens,
                token_ratio,
            } => Arc::new(TokenBucket::grpc(max_tokens, token_ratio)?),
            BudgetSpec::SpendPerRetry {
                max_tokens,
                token_ratio,
            } => Arc::new(TokenBucket::spend_per_retry(max_tokens, token_ratio)?),
            BudgetSpec::AwsStandard => Arc::new(TokenBucket::aws_standard()),
            BudgetSpec::Ratio {
                retry_ratio,
                ttl,
                min_retries_per_sec,
            } => Arc::new(RatioBudget::new(
                retry_ratio,
                ttl,
                min_retries_per_sec,
                clock,
            )?),
            BudgetSpec::Concurrency {
                budget_percent,
                min_retry_concurrency,
            } => Arc::new(ConcurrencyBudget::new(
                budget_percent,
                min_retry_concurrency,
            )?),
        })
    }
}

/// A constructor's refusal, named by the field of the file it refuses.
fn invalid(at: &FieldPath, error: InvalidBudget) -> PolicyError {
    let field = match error {
        InvalidBudget::MaxTokens(_) => "max_tokens",
        InvalidBudget::TokenRatio(_) => "token_ratio",
        InvalidBudget::RetryRatio(_) => "retry_ratio",
        InvalidBudget::Ttl(_) => "ttl",
        InvalidBudget::BudgetPercent(_) => "budget_percent",
        InvalidBudget::MinRetriesPerSec(_) => "min_retries_per_sec",
        InvalidBudget::MinRetryConcurrency(_) => "min_retry_concurrency",
    };
    at.field(field).invalid(error)
}
