//! The far side of the event queue: a base-256 radix heap for events beyond the wheel's
//! horizon.
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
//! first. It holds any time a `u64` can, so [`EventQueue`](super::EventQueue) hands it the
//! events its wheel cannot hold yet, and takes them back as the wheel comes to them.

use crate::time::Nanos;

const LEVELS: usize = 8;
const SLOTS: usize = 256;

/// Drained slots with at most this many events are sorted into the run directly; larger
/// ones are spread over the lower levels first (a sort would cost more than the moves).
const SORT_LIMIT: usize = 64;

/// A monotone min-queue of timed events: pushing an event earlier than the last one popped
/// treats it as due now (it pops next), never loses it.
#[derive(Debug, Clone)]
pub(super) struct RadixHeap {
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
}

impl Default for RadixHeap {
    fn default() -> Self {
        RadixHeap {
            slots: (0..LEVELS * SLOTS).map(|_| Vec::new()).collect(),
            occupied: [[0; SLOTS / 64]; LEVELS],
            levels: 0,
            run: Vec::new(),
            reference: 0,
            now: 0,
        }
    }
}

impl RadixHeap {
    /// Schedules the event `payload` at `at` (at or after the last event popped).
    #[inline]
    pub(super) fn push(&mut self, at: Nanos, payload: u64) {
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
    pub(super) fn pop(&mut self) -> Option<(Nanos, u64)> {
        if self.run.is_empty() {
            self.advance()?;
        }
        let event = self.run.pop()?;
        self.now = event.0;
        Some(event)
    }

    /// The time of the earliest event, without removing it.
    #[inline]
    pub(super) fn peek(&mut self) -> Option<Nanos> {
        if self.run.is_empty() {
            self.advance()?;
        }
        self.run.last().map(|&(at, _)| at)
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
                super::sort_descending(&mut self.run);
                return Some(());
            }
        }
    }

    /// Events pending (counted: nothing on the way in or out keeps a count).
    pub(super) fn len(&self) -> usize {
        self.run.len() + self.slots.iter().map(Vec::len).sum::<usize>()
    }

    /// Drops every pending event and goes back to time zero, keeping the allocations.
    pub(super) fn clear(&mut self) {
        for b in &mut self.slots {
            b.clear();
        }
        self.occupied = [[0; SLOTS / 64]; LEVELS];
        self.levels = 0;
        self.run.clear();
        self.reference = 0;
        self.now = 0;
    }
}
