//! The event queue: a base-256 radix heap of 16-byte events.
//!
//! A discrete-event simulation never schedules into the past: every event is pushed at or
//! after the instant of the last one popped. That monotonicity is what a *radix heap* needs
//! (Ahuja, Mehlhorn, Orlin and Tarjan, 1990). This one uses bytes as digits, like a
//! hierarchical timing wheel over the nanosecond clock: an event goes to level *l*, slot *s*
//! when the highest byte in which its time differs from a reference time is byte *l*, and its
//! value there is *s*. A push is an XOR, a leading-zeros count and a vector push. A pop
//! takes the next event of a short sorted *run*; when the run is empty, the lowest occupied
//! slot (found through a 256-bit occupancy map per level) holds the earliest events of all:
//! if it is small it is sorted into the run, otherwise it is spread over the lower levels
//! first. So an event is usually filed once and popped once, whatever the number pending; no
//! comparison-based sift over all pending events runs at all.
//!
//! Why not `std::collections::BinaryHeap`: with 16-byte events its pop is a sift over
//! log₂(pending) levels of cache lines. The `events` bench prints both on the same hold
//! workload: this queue is ahead at a thousand events pending and about three times faster at
//! a hundred thousand, where the heap no longer fits in cache. Nothing is allocated once the
//! slots have grown to the peak load.
//!
//! An event is a time ([`Nanos`]) and a 64-bit payload packed by the scenario ([`pack`] /
//! [`unpack`]: a 4-bit kind, a 28-bit slot number and a 32-bit operand).
//!
//! # Determinism
//!
//! Events pop in (time, payload) order — the order of the 128-bit number `time << 64 |
//! payload` — exactly as from a binary min-heap of those numbers (a test drives both side by
//! side): the same seed pops the same events in the same order on every run and machine.

use crate::time::Nanos;

/// Bits of the slot field of a packed payload.
pub const SLOT_BITS: u32 = 28;

/// The largest slot number a payload can carry.
pub const MAX_SLOT: u32 = (1 << SLOT_BITS) - 1;

const LEVELS: usize = 8;
const SLOTS: usize = 256;

/// Drained slots with at most this many events are sorted into the run directly; larger
/// ones are spread over the lower levels first (a sort would cost more than the moves).
const SORT_LIMIT: usize = 64;

/// A monotone min-queue of timed events.
///
/// Pushing an event earlier than the last one popped is a caller bug; such an event is
/// treated as due now (it pops next), never lost.
///
/// # Example
///
/// ```
/// use stormguard_sim::queue::{EventQueue, pack, unpack};
///
/// let mut q = EventQueue::new();
/// q.push(20, pack(1, 7, 0));
/// q.push(10, pack(2, 3, 99));
/// assert_eq!(q.pop().map(|(at, p)| (at, unpack(p))), Some((10, (2, 3, 99))));
/// q.push(15, pack(0, 1, 1));
/// assert_eq!(q.pop().map(|(at, _)| at), Some(15));
/// assert_eq!(q.pop().map(|(at, p)| (at, unpack(p))), Some((20, (1, 7, 0))));
/// assert!(q.pop().is_none());
/// ```
#[derive(Debug, Clone)]
pub struct EventQueue {
    /// `LEVELS × SLOTS` slots; slot `l · SLOTS + s` holds the events whose time first
    /// differs from `reference` in byte `l`, where it is `s`.
    slots: Vec<Vec<(Nanos, u64)>>,
    /// Per level, bit `s` set when slot `s` is not empty.
    occupied: [[u64; SLOTS / 64]; LEVELS],
    /// Bit `l` set when level `l` has an occupied slot.
    levels: u8,
    /// The earliest events, in descending (time, payload) order: popped from the end. Every
    /// event here is at or before `reference`; every event in a slot is after it.
    run: Vec<(Nanos, u64)>,
    reference: Nanos,
    /// Time of the last event popped.
    now: Nanos,
    len: usize,
    pushed: u64,
}

impl Default for EventQueue {
    fn default() -> Self {
        EventQueue {
            slots: (0..LEVELS * SLOTS).map(|_| Vec::new()).collect(),
            occupied: [[0; SLOTS / 64]; LEVELS],
            levels: 0,
            run: Vec::new(),
            reference: 0,
            now: 0,
            len: 0,
            pushed: 0,
        }
    }
}

impl EventQueue {
    /// An empty queue at time zero.
    pub fn new() -> Self {
        EventQueue::default()
    }

    /// An empty queue at time zero. Slots grow on demand and keep their room, so the
    /// capacity hint only pre-sizes the run of earliest events.
    pub fn with_capacity(n: usize) -> Self {
        let mut q = EventQueue::default();
        q.run.reserve(n.min(4 * SORT_LIMIT));
        q
    }

    /// Schedules the event `payload` at `at` (at or after the last event popped).
    #[inline(always)]
    pub fn push(&mut self, at: Nanos, payload: u64) {
        self.len += 1;
        self.pushed += 1;
        let at = at.max(self.now);
        if at <= self.reference {
            self.insert_into_run(at, payload);
        } else {
            self.file(at, payload);
        }
    }

    /// Puts an event due no later than `reference` into its place in the run (rare: most
    /// events are due after the ones being popped).
    #[cold]
    fn insert_into_run(&mut self, at: Nanos, payload: u64) {
        let event = (at, payload);
        let i = self.run.partition_point(|&e| e > event);
        self.run.insert(i, event);
    }

    /// Puts an event after `reference` in its level and slot.
    #[inline(always)]
    fn file(&mut self, at: Nanos, payload: u64) {
        let level = ((u64::BITS - 1 - (at ^ self.reference).leading_zeros()) / 8) as usize;
        let slot = ((at >> (8 * level)) & 0xFF) as usize;
        if let (Some(bucket), Some(bits)) = (
            self.slots.get_mut(level * SLOTS + slot),
            self.occupied.get_mut(level),
        ) {
            bucket.push((at, payload));
            bits[slot / 64] |= 1 << (slot % 64);
            self.levels |= 1 << level;
        }
    }

    /// Removes and returns the earliest event.
    #[inline]
    pub fn pop(&mut self) -> Option<(Nanos, u64)> {
        if self.run.is_empty() {
            self.advance()?;
        }
        let event = self.run.pop()?;
        self.now = event.0;
        self.len -= 1;
        Some(event)
    }

    /// Refills the run from the lowest occupied slot; `None` when the queue is empty.
    #[inline(never)]
    fn advance(&mut self) -> Option<()> {
        loop {
            if self.levels == 0 {
                return None;
            }
            let level = self.levels.trailing_zeros() as usize;
            let bits = self.occupied.get_mut(level)?;
            let word = bits.iter().position(|&w| w != 0)?;
            let slot = word * 64 + bits[word].trailing_zeros() as usize;
            bits[word] &= !(1 << (slot % 64));
            if bits.iter().all(|&w| w == 0) {
                self.levels &= !(1 << level);
            }
            // The lowest slot of the lowest level holds the earliest events of all.
            let mut moving = std::mem::take(self.slots.get_mut(level * SLOTS + slot)?);
            if level == 0 || moving.len() <= SORT_LIMIT {
                self.reference = moving.iter().map(|&(at, _)| at).max()?;
                self.run.append(&mut moving);
            } else {
                self.reference = moving.iter().map(|&(at, _)| at).min()?;
                for (at, payload) in moving.drain(..) {
                    if at == self.reference {
                        self.run.push((at, payload));
                    } else {
                        self.file(at, payload);
                    }
                }
            }
            // Keep the emptied vector's allocation for the next events of this slot.
            if let Some(bucket) = self.slots.get_mut(level * SLOTS + slot) {
                *bucket = moving;
            }
            if !self.run.is_empty() {
                if self.run.len() > 1 {
                    self.run.sort_unstable_by_key(|&(at, payload)| {
                        std::cmp::Reverse((u128::from(at) << 64) | u128::from(payload))
                    });
                }
                return Some(());
            }
        }
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no event is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Events pushed since the queue was made or last cleared.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Drops every pending event and goes back to time zero, keeping the allocations.
    pub fn clear(&mut self) {
        for b in &mut self.slots {
            b.clear();
        }
        self.occupied = [[0; SLOTS / 64]; LEVELS];
        self.levels = 0;
        self.run.clear();
        self.reference = 0;
        self.now = 0;
        self.len = 0;
        self.pushed = 0;
    }
}

/// Packs a payload: `kind` (4 bits), `slot` (28 bits), `operand` (32 bits).
///
/// Bits of `kind` and `slot` beyond their widths are dropped; callers keep slots at or below
/// [`MAX_SLOT`] (the slabs refuse to grow past it).
#[inline]
pub const fn pack(kind: u8, slot: u32, operand: u32) -> u64 {
    ((kind as u64 & 0xF) << 60) | ((slot as u64 & MAX_SLOT as u64) << 32) | operand as u64
}

/// Unpacks what [`pack`] packed: `(kind, slot, operand)`.
#[inline]
pub const fn unpack(payload: u64) -> (u8, u32, u32) {
    (
        (payload >> 60) as u8,
        ((payload >> 32) as u32) & MAX_SLOT,
        payload as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::SmallRng};
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    /// Drives the queue and a binary heap of `time << 64 | payload` through the same hold
    /// model (pop one, push one a random delay later, with ties) and compares every pop.
    fn matches_a_binary_heap(max_delay: u64, pending: u64, ops: u64, seed: u64) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut q = EventQueue::with_capacity(64);
        let mut reference = BinaryHeap::new();
        let push = |q: &mut EventQueue, r: &mut BinaryHeap<_>, at: u64, p: u64| {
            q.push(at, p);
            r.push(Reverse((u128::from(at) << 64) | u128::from(p)));
        };
        for i in 0..pending {
            push(
                &mut q,
                &mut reference,
                rng.random_range(0..max_delay),
                i % 7,
            );
        }
        for i in 0..ops {
            let (at, p) = q.pop().expect("not empty");
            let Reverse(e) = reference.pop().expect("not empty");
            assert_eq!((at, p), ((e >> 64) as u64, e as u64), "pop {i}");
            // Some events at the same instant, some far away.
            let delay = match i % 5 {
                0 => 0,
                1 => rng.random_range(0..4),
                _ => rng.random_range(0..max_delay),
            };
            push(&mut q, &mut reference, at + delay, rng.random_range(0..5));
        }
        assert_eq!(q.len() as u64, pending);
    }

    #[test]
    fn pops_exactly_like_a_binary_heap() {
        matches_a_binary_heap(1_000, 500, 20_000, 1);
        matches_a_binary_heap(3_000_000_000, 2_000, 20_000, 2);
        matches_a_binary_heap(u64::MAX / 4096, 100, 1_000, 3);
        matches_a_binary_heap(10, 50, 5_000, 4);
    }

    #[test]
    fn same_instant_pops_in_payload_order() {
        let mut q = EventQueue::new();
        for p in [5, 1, 9, 3] {
            q.push(10, p);
        }
        q.push(4, 0);
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![(4, 0), (10, 1), (10, 3), (10, 5), (10, 9)]);
    }

    #[test]
    fn a_push_into_the_past_pops_now_and_clear_resets() {
        let mut q = EventQueue::new();
        q.push(100, 1);
        q.push(200, 2);
        assert_eq!(q.pop(), Some((100, 1)));
        q.push(50, 3);
        assert_eq!(q.pop(), Some((100, 3)));
        assert_eq!(q.pushed(), 3);
        q.clear();
        assert!(q.is_empty());
        q.push(7, 4);
        assert_eq!(q.pop(), Some((7, 4)));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn pack_round_trips_at_the_edges() {
        for (k, s, o) in [(0, 0, 0), (15, MAX_SLOT, u32::MAX), (7, 12345, 678)] {
            assert_eq!(unpack(pack(k, s, o)), (k, s, o));
        }
        assert_eq!(unpack(u64::MAX).0, 15);
    }
}
