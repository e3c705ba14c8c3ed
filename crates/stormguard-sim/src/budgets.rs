//! The core's retry budgets by name, built with the simulator's virtual clock.
//!
//! Scenarios compare "no budget" with each kind of [`RetryBudget`] the core has. This module
//! only picks a constructor and its numbers; every allow/refuse decision is the core's.

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use stormguard::budget::{
    ConcurrencyBudget, InvalidBudget, RatioBudget, RetryBudget, TokenBucket, Unlimited,
};
use stormguard::clock::Clock;

/// A kind of retry budget, as named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BudgetKind {
    /// No budget: every retry the policy wants is sent ([`Unlimited`]).
    None,
    /// The seeds' token bucket ([`TokenBucket::spend_per_retry`]): a retry spends 1, a
    /// success refunds the token ratio, retries allowed while at least 1 token is left.
    Seeds,
    /// gRPC A6 `retryThrottling` ([`TokenBucket::grpc`]): a failure costs 1, a success
    /// refunds the ratio, retries allowed while tokens > max / 2.
    Grpc,
    /// The AWS SDK standard quota ([`TokenBucket::aws_standard`]).
    Aws,
    /// Finagle's ratio over a window ([`RatioBudget`]).
    Ratio,
    /// Envoy's share of in-flight requests ([`ConcurrencyBudget`]).
    Concurrency,
}

/// The numbers budgets are built with.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BudgetParams {
    /// Token buckets (seeds, gRPC): capacity.
    pub max_tokens: u32,
    /// Token buckets (seeds, gRPC): refund per success.
    pub token_ratio: f64,
    /// Ratio budget: retries as a fraction of requests (0.2 = 20 %).
    pub retry_ratio: f64,
    /// Ratio budget: window length.
    #[serde(with = "crate::report::seconds")]
    pub ttl: Duration,
    /// Ratio budget: retries per second always allowed.
    pub min_retries_per_sec: u32,
    /// Concurrency budget: active retries as a percentage of active requests (20.0 = 20 %).
    pub budget_percent: f64,
    /// Concurrency budget: active retries always allowed.
    pub min_retry_concurrency: u32,
}

impl Default for BudgetParams {
    /// The seeds' (10, 0.1) bucket; Finagle's 20 % over 10 s with 10/s in reserve; Envoy's
    /// 20 % with 3 in reserve.
    fn default() -> Self {
        BudgetParams {
            max_tokens: 10,
            token_ratio: 0.1,
            retry_ratio: 0.2,
            ttl: Duration::from_secs(10),
            min_retries_per_sec: 10,
            budget_percent: 20.0,
            min_retry_concurrency: 3,
        }
    }
}

impl BudgetParams {
    /// Checks every number with the core's rules, whichever kinds will be built: each kind's
    /// constructor is the one place a rule lives, for the policy file and the command line
    /// alike. The error names the flag.
    ///
    /// ```
    /// use stormguard_sim::budgets::BudgetParams;
    ///
    /// let percent_for_fraction = BudgetParams { token_ratio: 5.0, ..BudgetParams::default() };
    /// assert_eq!(percent_for_fraction.validate().unwrap_err().flag, "token-ratio");
    /// ```
    pub fn validate(&self) -> Result<(), crate::error::InvalidParam> {
        let clock = crate::vclock::VirtualClock::new();
        for kind in BudgetKind::ALL {
            kind.build(self, clock.clock())
                .map_err(|e| invalid_budget(&e))?;
        }
        Ok(())
    }
}

impl BudgetKind {
    /// Every kind, in table order.
    pub const ALL: [BudgetKind; 6] = [
        BudgetKind::None,
        BudgetKind::Seeds,
        BudgetKind::Grpc,
        BudgetKind::Aws,
        BudgetKind::Ratio,
        BudgetKind::Concurrency,
    ];

    /// The command-line name.
    pub const fn name(self) -> &'static str {
        match self {
            BudgetKind::None => "none",
            BudgetKind::Seeds => "seeds",
            BudgetKind::Grpc => "grpc",
            BudgetKind::Aws => "aws",
            BudgetKind::Ratio => "ratio",
            BudgetKind::Concurrency => "concurrency",
        }
    }

    /// A label for tables.
    pub const fn label(self) -> &'static str {
        match self {
            BudgetKind::None => "no budget",
            BudgetKind::Seeds => "seeds' bucket",
            BudgetKind::Grpc => "gRPC A6 bucket",
            BudgetKind::Aws => "AWS quota",
            BudgetKind::Ratio => "ratio (Finagle)",
            BudgetKind::Concurrency => "concurrency (Envoy)",
        }
    }

    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<BudgetKind> {
        BudgetKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Builds the budget; `clock` is read by the ratio budget only.
    ///
    /// ```
    /// use stormguard::budget::Withdrawal;
    /// use stormguard_sim::budgets::{BudgetKind, BudgetParams};
    /// use stormguard_sim::vclock::VirtualClock;
    ///
    /// let vc = VirtualClock::new();
    /// let bucket = BudgetKind::Grpc.build(&BudgetParams::default(), vc.clock())?;
    /// for _ in 0..5 {
    ///     bucket.record_failure();
    /// }
    /// assert!(bucket.withdraw(Withdrawal::Retry).is_err());
    /// # Ok::<(), stormguard::budget::InvalidBudget>(())
    /// ```
    pub fn build(
        self,
        p: &BudgetParams,
        clock: Clock,
    ) -> Result<Box<dyn RetryBudget>, InvalidBudget> {
        Ok(match self {
            BudgetKind::None => Box::new(Unlimited),
            BudgetKind::Seeds => {
                Box::new(TokenBucket::spend_per_retry(p.max_tokens, p.token_ratio)?)
            }
            BudgetKind::Grpc => Box::new(TokenBucket::grpc(p.max_tokens, p.token_ratio)?),
            BudgetKind::Aws => Box::new(TokenBucket::aws_standard()),
            BudgetKind::Ratio => Box::new(RatioBudget::new(
                p.retry_ratio,
                p.ttl,
                p.min_retries_per_sec,
                clock,
            )?),
            BudgetKind::Concurrency => Box::new(ConcurrencyBudget::new(
                p.budget_percent,
                p.min_retry_concurrency,
            )?),
        })
    }
}

impl fmt::Display for BudgetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Maps a core budget refusal to the flag that set the refused number.
pub(crate) fn invalid_budget(e: &InvalidBudget) -> crate::error::InvalidParam {
    let flag = match e {
        InvalidBudget::MaxTokens(_) => "max-tokens",
        InvalidBudget::TokenRatio(_) => "token-ratio",
        InvalidBudget::RetryRatio(_) => "retry-ratio",
        InvalidBudget::Ttl(_) => "ttl",
        InvalidBudget::BudgetPercent(_) => "budget-percent",
        InvalidBudget::MinRetriesPerSec(_) => "min-retries-per-sec",
        InvalidBudget::MinRetryConcurrency(_) => "min-retry-concurrency",
    };
    crate::error::InvalidParam::new(flag, e.to_string())
}
