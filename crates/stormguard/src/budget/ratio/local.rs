//! Per-thread deposit batches: the reason a ratio budget deposit costs no atomic write.
//!
//! Every request deposits into a ratio budget, so a shared counter would be written by every
//! request on every core — the contention the design notes warn about. Instead each thread
//! counts its deposits for a few budgets in a small thread-local table and adds them to the
//! shared window every [`DEPOSIT_BATCH`] requests, or as soon as the window slot changes.
//!
//! What this costs in accuracy, always on the safe side: deposits still in *another* thread's
//! batch are not yet visible (at most `DEPOSIT_BATCH − 1` per thread and budget), so a retry
//! may be refused that an exact count would allow; a thread's own batch is counted in its own
//! withdrawals, so a single thread sees exact figures. A thread batches for its first four
//! budgets; deposits into any further budget go straight to the shared window (exact, just
//! not batched). A dropped budget frees its entry on the thread that drops it; a batch left
//! behind when a thread exits is lost — fewer deposits, never more.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Deposits a thread accumulates before adding them to the shared window.
pub(super) const DEPOSIT_BATCH: u32 = 32;
/// Budgets a thread batches for at once.
const ENTRIES: usize = 4;

/// A budget's identity in the per-thread tables; never reused, unlike an address.
pub(super) fn next_budget_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[derive(Clone, Copy)]
struct Batch {
    /// 0 marks an empty entry.
    budget: u64,
    period: u64,
    count: u32,
}

const EMPTY: Batch = Batch {
    budget: 0,
    period: 0,
    count: 0,
};

thread_local! {
    static BATCHES: RefCell<[Batch; ENTRIES]> = const { RefCell::new([EMPTY; ENTRIES]) };
}

/// A batch that must now be added to the shared window: `count` deposits made in `period`.
pub(super) struct Flush {
    pub(super) period: u64,
    pub(super) count: u32,
}

/// Counts one deposit of `budget` in `period`; returns what to add to the shared window now,
/// if anything. Without thread-local storage (a thread being torn down) the deposit is
/// flushed at once.
#[inline]
pub(super) fn deposit(budget: u64, period: u64) -> Option<Flush> {
    BATCHES
        .try_with(|batches| {
            let mut batches = batches.borrow_mut();
            let Some(batch) = batches.iter_mut().find(|b| b.budget == budget) else {
                // A new budget for this thread: take an empty entry, or, with the table full,
                // deposit straight into the shared window. Nothing is ever dropped.
                return match batches.iter_mut().find(|b| b.budget == 0) {
                    Some(empty) => {
                        *empty = Batch {
                            budget,
                            period,
                            count: 1,
                        };
                        None
                    }
                    None => Some(Flush { period, count: 1 }),
                };
            };
            if batch.period != period {
                let stale = Flush {
                    period: batch.period,
                    count: batch.count,
                };
                *batch = Batch {
                    budget,
                    period,
                    count: 1,
                };
                return Some(stale);
            }
            batch.count += 1;
            (batch.count >= DEPOSIT_BATCH).then(|| {
                let full = Flush {
                    period,
                    count: batch.count,
                };
                batch.count = 0;
                full
            })
        })
        .unwrap_or(Some(Flush { period, count: 1 }))
}

/// This thread's deposits for `budget` not yet in the shared window, with their period.
#[inline]
pub(super) fn pending(budget: u64) -> Option<(u64, u32)> {
    BATCHES
        .try_with(|batches| {
            batches
                .borrow()
                .iter()
                .find(|b| b.budget == budget && b.count > 0)
                .map(|b| (b.period, b.count))
        })
        .ok()
        .flatten()
}

/// Frees this thread's entry for `budget` (called when the budget is dropped).
pub(super) fn forget(budget: u64) {
    let _ = BATCHES.try_with(|batches| {
        for batch in batches.borrow_mut().iter_mut() {
            if batch.budget == budget {
                *batch = EMPTY;
            }
        }
    });
}
