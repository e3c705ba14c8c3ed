//! The time-based window's storage: per-thread shards for the current bucket, a locked
//! history for the buckets before it.
//!
//! # Why shards?
//!
//! Every call of every request records into the window, so its record path is what a
//! breaker adds to a healthy call. A shared counter that every thread increments bounces one
//! cache line between cores and costs tens of nanoseconds under contention; a mutex more.
//! Here each thread that records owns a [`Shard`] (through [`thread_local::ThreadLocal`]) for
//! the *current* bucket: it is the only writer, so a record is a few plain loads and stores of
//! relaxed atomics, and two threads never touch the same cache line.
//!
//! When a thread's next record falls into a newer bucket, it moves its shard's counts into
//! the shared [`History`] (one slot per bucket, under a mutex: once per thread per bucket)
//! and starts afresh. Readers lock the history and add up the live history slots and the live
//! shards; moving a shard and reading happen under the same lock, so a reader never sees a
//! call twice or misses a moved one. A reader racing a record in progress may see that call's
//! counters partly updated; each call is fully visible once its record returned.
//!
//! [`HealthWindow::reset`](super::HealthWindow::reset) cannot clear other threads' shards, so
//! it starts a new *generation*: shards of an older generation are ignored by readers and
//! cleared by their owners on their next record.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use thread_local::ThreadLocal;

use super::counts::{self, Call, HealthCounts};
use super::latency::BUCKETS as LATENCY_BUCKETS;

/// Bits of a tag that hold the bucket number; the generation is above them.
const EPOCH_BITS: u32 = 44;
const EPOCH_MASK: u64 = (1 << EPOCH_BITS) - 1;
/// A shard or slot that holds nothing.
const EMPTY: u64 = u64::MAX;

fn tag(generation: u64, epoch: u64) -> u64 {
    (generation << EPOCH_BITS) | (epoch & EPOCH_MASK)
}

fn epoch_of(tag: u64) -> u64 {
    tag & EPOCH_MASK
}

fn generation_of(tag: u64) -> u64 {
    tag >> EPOCH_BITS
}

/// Counter indices in a shard or slot.
const CALLS: usize = 0;
const RETRYABLE: usize = 1;
const OVERLOADED: usize = 2;
const IN_DOUBT: usize = 3;
const NEVER_RETRY: usize = 4;
const SLOW: usize = 5;
const COUNTERS: usize = 6;

/// One thread's counts for one bucket. Aligned so that two threads' shards never share a
/// cache line.
#[repr(align(128))]
#[derive(Debug)]
pub(super) struct Shard {
    /// `tag(generation, epoch)` of the bucket these counts belong to, or [`EMPTY`].
    tag: AtomicU64,
    counts: [AtomicU64; COUNTERS],
    latency: [AtomicU32; LATENCY_BUCKETS],
}

impl Shard {
    fn new() -> Self {
        Shard {
            tag: AtomicU64::new(EMPTY),
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            latency: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// Adds one call. Only the owning thread calls this, so a load and a store suffice.
    #[inline]
    fn add(&self, call: Call, latency: usize) {
        bump64(&self.counts[CALLS]);
        if call.is_plain_success() {
            // The common case: nothing but the call and its latency.
        } else {
            self.add_details(call);
        }
        let cell = &self.latency[latency];
        cell.store(
            cell.load(Ordering::Relaxed).saturating_add(1),
            Ordering::Relaxed,
        );
    }

    #[cold]
    fn add_details(&self, call: Call) {
        if let Some(class) = call.class_counter() {
            bump64(&self.counts[class]);
        }
        if call.is_slow() {
            bump64(&self.counts[SLOW]);
        }
    }

    /// Clears the shard for the bucket `tag`. Owner only, under the history lock.
    fn restart(&self, tag: u64) {
        for c in &self.counts {
            c.store(0, Ordering::Relaxed);
        }
        for c in &self.latency {
            c.store(0, Ordering::Relaxed);
        }
        self.tag.store(tag, Ordering::Release);
    }
}

#[inline]
fn bump64(cell: &AtomicU64) {
    cell.store(
        cell.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
}

/// One bucket of history.
#[derive(Clone, Debug)]
struct Slot {
    /// The bucket number, or [`EMPTY`].
    epoch: u64,
    counts: [u64; COUNTERS],
    latency: Box<[u64; LATENCY_BUCKETS]>,
}

#[derive(Debug)]
struct History {
    slots: Vec<Slot>,
    generation: u64,
}

/// What a reader adds up.
pub(super) struct Totals {
    counts: [u64; COUNTERS],
    latency: Option<Box<[u64; LATENCY_BUCKETS]>>,
}

impl Totals {
    pub(super) fn health(&self, never_retry_is_failure: bool) -> HealthCounts {
        let c = &self.counts;
        let classes = c[RETRYABLE] + c[OVERLOADED] + c[IN_DOUBT] + c[NEVER_RETRY];
        // A reader racing a record may see its class before its call: never report fewer
        // calls than classes.
        let calls = c[CALLS].max(classes);
        let mut failures = c[RETRYABLE] + c[OVERLOADED] + c[IN_DOUBT];
        if never_retry_is_failure {
            failures += c[NEVER_RETRY];
        }
        HealthCounts {
            calls,
            successes: calls - classes,
            retryable: c[RETRYABLE],
            overloaded: c[OVERLOADED],
            in_doubt: c[IN_DOUBT],
            never_retry: c[NEVER_RETRY],
            failures,
            slow: c[SLOW].min(calls),
        }
    }

    pub(super) fn into_latency(self) -> Option<Box<[u64; LATENCY_BUCKETS]>> {
        self.latency
    }
}

/// The time-based window's storage.
#[derive(Debug)]
pub(super) struct TimeStore {
    bucket_ms: u64,
    buckets: u64,
    /// `tag(generation, epoch)` of the newest bucket any record has seen.
    hint: AtomicU64,
    /// Bumped when the newest bucket changes and on reset (see `HealthWindow::version`).
    version: AtomicU64,
    shards: ThreadLocal<Shard>,
    history: Mutex<History>,
}

impl TimeStore {
    pub(super) fn new(bucket_ms: u64, buckets: u32) -> Self {
        let empty = Slot {
            epoch: EMPTY,
            counts: [0; COUNTERS],
            latency: Box::new([0; LATENCY_BUCKETS]),
        };
        TimeStore {
            bucket_ms,
            buckets: u64::from(buckets),
            hint: AtomicU64::new(tag(0, 0)),
            version: AtomicU64::new(0),
            shards: ThreadLocal::new(),
            history: Mutex::new(History {
                slots: vec![empty; buckets as usize],
                generation: 0,
            }),
        }
    }

    pub(super) fn version(&self) -> &AtomicU64 {
        &self.version
    }

    /// Records one call made at `now` (milliseconds on the window's time base).
    #[inline]
    pub(super) fn record(&self, now: u64, call: Call, latency: usize) {
        let shard = self.shards.get_or(Shard::new);
        let hint = self.hint.load(Ordering::Relaxed);
        let start = epoch_of(hint).wrapping_mul(self.bucket_ms);
        if shard.tag.load(Ordering::Relaxed) == hint && now.wrapping_sub(start) < self.bucket_ms {
            shard.add(call, latency);
        } else {
            self.record_in_new_bucket(shard, now, call, latency);
        }
    }

    #[cold]
    fn record_in_new_bucket(&self, shard: &Shard, now: u64, call: Call, latency: usize) {
        let epoch = (now / self.bucket_ms) & EPOCH_MASK;
        // Move the newest-bucket hint forward (never back); a move is a new version.
        let mut hint = self.hint.load(Ordering::Acquire);
        while epoch > epoch_of(hint) {
            let newer = tag(generation_of(hint), epoch);
            match self
                .hint
                .compare_exchange_weak(hint, newer, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.version.fetch_add(1, Ordering::Release);
                    break;
                }
                Err(current) => hint = current,
            }
        }
        let mut history = self.lock();
        let current = tag(history.generation, epoch);
        let mine = shard.tag.load(Ordering::Relaxed);
        let same_generation = mine != EMPTY && generation_of(mine) == history.generation;
        if same_generation && epoch_of(mine) >= epoch {
            // Already this bucket (or, for a thread whose clock reading lagged another's, a
            // newer one: the call is counted a bucket late rather than lost).
        } else {
            if same_generation {
                self.flush(&mut history, shard, epoch_of(mine));
            }
            shard.restart(current);
        }
        drop(history);
        shard.add(call, latency);
    }

    /// Moves a shard's counts for bucket `epoch` into the history. Under the history lock.
    fn flush(&self, history: &mut History, shard: &Shard, epoch: u64) {
        let slot = &mut history.slots[(epoch % self.buckets) as usize];
        if slot.epoch != EMPTY && slot.epoch > epoch {
            // The slot already holds a bucket at least a whole window newer: these calls
            // have left the window.
            return;
        }
        if slot.epoch != epoch {
            slot.epoch = epoch;
            slot.counts = [0; COUNTERS];
            slot.latency.fill(0);
        }
        for (sum, c) in slot.counts.iter_mut().zip(&shard.counts) {
            *sum += c.load(Ordering::Relaxed);
        }
        for (sum, c) in slot.latency.iter_mut().zip(&shard.latency) {
            *sum += u64::from(c.load(Ordering::Relaxed));
        }
    }

    /// Adds up the buckets live at `now`: the current one and the `buckets − 1` before it.
    pub(super) fn totals(&self, now: u64, with_latency: bool) -> Totals {
        let epoch = (now / self.bucket_ms) & EPOCH_MASK;
        let live = |e: u64| e != EMPTY && e <= epoch && epoch - e < self.buckets;
        let mut counts = [0u64; COUNTERS];
        let mut latency = with_latency.then(|| Box::new([0u64; LATENCY_BUCKETS]));
        let history = self.lock();
        for slot in history.slots.iter().filter(|s| live(s.epoch)) {
            for (sum, c) in counts.iter_mut().zip(&slot.counts) {
                *sum += c;
            }
            if let Some(latency) = latency.as_deref_mut() {
                for (sum, c) in latency.iter_mut().zip(slot.latency.iter()) {
                    *sum += c;
                }
            }
        }
        for shard in self.shards.iter() {
            let t = shard.tag.load(Ordering::Acquire);
            if t == EMPTY || generation_of(t) != history.generation || !live(epoch_of(t)) {
                continue;
            }
            for (sum, c) in counts.iter_mut().zip(&shard.counts) {
                *sum += c.load(Ordering::Relaxed);
            }
            if let Some(latency) = latency.as_deref_mut() {
                for (sum, c) in latency.iter_mut().zip(&shard.latency) {
                    *sum += u64::from(c.load(Ordering::Relaxed));
                }
            }
        }
        drop(history);
        Totals { counts, latency }
    }

    /// Forgets everything: clears the history and starts a new generation.
    pub(super) fn reset(&self) {
        let mut history = self.lock();
        history.generation = (history.generation + 1) & (u64::MAX >> EPOCH_BITS);
        for slot in &mut history.slots {
            slot.epoch = EMPTY;
        }
        let generation = history.generation;
        // The hint follows the generation, so every shard's next record takes the slow path
        // and finds out its counts are stale.
        let _ = self
            .hint
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                Some(tag(generation, epoch_of(h)))
            });
        self.version.fetch_add(1, Ordering::Release);
        drop(history);
    }

    fn lock(&self) -> MutexGuard<'_, History> {
        // No code panics while holding the lock, so a poisoned lock still holds valid sums.
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Call {
    const fn is_plain_success(self) -> bool {
        self.0 & (counts::CLASS_MASK | counts::SLOW) == 0
    }

    const fn is_slow(self) -> bool {
        self.0 & counts::SLOW != 0
    }

    /// The counter for this call's class, `None` for a success.
    const fn class_counter(self) -> Option<usize> {
        match self.0 & counts::CLASS_MASK {
            0 => None,
            1 => Some(RETRYABLE),
            2 => Some(OVERLOADED),
            3 => Some(IN_DOUBT),
            _ => Some(NEVER_RETRY),
        }
    }
}
