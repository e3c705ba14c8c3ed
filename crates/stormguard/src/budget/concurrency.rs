//! Envoy's retry budget: retries in flight may be a share of the requests in flight.
//!
//! Envoy's `retry_budget` bounds *concurrency* rather than a rate: at any moment the active
//! retries may be at most `budget_percent` of the active requests, and at least
//! `min_retry_concurrency` are always allowed. It needs no clock and reacts instantly: when a
//! downstream slows down, requests pile up, and the share of retries stays bounded.
//!
//! Counting here: a logical request is active from [`RetryBudget::request_started`] to
//! [`RetryBudget::request_finished`]; a retry or hedge is active from a successful
//! [`RetryBudget::withdraw`] to [`RetryBudget::retry_finished`]. Use
//! [`RequestGuard`](super::RequestGuard) and [`RetryGuard`](super::RetryGuard) so both are
//! released on drop, even when the caller is cancelled.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{BudgetExhausted, InvalidBudget, RetryBudget, Withdrawal};

/// A retry budget bounding the share of in-flight requests that are retries.
///
/// # Default
///
/// [`ConcurrencyBudget::envoy_default`]: 20 % of active requests, at least 3 retries.
///
/// # Example
///
/// ```
/// use stormguard::budget::{ConcurrencyBudget, RequestGuard, RetryGuard, Withdrawal};
///
/// let budget = ConcurrencyBudget::envoy_default();
/// let _request = RequestGuard::new(&budget);
/// let retries: Vec<_> = (0..5)
///     .filter_map(|_| RetryGuard::withdraw(&budget, Withdrawal::Retry).ok())
///     .collect();
/// assert_eq!(retries.len(), 3, "min_retry_concurrency");
/// drop(retries);
/// assert_eq!(budget.active_retries(), 0);
/// ```
#[derive(Debug)]
pub struct ConcurrencyBudget {
    active_requests: AtomicU64,
    active_retries: AtomicU64,
    /// budget_percent in hundredths of a percent (basis points of 10 000).
    share_basis_points: u64,
    min_retry_concurrency: u64,
}

impl ConcurrencyBudget {
    /// Active retries may be `budget_percent` (0.0..=100.0) of active requests, and at least
    /// `min_retry_concurrency` (at most [`InvalidBudget::MAX_RESERVE`]).
    pub fn new(budget_percent: f64, min_retry_concurrency: u32) -> Result<Self, InvalidBudget> {
        if !budget_percent.is_finite() || !(0.0..=100.0).contains(&budget_percent) {
            return Err(InvalidBudget::BudgetPercent(budget_percent));
        }
        if min_retry_concurrency > InvalidBudget::MAX_RESERVE {
            return Err(InvalidBudget::MinRetryConcurrency(min_retry_concurrency));
        }
        Ok(ConcurrencyBudget {
            active_requests: AtomicU64::new(0),
            active_retries: AtomicU64::new(0),
            share_basis_points: (budget_percent * 100.0).round() as u64,
            min_retry_concurrency: u64::from(min_retry_concurrency),
        })
    }

    /// Envoy's defaults: 20 % with `min_retry_concurrency` 3.
    pub fn envoy_default() -> Self {
        ConcurrencyBudget::new(20.0, 3).unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }

    /// Logical requests in flight.
    pub fn active_requests(&self) -> u64 {
        self.active_requests.load(Ordering::Relaxed)
    }

    /// Retries and hedges in flight.
    pub fn active_retries(&self) -> u64 {
        self.active_retries.load(Ordering::Relaxed)
    }

    fn limit(&self) -> u64 {
        let share = self.active_requests() * self.share_basis_points / 10_000;
        share.max(self.min_retry_concurrency)
    }
}

impl RetryBudget for ConcurrencyBudget {
    fn request_started(&self) {
        self.active_requests.fetch_add(1, Ordering::Relaxed);
    }

    fn request_finished(&self) {
        // Saturating: an unpaired call must not wrap the count around.
        let _ = self
            .active_requests
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    fn withdraw(&self, _: Withdrawal) -> Result<(), BudgetExhausted> {
        let limit = self.limit();
        self.active_retries
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |active| {
                (active < limit).then_some(active + 1)
            })
            .map(|_| ())
            .map_err(|_| BudgetExhausted {
                kind: "concurrency budget",
            })
    }

    fn retry_finished(&self) {
        let _ = self
            .active_retries
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    #[inline]
    fn record_success(&self, _: Option<Withdrawal>) {}

    #[inline]
    fn record_failure(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{RequestGuard, RetryGuard};

    #[test]
    fn share_of_active_requests_bounds_active_retries() {
        let budget = ConcurrencyBudget::new(20.0, 3).expect("valid");
        let requests: Vec<_> = (0..100).map(|_| RequestGuard::new(&budget)).collect();
        let retries: Vec<_> = (0..50)
            .filter_map(|_| RetryGuard::withdraw(&budget, Withdrawal::Retry).ok())
            .collect();
        assert_eq!(retries.len(), 20);
        drop(retries);
        drop(requests);
        assert_eq!(budget.active_requests(), 0);
        assert_eq!(budget.active_retries(), 0);
    }

    #[test]
    fn min_retry_concurrency_applies_with_few_requests() {
        let budget = ConcurrencyBudget::new(20.0, 3).expect("valid");
        let _one = RequestGuard::new(&budget);
        let granted: Vec<_> = (0..10)
            .filter_map(|_| RetryGuard::withdraw(&budget, Withdrawal::Hedge).ok())
            .collect();
        assert_eq!(granted.len(), 3);
    }

    #[test]
    fn rejects_out_of_range_percent() {
        assert!(ConcurrencyBudget::new(100.5, 3).is_err());
        assert!(ConcurrencyBudget::new(f64::INFINITY, 3).is_err());
        assert!(ConcurrencyBudget::new(-1.0, 3).is_err());
    }

    #[test]
    fn concurrent_use_never_exceeds_the_limit() {
        let budget = ConcurrencyBudget::new(10.0, 0).expect("valid");
        let _requests: Vec<_> = (0..100).map(|_| RequestGuard::new(&budget)).collect();
        let peak = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        if let Ok(guard) = RetryGuard::withdraw(&budget, Withdrawal::Retry) {
                            peak.fetch_max(budget.active_retries(), Ordering::Relaxed);
                            drop(guard);
                        }
                    }
                });
            }
        });
        assert!(peak.load(Ordering::Relaxed) <= 10);
        assert_eq!(budget.active_retries(), 0);
    }
}
