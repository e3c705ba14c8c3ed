//! Retry budgets: retries allowed in proportion to how well the downstream is doing.
//!
//! # Why budgets and not just a maximum number of attempts?
//!
//! `max_attempts = 3` multiplies traffic by three exactly when the downstream is failing, and
//! three layers that each do so multiply it by 27. The failures that retries cannot fix —
//! overload, an outage — are the ones where every caller fails at once, so the retries all
//! arrive together. A budget ties the number of retries to the number of *successes* (or of
//! requests), shared by every caller of one downstream: when success drops, retries shrink
//! automatically, and nobody has to notice the outage first.
//!
//! Three kinds exist in the field; each is one implementation of [`RetryBudget`]:
//!
//! | kind | anchor | rule |
//! | --- | --- | --- |
//! | [`TokenBucket`] | gRPC A6 `retryThrottling`, AWS SDK standard quota | tokens lost on failure or spent on retries, refunded on success |
//! | [`RatioBudget`] | Finagle, Linkerd, tower `TpsBudget` | retries ≤ percent of requests over a time window, plus a reserve |
//! | [`ConcurrencyBudget`] | Envoy `retry_budget` | active retries ≤ percent of active requests |
//!
//! All of them are lock-free (atomics only), `Send + Sync`, and meant to be shared (in an
//! [`Arc`]) by every caller of one downstream.
//!
//! # The protocol
//!
//! The retrier drives a budget through one logical request like this:
//!
//! 1. [`request_started`](RetryBudget::request_started) once (ratio budgets deposit here,
//!    concurrency budgets count the request as active) — use a [`RequestGuard`] so that
//!    [`request_finished`](RetryBudget::request_finished) runs even if the caller is cancelled;
//! 2. after every attempt, [`record_success`](RetryBudget::record_success) or
//!    [`record_failure`](RetryBudget::record_failure) (only failures that retrying could fix
//!    are recorded; a deterministic 404 says nothing about the downstream's health);
//! 3. before every retry or hedge, [`withdraw`](RetryBudget::withdraw); an `Ok` must be paired
//!    with [`retry_finished`](RetryBudget::retry_finished) when that attempt ends
//!    ([`RetryGuard`] does it on drop).

mod concurrency;
mod ratio;
mod token_bucket;

pub use concurrency::ConcurrencyBudget;
pub use ratio::RatioBudget;
pub use token_bucket::{TokenBucket, TokenBucketSpec};

use std::sync::Arc;

/// What a withdrawal pays for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Withdrawal {
    /// A retry after an ordinary failure.
    Retry,
    /// A retry after a timeout (the AWS quota charges these double).
    TimeoutRetry,
    /// A hedged attempt sent while an earlier one is still running.
    Hedge,
}

/// A retry budget shared by every caller of one downstream.
///
/// See the [module documentation](self) for the order in which the methods are called.
pub trait RetryBudget: Send + Sync {
    /// A logical request starts (its first attempt is about to be sent).
    fn request_started(&self) {}

    /// The logical request ended, whatever its outcome.
    fn request_finished(&self) {}

    /// Asks to send a retry or a hedge. `Err` means the budget refuses.
    fn withdraw(&self, kind: Withdrawal) -> Result<(), BudgetExhausted>;

    /// The retry or hedge paid for by a successful [`withdraw`](RetryBudget::withdraw) ended.
    fn retry_finished(&self) {}

    /// An attempt succeeded. `after` is the withdrawal that paid for it, `None` for a first
    /// attempt.
    fn record_success(&self, after: Option<Withdrawal>);

    /// An attempt failed in a way that retrying could fix (retryable, overloaded or in doubt).
    fn record_failure(&self);
}

/// The budget refused a retry or hedge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("retry budget exhausted: {kind}")]
pub struct BudgetExhausted {
    /// Which kind of budget refused.
    pub kind: &'static str,
}

/// Why a budget's parameters were refused.
///
/// These are the rules of every way a budget is configured — a policy file, the
/// `stormguard` command line, code — because each of them builds the budget with these
/// constructors. Each variant is named after the field it refuses (the policy file's name for
/// it; the command line spells it with dashes).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InvalidBudget {
    /// gRPC A6 requires `maxTokens` in 1..=1000.
    #[error("max_tokens must be in 1..=1000, got {0}")]
    MaxTokens(u32),
    /// A token ratio must be a finite number in 0.001..=1 (three decimals are kept).
    ///
    /// gRPC A6 sets no upper bound; this crate does. A bucket that loses 1 per failure and
    /// gains `r` per success drains only while more than `r / (1 + r)` of the attempts fail:
    /// half of them at `r = 1`, five in six at `r = 5`. Above 1 the budget would stay full
    /// through most of the outages it exists for, which is almost always a mistake (a percent
    /// written where a fraction belongs).
    #[error("token_ratio must be a finite number in 0.001..=1, got {0}")]
    TokenRatio(f64),
    /// A retry ratio (retries per request, a fraction) must be a finite number in 0..=1.
    ///
    /// Finagle accepts up to 1000; this crate stops at 1 (as many retries as requests, twice
    /// the load in an outage), beyond which the budget no longer bounds what it is for, and a
    /// value such as `20` is a percent written where a fraction belongs.
    #[error("retry_ratio must be a finite number in 0..=1, got {0}")]
    RetryRatio(f64),
    /// The ratio window must last from 1 to 60 seconds.
    #[error("ttl must be between 1 s and 60 s, got {0:?}")]
    Ttl(std::time::Duration),
    /// A concurrency budget percent (a percentage: 20.0 is 20 %) must be a finite number in
    /// 0..=100.
    #[error("budget_percent must be a finite number in 0..=100, got {0}")]
    BudgetPercent(f64),
    /// A ratio budget's reserve, `min_retries_per_sec`, must be at most
    /// [`MAX_RESERVE`](InvalidBudget::MAX_RESERVE) (Finagle's default is 10).
    ///
    /// A reserve is for the quiet hours when too few requests arrive to earn retries; a reserve
    /// larger than any downstream's request rate means the budget never refuses anything, which
    /// is a budget switched off while it looks switched on.
    #[error("min_retries_per_sec must be at most 1000, got {0}")]
    MinRetriesPerSec(u32),
    /// A concurrency budget's floor, `min_retry_concurrency`, must be at most
    /// [`MAX_RESERVE`](InvalidBudget::MAX_RESERVE) (Envoy's default is 3), for the reason
    /// given at [`InvalidBudget::MinRetriesPerSec`].
    #[error("min_retry_concurrency must be at most 1000, got {0}")]
    MinRetryConcurrency(u32),
}

impl InvalidBudget {
    /// The largest reserve a budget accepts: `min_retries_per_sec` and
    /// `min_retry_concurrency`.
    pub const MAX_RESERVE: u32 = 1000;
}

/// No budget at all: every retry is allowed. The default of a retrier, and the baseline the
/// simulator compares budgets against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unlimited;

impl RetryBudget for Unlimited {
    #[inline]
    fn withdraw(&self, _: Withdrawal) -> Result<(), BudgetExhausted> {
        Ok(())
    }
    #[inline]
    fn record_success(&self, _: Option<Withdrawal>) {}
    #[inline]
    fn record_failure(&self) {}
}

macro_rules! forward_budget {
    ($($ty:ty),*) => {$(
        impl<B: RetryBudget + ?Sized> RetryBudget for $ty {
            #[inline]
            fn request_started(&self) {
                (**self).request_started()
            }
            #[inline]
            fn request_finished(&self) {
                (**self).request_finished()
            }
            #[inline]
            fn withdraw(&self, kind: Withdrawal) -> Result<(), BudgetExhausted> {
                (**self).withdraw(kind)
            }
            #[inline]
            fn retry_finished(&self) {
                (**self).retry_finished()
            }
            #[inline]
            fn record_success(&self, after: Option<Withdrawal>) {
                (**self).record_success(after)
            }
            #[inline]
            fn record_failure(&self) {
                (**self).record_failure()
            }
        }
    )*};
}

forward_budget!(&B, Arc<B>, Box<B>);

/// Calls [`RetryBudget::request_started`] now and [`RetryBudget::request_finished`] on drop.
#[derive(Debug)]
pub struct RequestGuard<'a, B: RetryBudget + ?Sized> {
    budget: &'a B,
}

impl<'a, B: RetryBudget + ?Sized> RequestGuard<'a, B> {
    /// Starts a logical request on `budget`.
    #[inline]
    pub fn new(budget: &'a B) -> Self {
        budget.request_started();
        RequestGuard { budget }
    }

    /// The budget, whose [`request_finished`](RetryBudget::request_finished) is now the
    /// caller's to call (a [`RetryRun`](crate::retry::RetryRun) taking the request over
    /// calls it when dropped).
    #[inline]
    pub(crate) fn into_budget(self) -> &'a B {
        let budget = self.budget;
        std::mem::forget(self);
        budget
    }

    /// The request's first attempt succeeded: tells the budget what a
    /// [`RetryRun`](crate::retry::RetryRun) would have (a success that cost no retry), so an
    /// executor that builds a run only after a failed first attempt keeps the budget's
    /// accounting the same. Dropping the guard then ends the request.
    #[inline]
    pub fn first_attempt_succeeded(&self) {
        self.budget.record_success(None);
    }
}

impl<B: RetryBudget + ?Sized> Drop for RequestGuard<'_, B> {
    #[inline]
    fn drop(&mut self) {
        self.budget.request_finished();
    }
}

/// A granted withdrawal; calls [`RetryBudget::retry_finished`] on drop.
#[derive(Debug)]
pub struct RetryGuard<'a, B: RetryBudget + ?Sized> {
    budget: &'a B,
    kind: Withdrawal,
}

impl<'a, B: RetryBudget + ?Sized> RetryGuard<'a, B> {
    /// Withdraws from `budget`; the guard releases the retry when dropped.
    pub fn withdraw(budget: &'a B, kind: Withdrawal) -> Result<Self, BudgetExhausted> {
        budget.withdraw(kind)?;
        Ok(RetryGuard { budget, kind })
    }

    /// What this withdrawal paid for.
    pub fn kind(&self) -> Withdrawal {
        self.kind
    }
}

impl<B: RetryBudget + ?Sized> Drop for RetryGuard<'_, B> {
    fn drop(&mut self) {
        self.budget.retry_finished();
    }
}
