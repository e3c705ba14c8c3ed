//! The threshold token bucket of gRPC A6, the AWS SDK retry quota and the seeds' variant.
//!
//! All three are the same machine with different numbers: a bucket that starts full, loses
//! tokens on failures and/or retries, regains them on successes, and allows a retry only above
//! a threshold. Tokens are held as integer milli-tokens in one `AtomicI64`, so gRPC's three
//! decimals are exact (51 successes at ratio 0.1 from zero give 5.1 tokens, never 5.0999…).
//!
//! In the healthy steady state the bucket is full and a success is one relaxed load with no
//! write, so callers on different cores do not bounce its cache line. When it is not full,
//! every change is one `fetch_add`/`fetch_sub`, never a compare-and-swap loop: with callers on
//! several cores a failed compare-and-swap costs another trip of the cache line, and under
//! contention most of them fail. The price is that the balance may dip below zero, or rise
//! above `max`, for the few nanoseconds until the caller that overshot takes its excess back;
//! a withdrawal that sees such a dip is refused (the bucket errs on the strict side), and
//! [`TokenBucket::milli_tokens`] reports the balance clamped to `0..=max`.

use std::sync::atomic::{AtomicI64, Ordering};

use super::{BudgetExhausted, InvalidBudget, RetryBudget, Withdrawal};

const MILLI: u64 = 1000;
/// The largest number a [`TokenBucketSpec`] field means (2^40 milli-tokens, about a billion
/// tokens); larger ones are cut to it, so transient overshoots can never overflow the balance.
const LIMIT: u64 = 1 << 40;

/// `value` in the balance's units, cut to [`LIMIT`].
#[inline]
const fn milli(value: u64) -> i64 {
    (if value > LIMIT { LIMIT } else { value }) as i64
}

/// The numbers that make a [`TokenBucket`], all in milli-tokens.
///
/// The presets ([`TokenBucket::grpc`], [`TokenBucket::aws_standard`],
/// [`TokenBucket::spend_per_retry`]) are the usual way to get one; this spec is for the rare
/// custom bucket and for reading back what a preset does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucketSpec {
    /// Capacity, and the starting balance. Every field is cut to 2^40 (about a billion tokens).
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
    balance: AtomicI64,
    spec: TokenBucketSpec,
    /// The spec's numbers in the balance's units (cut to [`LIMIT`]), worked out once: every
    /// attempt's success reads `success_refund` and `max`, which then cost one load each.
    units: Units,
}

/// A [`TokenBucketSpec`]'s numbers as balance units.
#[derive(Debug)]
struct Units {
    max: i64,
    failure_cost: i64,
    retry_cost: i64,
    timeout_retry_cost: i64,
    success_refund: i64,
    min_balance: i64,
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
            balance: AtomicI64::new(milli(spec.max)),
            spec,
            units: Units {
                max: milli(spec.max),
                failure_cost: milli(spec.failure_cost),
                retry_cost: milli(spec.retry_cost),
                timeout_retry_cost: milli(spec.timeout_retry_cost),
                success_refund: milli(spec.success_refund),
                min_balance: milli(spec.min_balance),
            },
        }
    }

    /// The numbers this bucket runs on.
    pub const fn spec(&self) -> &TokenBucketSpec {
        &self.spec
    }

    /// The balance in milli-tokens.
    pub fn milli_tokens(&self) -> u64 {
        let balance = self
            .balance
            .load(Ordering::Relaxed)
            .clamp(0, self.units.max);
        balance as u64
    }

    /// The balance in tokens.
    pub fn tokens(&self) -> f64 {
        self.milli_tokens() as f64 / MILLI as f64
    }

    #[inline]
    fn cost(&self, kind: Withdrawal) -> i64 {
        match kind {
            Withdrawal::TimeoutRetry => self.units.timeout_retry_cost,
            Withdrawal::Retry | Withdrawal::Hedge => self.units.retry_cost,
        }
    }

    /// Adds `amount`, up to `max`.
    #[inline]
    fn add(&self, amount: i64) {
        let max = self.units.max;
        // A full bucket (the healthy steady state) is left untouched: no write at all.
        if self.balance.load(Ordering::Relaxed) >= max {
            return;
        }
        let before = self.balance.fetch_add(amount, Ordering::Relaxed);
        let excess = (before + amount - max).clamp(0, amount);
        if excess > 0 {
            // Only what this caller put above `max` is taken back, so concurrent changes
            // made between the two writes are all kept.
            self.balance.fetch_sub(excess, Ordering::Relaxed);
        }
    }
}

impl RetryBudget for TokenBucket {
    #[inline]
    fn withdraw(&self, kind: Withdrawal) -> Result<(), BudgetExhausted> {
        const REFUSED: BudgetExhausted = BudgetExhausted {
            kind: "token bucket",
        };
        let cost = self.cost(kind);
        let required = self.units.min_balance.max(cost);
        if self.balance.load(Ordering::Relaxed) < required {
            return Err(REFUSED);
        }
        if cost == 0 {
            return Ok(());
        }
        let before = self.balance.fetch_sub(cost, Ordering::Relaxed);
        if before < required {
            // Another caller got there first: give the tokens back.
            self.balance.fetch_add(cost, Ordering::Relaxed);
            return Err(REFUSED);
        }
        Ok(())
    }

    #[inline]
    fn record_success(&self, after: Option<Withdrawal>) {
        let refund = match after {
            Some(kind) if self.spec.refund_retry_cost => self.cost(kind),
            _ => self.units.success_refund,
        };
        if refund > 0 {
            self.add(refund);
        }
    }

    #[inline]
    fn record_failure(&self) {
        let cost = self.units.failure_cost;
        if cost == 0 {
            return;
        }
        // The balance never goes below zero: what this caller took below it goes back.
        let before = self.balance.fetch_sub(cost, Ordering::Relaxed);
        let below_zero = cost - before.clamp(0, cost);
        if below_zero > 0 {
            self.balance.fetch_add(below_zero, Ordering::Relaxed);
        }
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

    /// Runs `op` 10 000 times on each of 4 threads at once.
    fn hammer(op: impl Fn() + Sync) {
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..10_000).for_each(|_| op()));
            }
        });
    }

    #[test]
    fn concurrent_refunds_stop_exactly_at_max() {
        let b = TokenBucket::grpc(10, 0.5).expect("valid");
        b.record_failure();
        hammer(|| b.record_success(None));
        assert_eq!(
            b.balance.load(Ordering::Relaxed),
            10_000,
            "no overshoot left"
        );
    }

    #[test]
    fn concurrent_failures_stop_exactly_at_zero() {
        let b = TokenBucket::grpc(10, 0.5).expect("valid");
        hammer(|| b.record_failure());
        assert_eq!(
            b.balance.load(Ordering::Relaxed),
            0,
            "no dip below zero left"
        );
    }

    #[test]
    fn concurrent_mixed_traffic_ends_inside_the_bucket() {
        let b = TokenBucket::spend_per_retry(5, 0.3).expect("valid");
        hammer(|| {
            b.record_success(None);
            let _ = b.withdraw(Withdrawal::Retry);
            let _ = b.withdraw(Withdrawal::Retry);
        });
        let raw = b.balance.load(Ordering::Relaxed);
        assert!((0..=5_000).contains(&raw), "balance {raw} left the bucket");
    }

    #[test]
    fn oversized_spec_numbers_are_cut_not_wrapped() {
        let b = TokenBucket::from_spec(TokenBucketSpec {
            max: u64::MAX,
            failure_cost: u64::MAX,
            retry_cost: 1,
            timeout_retry_cost: 1,
            success_refund: u64::MAX,
            refund_retry_cost: false,
            min_balance: 0,
        });
        assert_eq!(b.milli_tokens(), LIMIT);
        b.record_failure();
        assert_eq!(b.milli_tokens(), 0);
        b.record_success(None);
        b.record_success(None);
        assert_eq!(b.milli_tokens(), LIMIT);
    }
}
