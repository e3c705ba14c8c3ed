//! The threshold token bucket of gRPC A6, the AWS SDK retry quota and the seeds' variant.
//!
//! All three are the same machine with different numbers: a bucket that starts full, loses
//! tokens on failures and/or retries, regains them on successes, and allows a retry only above
//! a threshold. Tokens are held as integer milli-tokens in one `AtomicU64`, so gRPC's three
//! decimals are exact (51 successes at ratio 0.1 from zero give 5.1 tokens, never 5.0999…).
//!
//! In the healthy steady state the bucket is full and a success is one relaxed load with no
//! write, so callers on different cores do not bounce its cache line.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{BudgetExhausted, InvalidBudget, RetryBudget, Withdrawal};

const MILLI: u64 = 1000;

/// The numbers that make a [`TokenBucket`], all in milli-tokens.
///
/// The presets ([`TokenBucket::grpc`], [`TokenBucket::aws_standard`],
/// [`TokenBucket::spend_per_retry`]) are the usual way to get one; this spec is for the rare
/// custom bucket and for reading back what a preset does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucketSpec {
    /// Capacity, and the starting balance.
    pub max: u64,
    /// Lost on every failed attempt (gRPC: 1000).
    pub failure_cost: u64,
    /// Spent by a retry or hedge (AWS: 5000; the seeds: 1000; gRPC: 0).
    pub retry_cost: u64,
    /// Spent by a retry after a timeout (AWS: 10 000).
    pub timeout_retry_cost: u64,
    /// Gained by a success (gRPC: the token ratio; AWS: 1000 for a first-attempt success).
    pub success_refund: u64,
    /// Whether a successful retry refunds what its withdrawal cost instead of
    /// `success_refund` (AWS: yes).
    pub refund_retry_cost: bool,
    /// A retry is allowed only while the balance is at least this (and at least its cost).
    pub min_balance: u64,
}

/// A threshold token bucket shared by every caller of one downstream.
///
/// # Example
///
/// ```
/// use stormguard::budget::{RetryBudget, TokenBucket, Withdrawal};
///
/// // gRPC A6 `retryThrottling: { maxTokens: 10, tokenRatio: 0.1 }`.
/// let bucket = TokenBucket::grpc(10, 0.1)?;
/// for _ in 0..5 {
///     bucket.record_failure();
/// }
/// // 5 tokens left: retries need more than maxTokens / 2.
/// assert!(bucket.withdraw(Withdrawal::Retry).is_err());
/// bucket.record_success(None);
/// assert!(bucket.withdraw(Withdrawal::Retry).is_ok());
/// # Ok::<(), stormguard::budget::InvalidBudget>(())
/// ```
#[derive(Debug)]
pub struct TokenBucket {
    balance: AtomicU64,
    spec: TokenBucketSpec,
}

impl TokenBucket {
    /// gRPC A6 `retryThrottling`: starts at `max_tokens` (1..=1000); every failed attempt
    /// loses 1 token, every success gains `token_ratio` (0.001..=1, see
    /// [`InvalidBudget::TokenRatio`]; three decimals kept, the rest dropped), and a retry or
    /// hedge is allowed only while tokens > `max_tokens` / 2.
    pub fn grpc(max_tokens: u32, token_ratio: f64) -> Result<Self, InvalidBudget> {
        let max = max_tokens_milli(max_tokens)?;
        Ok(TokenBucket::from_spec(TokenBucketSpec {
            max,
            failure_cost: MILLI,
            retry_cost: 0,
            timeout_retry_cost: 0,
            success_refund: ratio_milli(token_ratio)?,
            refund_retry_cost: false,
            min_balance: max / 2 + 1,
        }))
    }

    /// The AWS SDK "standard" retry quota: 500 tokens, a retry costs 5 and a retry after a
    /// timeout 10, a successful retry refunds its cost and a first-attempt success refunds 1;
    /// a retry is allowed while the balance covers its cost.
    pub fn aws_standard() -> Self {
        TokenBucket::from_spec(TokenBucketSpec {
            max: 500 * MILLI,
            failure_cost: 0,
            retry_cost: 5 * MILLI,
            timeout_retry_cost: 10 * MILLI,
            success_refund: MILLI,
            refund_retry_cost: true,
            min_balance: 0,
        })
    }

    /// The seeds' variant: a retry spends 1 token, a success refunds `token_ratio`
    /// (0.001..=1), and a retry is allowed while at least 1 token is left. Failures cost
    /// nothing by themselves.
    pub fn spend_per_retry(max_tokens: u32, token_ratio: f64) -> Result<Self, InvalidBudget> {
        Ok(TokenBucket::from_spec(TokenBucketSpec {
            max: max_tokens_milli(max_tokens)?,
            failure_cost: 0,
            retry_cost: MILLI,
            timeout_retry_cost: MILLI,
            success_refund: ratio_milli(token_ratio)?,
            refund_retry_cost: false,
            min_balance: MILLI,
        }))
    }

    /// A bucket with custom numbers; it starts full.
    pub const fn from_spec(spec: TokenBucketSpec) -> Self {
        TokenBucket {
            balance: AtomicU64::new(spec.max),
            spec,
        }
    }

    /// The numbers this bucket runs on.
    pub const fn spec(&self) -> &TokenBucketSpec {
        &self.spec
    }

    /// The balance in milli-tokens.
    pub fn milli_tokens(&self) -> u64 {
        self.balance.load(Ordering::Relaxed)
    }

    /// The balance in tokens.
    pub fn tokens(&self) -> f64 {
        self.milli_tokens() as f64 / MILLI as f64
    }

    #[inline]
    fn cost(&self, kind: Withdrawal) -> u64 {
        match kind {
            Withdrawal::TimeoutRetry => self.spec.timeout_retry_cost,
            Withdrawal::Retry | Withdrawal::Hedge => self.spec.retry_cost,
        }
    }

    #[inline]
    fn add(&self, amount: u64) {
        let max = self.spec.max;
        let mut current = self.balance.load(Ordering::Relaxed);
        // A full bucket (the healthy steady state) is left untouched: no write at all.
        while current < max {
            let next = current.saturating_add(amount).min(max);
            match self.balance.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }
}

impl RetryBudget for TokenBucket {
    #[inline]
    fn withdraw(&self, kind: Withdrawal) -> Result<(), BudgetExhausted> {
        let cost = self.cost(kind);
        let required = self.spec.min_balance.max(cost);
        let mut current = self.balance.load(Ordering::Relaxed);
        loop {
            if current < required {
                return Err(BudgetExhausted {
                    kind: "token bucket",
                });
            }
            if cost == 0 {
                return Ok(());
            }
            match self.balance.compare_exchange_weak(
                current,
                current - cost,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(seen) => current = seen,
            }
        }
    }

    #[inline]
    fn record_success(&self, after: Option<Withdrawal>) {
        let refund = match after {
            Some(kind) if self.spec.refund_retry_cost => self.cost(kind),
            _ => self.spec.success_refund,
        };
        if refund > 0 {
            self.add(refund);
        }
    }

    #[inline]
    fn record_failure(&self) {
        let cost = self.spec.failure_cost;
        if cost == 0 {
            return;
        }
        // fetch_update's closure always returns Some, so this cannot fail.
        let _ = self
            .balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(cost))
            });
    }
}

fn max_tokens_milli(max_tokens: u32) -> Result<u64, InvalidBudget> {
    if (1..=1000).contains(&max_tokens) {
        Ok(u64::from(max_tokens) * MILLI)
    } else {
        Err(InvalidBudget::MaxTokens(max_tokens))
    }
}

/// A token ratio in milli-tokens: three decimals kept, the rest dropped (a tiny epsilon keeps
/// 0.1 from becoming 0.0999… and then 99).
fn ratio_milli(ratio: f64) -> Result<u64, InvalidBudget> {
    if !ratio.is_finite() || !(0.001..=1.0).contains(&ratio) {
        return Err(InvalidBudget::TokenRatio(ratio));
    }
    Ok((ratio * MILLI as f64 + 1e-6).floor() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_rejects_out_of_range_numbers() {
        assert_eq!(
            TokenBucket::grpc(0, 0.1).err(),
            Some(InvalidBudget::MaxTokens(0))
        );
        assert_eq!(
            TokenBucket::grpc(1001, 0.1).err(),
            Some(InvalidBudget::MaxTokens(1001))
        );
        assert!(matches!(
            TokenBucket::grpc(10, f64::NAN),
            Err(InvalidBudget::TokenRatio(_))
        ));
        assert!(matches!(
            TokenBucket::grpc(10, 0.0009),
            Err(InvalidBudget::TokenRatio(_))
        ));
        assert!(matches!(
            TokenBucket::spend_per_retry(10, 5.0),
            Err(InvalidBudget::TokenRatio(_))
        ));
        assert!(TokenBucket::grpc(1000, 0.001).is_ok());
        assert!(TokenBucket::grpc(1, 1.0).is_ok());
    }

    #[test]
    fn ratio_keeps_exactly_three_decimals() {
        assert_eq!(ratio_milli(0.1), Ok(100));
        assert_eq!(ratio_milli(0.0015), Ok(1));
        assert_eq!(ratio_milli(0.2345), Ok(234));
        assert_eq!(ratio_milli(1.0), Ok(1000));
        assert_eq!(ratio_milli(0.3), Ok(300));
    }

    #[test]
    fn grpc_threshold_is_strictly_above_half() {
        let b = TokenBucket::grpc(10, 0.1).expect("valid");
        for _ in 0..4 {
            b.record_failure();
        }
        assert_eq!(b.tokens(), 6.0);
        assert!(b.withdraw(Withdrawal::Retry).is_ok());
        assert_eq!(b.tokens(), 6.0, "gRPC retries cost nothing by themselves");
        b.record_failure();
        assert!(
            b.withdraw(Withdrawal::Hedge).is_err(),
            "5 is not above 10/2"
        );
    }

    #[test]
    fn grpc_recovery_from_zero_needs_51_successes() {
        let b = TokenBucket::grpc(10, 0.1).expect("valid");
        for _ in 0..20 {
            b.record_failure();
        }
        assert_eq!(b.milli_tokens(), 0, "the balance never goes below zero");
        for _ in 0..50 {
            b.record_success(None);
        }
        assert_eq!(b.milli_tokens(), 5_000);
        assert!(b.withdraw(Withdrawal::Retry).is_err());
        b.record_success(None);
        assert!(b.withdraw(Withdrawal::Retry).is_ok());
    }

    #[test]
    fn full_bucket_stays_at_max() {
        let b = TokenBucket::grpc(3, 0.5).expect("valid");
        b.record_success(None);
        assert_eq!(b.milli_tokens(), 3_000);
        b.record_failure();
        b.record_success(None);
        b.record_success(None);
        assert_eq!(b.milli_tokens(), 3_000);
    }

    #[test]
    fn aws_quota_allows_exactly_100_retries_or_50_timeout_retries_in_an_outage() {
        let count = |kind| {
            let b = TokenBucket::aws_standard();
            let mut allowed = 0;
            for _ in 0..10_000 {
                b.record_failure();
                if b.withdraw(kind).is_ok() {
                    allowed += 1;
                }
            }
            allowed
        };
        assert_eq!(count(Withdrawal::Retry), 100);
        assert_eq!(count(Withdrawal::TimeoutRetry), 50);
    }

    #[test]
    fn aws_successful_retry_refunds_its_cost_and_first_success_refunds_one() {
        let b = TokenBucket::aws_standard();
        b.withdraw(Withdrawal::TimeoutRetry).expect("full bucket");
        assert_eq!(b.tokens(), 490.0);
        b.record_success(Some(Withdrawal::TimeoutRetry));
        assert_eq!(b.tokens(), 500.0);
        b.withdraw(Withdrawal::Retry).expect("full bucket");
        b.record_success(None);
        assert_eq!(b.tokens(), 496.0);
    }

    #[test]
    fn spend_per_retry_allows_while_at_least_one_token() {
        let b = TokenBucket::spend_per_retry(2, 0.5).expect("valid");
        assert!(b.withdraw(Withdrawal::Retry).is_ok());
        assert!(b.withdraw(Withdrawal::Retry).is_ok());
        assert!(b.withdraw(Withdrawal::Retry).is_err());
        b.record_failure();
        assert_eq!(b.milli_tokens(), 0, "failures cost nothing by themselves");
        b.record_success(None);
        assert!(b.withdraw(Withdrawal::Retry).is_err(), "0.5 < 1");
        b.record_success(None);
        assert!(b.withdraw(Withdrawal::Retry).is_ok());
    }

    #[test]
    fn concurrent_withdrawals_never_overdraw() {
        let b = std::sync::Arc::new(TokenBucket::spend_per_retry(1000, 0.1).expect("valid"));
        let granted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let b = &b;
                    s.spawn(move || {
                        (0..1_000)
                            .filter(|_| b.withdraw(Withdrawal::Retry).is_ok())
                            .count()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .sum()
        });
        assert_eq!(granted, 1000);
        assert_eq!(b.milli_tokens(), 0);
    }
}
