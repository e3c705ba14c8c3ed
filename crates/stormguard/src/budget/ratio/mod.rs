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
//! The ttl is split into ten slots. Each slot is one `AtomicU64` packing the slot's epoch
//! (which slot-width period it belongs to) with its balance, so rotating a stale slot and
//! adding to it are one compare-and-swap, and a deposit into the current slot is one
//! `fetch_add`. A withdrawal first sums the live slots and refuses without writing when the
//! balance is short (the common case in an outage); otherwise it subtracts and sums again,
//! refunding if a concurrent withdrawal got there first, so withdrawals never overspend. Time
//! comes from [`CoarseMillis`], two relaxed loads on the system clock.
//!
//! Deposits are batched per thread (see the `local` module): a deposit is a thread-local
//! increment, and the shared window is written once per 32 requests per thread. Deposits still
//! in other threads' batches are not visible yet, which can only make the budget stricter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{BudgetExhausted, InvalidBudget, RetryBudget, Withdrawal};
use crate::clock::{Clock, CoarseMillis};

mod local;

const SLOTS: usize = 10;
/// One retry, in budget units (milli-retries).
const RETRY_UNITS: i64 = 1_000;

const BALANCE_BITS: u32 = 40;
const BALANCE_BIAS: i64 = 1 << (BALANCE_BITS - 1);
const BALANCE_MASK: u64 = (1 << BALANCE_BITS) - 1;
const EPOCH_MASK: u64 = (1 << (64 - BALANCE_BITS)) - 1;
/// Below this magnitude a balance can take any single deposit or withdrawal with `fetch_add`.
const SAFE_ADD_LIMIT: u64 = 1 << (BALANCE_BITS - 2);

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
    slots: [AtomicU64; SLOTS],
    /// ⌈2^64 / slot width in ms⌉: `millis / width` as a multiply, exact below 2^40 ms.
    slot_reciprocal: u64,
    id: u64,
    deposit: i64,
    reserve: i64,
    millis: CoarseMillis,
}

impl RatioBudget {
    /// A budget allowing retries up to `retry_percent` (a fraction: 0.2 is 20 %; 0.0..=1000.0)
    /// of the requests seen over `ttl` (1..=60 s), plus `min_retries_per_sec · ttl` in reserve.
    pub fn new(
        retry_percent: f64,
        ttl: Duration,
        min_retries_per_sec: u32,
        clock: Clock,
    ) -> Result<Self, InvalidBudget> {
        if !retry_percent.is_finite() || !(0.0..=1000.0).contains(&retry_percent) {
            return Err(InvalidBudget::RetryPercent(retry_percent));
        }
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
            return Err(InvalidBudget::Ttl(ttl));
        }
        let ttl_millis = u64::try_from(ttl.as_millis()).unwrap_or(60_000);
        let reserve_retries =
            (u128::from(min_retries_per_sec) * u128::from(ttl_millis)).div_ceil(1000);
        Ok(RatioBudget {
            slots: std::array::from_fn(|_| AtomicU64::new(pack(0, 0))),
            slot_reciprocal: u64::MAX / (ttl_millis / SLOTS as u64).max(1) + 1,
            id: local::next_budget_id(),
            deposit: (retry_percent * RETRY_UNITS as f64).round() as i64,
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
        let epoch = self.epoch();
        self.balance(epoch) as f64 / RETRY_UNITS as f64
    }

    #[inline]
    fn epoch(&self) -> u64 {
        let millis = u128::from(self.millis.now());
        ((millis * u128::from(self.slot_reciprocal)) >> 64) as u64 & EPOCH_MASK
    }

    /// What a withdrawal in `epoch` may spend: the live window, this thread's batch and the
    /// reserve.
    #[inline]
    fn balance(&self, epoch: u64) -> i64 {
        let own_batch = match local::pending(self.id) {
            Some((batch_epoch, count)) if is_live(epoch, batch_epoch) => {
                i64::from(count) * self.deposit
            }
            _ => 0,
        };
        self.live_balance(epoch) + own_batch + self.reserve
    }

    #[inline]
    fn add(&self, epoch: u64, delta: i64) {
        let slot = &self.slots[(epoch % SLOTS as u64) as usize];
        let mut current = slot.load(Ordering::Relaxed);
        let (slot_epoch, balance) = unpack(current);
        if is_newer(slot_epoch, epoch) {
            // A late flush for a period whose slot has moved on: it has expired.
            return;
        }
        if slot_epoch == epoch && balance.unsigned_abs() < SAFE_ADD_LIMIT {
            // The balance is far from the field's limits, so a wrapping add of a small delta
            // stays inside the balance bits. (Were the slot rotated between the load and the
            // add, which takes a whole ttl, the delta would count in the new period.)
            slot.fetch_add(delta as u64, Ordering::AcqRel);
            return;
        }
        loop {
            let (slot_epoch, balance) = unpack(current);
            let next = if slot_epoch == epoch {
                pack(epoch, balance.saturating_add(delta))
            } else {
                pack(epoch, delta)
            };
            match slot.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }

    fn live_balance(&self, epoch: u64) -> i64 {
        self.slots
            .iter()
            .map(|slot| unpack(slot.load(Ordering::Acquire)))
            .filter(|&(slot_epoch, _)| is_live(epoch, slot_epoch))
            .map(|(_, balance)| balance)
            .sum()
    }
}

impl RetryBudget for RatioBudget {
    #[inline]
    fn request_started(&self) {
        if self.deposit == 0 {
            return;
        }
        let epoch = self.epoch();
        if let Some(flush) = local::deposit(self.id, epoch) {
            if is_live(epoch, flush.epoch) {
                self.add(flush.epoch, i64::from(flush.count) * self.deposit);
            }
        }
    }

    fn withdraw(&self, _: Withdrawal) -> Result<(), BudgetExhausted> {
        const REFUSED: BudgetExhausted = BudgetExhausted {
            kind: "ratio budget",
        };
        let epoch = self.epoch();
        if self.balance(epoch) < RETRY_UNITS {
            return Err(REFUSED);
        }
        self.add(epoch, -RETRY_UNITS);
        if self.balance(epoch) < 0 {
            self.add(epoch, RETRY_UNITS);
            return Err(REFUSED);
        }
        Ok(())
    }

    #[inline]
    fn record_success(&self, _: Option<Withdrawal>) {}

    #[inline]
    fn record_failure(&self) {}
}

/// Whether a slot of `slot_epoch` still counts in `epoch`'s window.
#[inline]
fn is_live(epoch: u64, slot_epoch: u64) -> bool {
    epoch.wrapping_sub(slot_epoch) & EPOCH_MASK < SLOTS as u64
}

/// Whether `slot_epoch` is later than `epoch` (within half the epoch range).
#[inline]
fn is_newer(slot_epoch: u64, epoch: u64) -> bool {
    let ahead = slot_epoch.wrapping_sub(epoch) & EPOCH_MASK;
    ahead != 0 && ahead < EPOCH_MASK / 2
}

/// Clamps a balance to what the packed field holds.
fn clamp_balance(balance: i64) -> i64 {
    balance.clamp(-BALANCE_BIAS, BALANCE_BIAS - 1)
}

fn pack(epoch: u64, balance: i64) -> u64 {
    let biased = (clamp_balance(balance) + BALANCE_BIAS) as u64;
    ((epoch & EPOCH_MASK) << BALANCE_BITS) | (biased & BALANCE_MASK)
}

fn unpack(word: u64) -> (u64, i64) {
    let biased = (word & BALANCE_MASK) as i64;
    (word >> BALANCE_BITS, biased - BALANCE_BIAS)
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
    fn pack_round_trips_extremes() {
        for balance in [0, 1, -1, BALANCE_BIAS - 1, -BALANCE_BIAS] {
            assert_eq!(unpack(pack(EPOCH_MASK, balance)), (EPOCH_MASK, balance));
        }
        assert_eq!(unpack(pack(3, i64::MAX)), (3, BALANCE_BIAS - 1));
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
            Err(InvalidBudget::RetryPercent(_))
        ));
        assert!(matches!(
            RatioBudget::new(f64::NAN, Duration::from_secs(10), 0, clock.clone()),
            Err(InvalidBudget::RetryPercent(_))
        ));
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
