//! Finagle's and Linkerd's retry budget: retries may be a percentage of recent requests.
//!
//! Every request deposits `percent` of a retry; every retry withdraws a whole one; both expire
//! after `ttl`. On top of that a reserve of `min_retries_per_sec · ttl` retries is always
//! available, so a service with little traffic can still retry at all. With the defaults (20 %
//! over 10 s, 10 retries per second) a downstream that fails everything gets at most 20 % more
//! traffic plus 10 retries per second, however many attempts each call is configured for.
//!
//! Units are milli-retries, so any percent with up to three decimals is exact, like gRPC's
//! token ratio. (tower's `TpsBudget` turns `retry_percent = 0.6` into a withdraw amount of
//! `(1 / 0.6) as isize = 1`, i.e. 100 % — tower issue #857. Here 0.6 is 600 milli-retries per
//! request: 60 %.)
//!
//! # The window
//!
//! The ttl is split into ten slots of one period each, plus a running total of the live
//! slots. A decision reads the total — one load — instead of summing the slots. When the clock
//! enters a new period, the first caller to notice advances the window and sweeps the expired
//! slots out of the total. A withdrawal subtracts from the total first and refunds if that
//! left it below zero, so concurrent withdrawals cannot overspend. Time comes from
//! [`CoarseMillis`], one relaxed load on the system clock.
//!
//! Deposits are batched per thread (see the `local` module): a deposit is a thread-local
//! increment, and the shared window is written once per 32 requests per thread. Deposits still
//! in other threads' batches are not visible yet, which can only make the budget stricter.
//!
//! At a period boundary a deposit or withdrawal racing the sweep may be counted in the next
//! period (it then expires one period late) or dropped; the window stays consistent, and the
//! error is at most one batch per thread.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use super::{BudgetExhausted, InvalidBudget, RetryBudget, Withdrawal};
use crate::clock::{Clock, CoarseMillis};

mod local;

const SLOTS: u64 = 10;
/// One retry, in budget units (milli-retries).
const RETRY_UNITS: i64 = 1_000;

/// A retry budget over a sliding time window, shared by every caller of one downstream.
///
/// # Default
///
/// [`RatioBudget::finagle_default`]: 20 % over 10 s, with 10 retries per second in reserve.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use stormguard::budget::{RatioBudget, RetryBudget, Withdrawal};
/// use stormguard::clock::ManualClock;
///
/// let clock = ManualClock::new();
/// // 60 % of requests, no reserve.
/// let budget = RatioBudget::new(0.6, Duration::from_secs(10), 0, clock.clock())?;
/// for _ in 0..10 {
///     budget.request_started();
/// }
/// let allowed = (0..10).filter(|_| budget.withdraw(Withdrawal::Retry).is_ok()).count();
/// assert_eq!(allowed, 6);
/// # Ok::<(), stormguard::budget::InvalidBudget>(())
/// ```
#[derive(Debug)]
pub struct RatioBudget {
    window: Window,
    /// ⌈2^64 / period in ms⌉: `millis / period` as a multiply, exact below 2^40 ms.
    period_reciprocal: u64,
    id: u64,
    deposit: i64,
    reserve: i64,
    millis: CoarseMillis,
}

/// The shared state. The period, read by every decision and written once per period, has a
/// cache line of its own, so that writes to the total do not evict it from other cores.
#[derive(Debug)]
struct Window {
    /// The latest period the window has been advanced to.
    period: CacheLine<AtomicU64>,
    /// Sum of `slots`.
    total: CacheLine<AtomicI64>,
    /// Balance of period `p` at index `p % SLOTS`, for the last `SLOTS` periods.
    slots: [AtomicI64; SLOTS as usize],
}

/// A value alone on its cache line (128 bytes: adjacent-line prefetchers pair lines).
#[derive(Debug)]
#[repr(align(128))]
struct CacheLine<T>(T);

impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl RatioBudget {
    /// A budget allowing retries up to `retry_ratio` (a fraction: 0.2 is 20 %; 0..=1, see
    /// [`InvalidBudget::RetryRatio`]) of the requests seen over `ttl` (1..=60 s), plus
    /// `min_retries_per_sec · ttl` in reserve.
    pub fn new(
        retry_ratio: f64,
        ttl: Duration,
        min_retries_per_sec: u32,
        clock: Clock,
    ) -> Result<Self, InvalidBudget> {
        if !retry_ratio.is_finite() || !(0.0..=1.0).contains(&retry_ratio) {
            return Err(InvalidBudget::RetryRatio(retry_ratio));
        }
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
            return Err(InvalidBudget::Ttl(ttl));
        }
        if min_retries_per_sec > InvalidBudget::MAX_RESERVE {
            return Err(InvalidBudget::MinRetriesPerSec(min_retries_per_sec));
        }
        let ttl_millis = u64::try_from(ttl.as_millis()).unwrap_or(60_000);
        let reserve_retries =
            (u128::from(min_retries_per_sec) * u128::from(ttl_millis)).div_ceil(1000);
        Ok(RatioBudget {
            window: Window {
                period: CacheLine(AtomicU64::new(0)),
                total: CacheLine(AtomicI64::new(0)),
                slots: std::array::from_fn(|_| AtomicI64::new(0)),
            },
            period_reciprocal: u64::MAX / (ttl_millis / SLOTS).max(1) + 1,
            id: local::next_budget_id(),
            deposit: (retry_ratio * RETRY_UNITS as f64).round() as i64,
            reserve: i64::try_from(reserve_retries)
                .unwrap_or(i64::MAX / RETRY_UNITS)
                .saturating_mul(RETRY_UNITS),
            millis: CoarseMillis::new(clock),
        })
    }

    /// Finagle's defaults: 20 % over 10 s with 10 retries per second in reserve.
    pub fn finagle_default(clock: Clock) -> Self {
        RatioBudget::new(0.2, Duration::from_secs(10), 10, clock)
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }

    /// How many retries the budget would allow right now (reserve included).
    pub fn available(&self) -> f64 {
        let period = self.current_period();
        self.balance(period, self.window.total.load(Ordering::Acquire)) as f64 / RETRY_UNITS as f64
    }

    /// The current period, with the window advanced to it.
    #[inline]
    fn current_period(&self) -> u64 {
        let millis = u128::from(self.millis.now());
        let period = ((millis * u128::from(self.period_reciprocal)) >> 64) as u64;
        if period > self.window.period.load(Ordering::Acquire) {
            self.advance(period);
        }
        period
    }

    /// Moves the window to `to`, sweeping the periods that left it out of the total.
    #[cold]
    fn advance(&self, to: u64) {
        let mut seen = self.window.period.load(Ordering::Acquire);
        while seen < to {
            match self.window.period.compare_exchange_weak(
                seen,
                to,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    // Periods seen+1..=to reuse the slots of the periods that expired.
                    let first = to - (to - seen).min(SLOTS) + 1;
                    for period in first..=to {
                        let expired = self.slot(period).swap(0, Ordering::AcqRel);
                        if expired != 0 {
                            self.window.total.fetch_sub(expired, Ordering::AcqRel);
                        }
                    }
                    return;
                }
                Err(now) => seen = now,
            }
        }
    }

    fn slot(&self, period: u64) -> &AtomicI64 {
        &self.window.slots[(period % SLOTS) as usize]
    }

    fn add(&self, period: u64, delta: i64) {
        self.slot(period).fetch_add(delta, Ordering::AcqRel);
        self.window.total.fetch_add(delta, Ordering::AcqRel);
    }

    /// What a withdrawal may spend given the window's `total`: that, this thread's unflushed
    /// deposits and the reserve.
    #[inline]
    fn balance(&self, period: u64, total: i64) -> i64 {
        let own_batch = match local::pending(self.id) {
            Some((batch_period, count)) if is_live(period, batch_period) => {
                i64::from(count) * self.deposit
            }
            _ => 0,
        };
        total + own_batch + self.reserve
    }
}

impl Drop for RatioBudget {
    fn drop(&mut self) {
        local::forget(self.id);
    }
}

/// Whether deposits made in `earlier` still count in `period`'s window.
#[inline]
fn is_live(period: u64, earlier: u64) -> bool {
    period.checked_sub(earlier).is_some_and(|age| age < SLOTS)
}

impl RetryBudget for RatioBudget {
    #[inline]
    fn request_started(&self) {
        if self.deposit == 0 {
            return;
        }
        let period = self.current_period();
        if let Some(flush) = local::deposit(self.id, period) {
            if is_live(period, flush.period) {
                self.add(flush.period, i64::from(flush.count) * self.deposit);
            }
        }
    }

    #[inline]
    fn withdraw(&self, _: Withdrawal) -> Result<(), BudgetExhausted> {
        const REFUSED: BudgetExhausted = BudgetExhausted {
            kind: "ratio budget",
        };
        let period = self.current_period();
        let total = &self.window.total;
        if self.balance(period, total.load(Ordering::Acquire)) < RETRY_UNITS {
            return Err(REFUSED);
        }
        let before = total.fetch_sub(RETRY_UNITS, Ordering::AcqRel);
        if self.balance(period, before) < RETRY_UNITS {
            total.fetch_add(RETRY_UNITS, Ordering::AcqRel);
            return Err(REFUSED);
        }
        self.slot(period).fetch_sub(RETRY_UNITS, Ordering::AcqRel);
        Ok(())
    }

    #[inline]
    fn record_success(&self, _: Option<Withdrawal>) {}

    #[inline]
    fn record_failure(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn budget(percent: f64, min_per_sec: u32) -> (RatioBudget, ManualClock) {
        let clock = ManualClock::new();
        let b = RatioBudget::new(percent, Duration::from_secs(10), min_per_sec, clock.clock())
            .expect("valid");
        (b, clock)
    }

    fn retries_allowed(b: &RatioBudget, max: usize) -> usize {
        (0..max)
            .filter(|_| b.withdraw(Withdrawal::Retry).is_ok())
            .count()
    }

    #[test]
    fn reciprocal_epoch_matches_division() {
        for width in [100u64, 101, 333, 999, 1000, 4096, 6000] {
            let reciprocal = u64::MAX / width + 1;
            let mut millis = vec![0, 1, width - 1, width, width + 1, (1 << 40) - 1];
            millis.extend((1..5000).map(|k| k * width - 1));
            millis.extend((1..5000).map(|k| k * 7919 % (1 << 40)));
            for m in millis {
                let fast = ((u128::from(m) * u128::from(reciprocal)) >> 64) as u64;
                assert_eq!(fast, m / width, "{m} / {width}");
            }
        }
    }

    #[test]
    fn other_threads_batches_only_make_the_budget_stricter() {
        let (b, _) = budget(1.0, 0);
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..(2 * local::DEPOSIT_BATCH + 5) {
                    b.request_started();
                }
            });
        });
        // The other thread flushed two full batches; its last 5 deposits are not visible.
        assert_eq!(b.available(), f64::from(2 * local::DEPOSIT_BATCH));
        // This thread's own batch is visible to itself at once.
        b.request_started();
        assert_eq!(b.available(), f64::from(2 * local::DEPOSIT_BATCH + 1));
    }

    #[test]
    fn many_budgets_on_one_thread_lose_no_deposit() {
        let clock = ManualClock::new();
        let budgets: Vec<_> = (0..7)
            .map(|_| {
                RatioBudget::new(1.0, Duration::from_secs(10), 0, clock.clock()).expect("valid")
            })
            .collect();
        for _ in 0..10 {
            for b in &budgets {
                b.request_started();
            }
        }
        for b in &budgets {
            assert_eq!(b.available(), 10.0);
        }
        // Budgets dropped on this thread free their entries for new ones.
        drop(budgets);
        let fresh =
            RatioBudget::new(1.0, Duration::from_secs(10), 0, clock.clock()).expect("valid");
        fresh.request_started();
        assert_eq!(local::pending(fresh.id).map(|(_, count)| count), Some(1));
    }

    #[test]
    fn a_long_silence_sweeps_the_whole_window() {
        let (b, clock) = budget(1.0, 0);
        for _ in 0..64 {
            b.request_started();
        }
        clock.advance(Duration::from_secs(3));
        assert_eq!(retries_allowed(&b, 10), 10);
        // Hours later every slot is stale, however many periods were skipped.
        clock.advance(Duration::from_secs(3 * 3600));
        assert_eq!(b.available(), 0.0);
        b.request_started();
        assert_eq!(b.available(), 1.0);
    }

    #[test]
    fn fractional_percent_is_not_truncated_to_100() {
        let (b, _) = budget(0.6, 0);
        for _ in 0..1000 {
            b.request_started();
        }
        assert_eq!(retries_allowed(&b, 2000), 600);
        let (b, _) = budget(0.005, 0);
        for _ in 0..1000 {
            b.request_started();
        }
        assert_eq!(retries_allowed(&b, 100), 5);
        let (b, _) = budget(0.001, 0);
        for _ in 0..999 {
            b.request_started();
        }
        assert_eq!(retries_allowed(&b, 100), 0, "0.999 retries earned");
        b.request_started();
        assert_eq!(retries_allowed(&b, 100), 1);
    }

    #[test]
    fn reserve_allows_min_retries_per_second_times_ttl() {
        let (b, _) = budget(0.2, 10);
        assert_eq!(retries_allowed(&b, 1000), 100);
    }

    #[test]
    fn deposits_and_withdrawals_expire_after_ttl() {
        let (b, clock) = budget(0.5, 0);
        for _ in 0..100 {
            b.request_started();
        }
        assert_eq!(retries_allowed(&b, 10), 10);
        clock.advance(Duration::from_secs(9));
        assert_eq!(retries_allowed(&b, 100), 40, "still inside the window");
        clock.advance(Duration::from_secs(1));
        // The deposits and the first ten withdrawals left the window together; the forty
        // withdrawals made at 9 s are still in it.
        assert_eq!(b.available(), -40.0);
        clock.advance(Duration::from_secs(10));
        assert_eq!(b.available(), 0.0);
    }

    #[test]
    fn steady_state_settles_near_the_percent() {
        let (b, clock) = budget(0.2, 0);
        let mut retries = 0;
        // 100 requests per second for a minute, every one of them failing and wanting a retry.
        for _ in 0..60 {
            for _ in 0..100 {
                b.request_started();
                if b.withdraw(Withdrawal::Retry).is_ok() {
                    retries += 1;
                }
                clock.advance(Duration::from_millis(10));
            }
        }
        let ratio = retries as f64 / 6000.0;
        assert!((0.19..=0.21).contains(&ratio), "{ratio}");
    }

    #[test]
    fn rejects_invalid_parameters() {
        let clock = Clock::system();
        assert!(matches!(
            RatioBudget::new(-0.1, Duration::from_secs(10), 0, clock.clone()),
            Err(InvalidBudget::RetryRatio(_))
        ));
        assert!(matches!(
            RatioBudget::new(f64::NAN, Duration::from_secs(10), 0, clock.clone()),
            Err(InvalidBudget::RetryRatio(_))
        ));
        // A percent written where the fraction belongs: 20 would be 2000 %.
        assert!(matches!(
            RatioBudget::new(20.0, Duration::from_secs(10), 0, clock.clone()),
            Err(InvalidBudget::RetryRatio(_))
        ));
        assert!(RatioBudget::new(1.0, Duration::from_secs(10), 0, clock.clone()).is_ok());
        assert!(matches!(
            RatioBudget::new(0.2, Duration::from_millis(999), 0, clock.clone()),
            Err(InvalidBudget::Ttl(_))
        ));
        assert!(matches!(
            RatioBudget::new(0.2, Duration::from_secs(61), 0, clock),
            Err(InvalidBudget::Ttl(_))
        ));
    }

    #[test]
    fn concurrent_withdrawals_never_overspend() {
        let (b, _) = budget(0.25, 0);
        for _ in 0..4000 {
            b.request_started();
        }
        let granted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| retries_allowed(&b, 1000)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .sum()
        });
        assert!(granted <= 1000, "{granted}");
        assert!(granted >= 990, "{granted}");
        assert!(b.available() >= 0.0);
    }
}
