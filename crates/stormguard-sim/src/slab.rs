//! Per-request state in a vector with a free list.
//!
//! The simulator keeps one slot per logical request (or call, or client) *in flight*: a slot
//! is taken when the request starts and given back when it ends, so memory follows the number
//! of requests in flight, not the number of events or requests in the run. Slot numbers fit
//! the 28-bit field of an event payload ([`queue::MAX_SLOT`](crate::queue::MAX_SLOT)).

use crate::queue::MAX_SLOT;

/// A vector of reusable slots.
///
/// # Example
///
/// ```
/// use stormguard_sim::slab::Slab;
///
/// let mut slab = Slab::new();
/// let a = slab.insert("a").expect("room");
/// let b = slab.insert("b").expect("room");
/// assert_eq!(slab.remove(a), Some("a"));
/// // The freed slot is reused.
/// assert_eq!(slab.insert("c"), Some(a));
/// assert_eq!(slab.get(b), Some(&"b"));
/// assert_eq!(slab.len(), 2);
/// ```
#[derive(Debug)]
pub struct Slab<T> {
    slots: Vec<Entry<T>>,
    /// The slot freed last ([`NO_SLOT`]: none): freed slots are taken again last-freed
    /// first, each free slot holding the number of the one freed before it.
    free: u32,
}

/// No free slot.
const NO_SLOT: u32 = u32::MAX;

/// A slot: taken, or free and linked to the slot freed before it.
///
/// The free list lives in the free slots themselves (no second vector to push and pop on
/// every request), and it is a stack, so slots are reused in the same order as by a
/// separate stack of free slot numbers: the event order of the scenarios (whose ties are
/// broken by slot numbers) does not depend on how the list is kept.
#[derive(Debug)]
enum Entry<T> {
    Taken(T),
    Free { next: u32 },
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: NO_SLOT,
        }
    }
}

impl<T> Slab<T> {
    /// The bytes one slot takes: a value's own size when the free-slot link fits in bytes
    /// the value leaves unused, more otherwise (a hot record sized to a cache line checks
    /// that its slot is too).
    ///
    /// ```
    /// use stormguard_sim::slab::Slab;
    /// assert_eq!(Slab::<u64>::SLOT_BYTES, 16);
    /// assert_eq!(Slab::<std::num::NonZeroU64>::SLOT_BYTES, 16);
    /// ```
    pub const SLOT_BYTES: usize = std::mem::size_of::<Entry<T>>();

    /// An empty slab.
    pub fn new() -> Self {
        Slab::default()
    }

    /// Stores `value`; `None` when all [`MAX_SLOT`] + 1 slots are taken.
    ///
    /// Always inlined: the value is then written straight into its slot, not built and
    /// copied (the simulators' per-request states are several words).
    #[inline(always)]
    pub fn insert(&mut self, value: T) -> Option<u32> {
        self.insert_mut(value).map(|(id, _)| id)
    }

    /// Stores `value` and hands back its slot number and the stored value, to go on
    /// filling it in where it lies; `None` when all [`MAX_SLOT`] + 1 slots are taken.
    #[inline(always)]
    pub fn insert_mut(&mut self, value: T) -> Option<(u32, &mut T)> {
        self.insert_with(|| value)
    }

    /// Stores the value `make` builds, like [`insert_mut`](Slab::insert_mut), building it
    /// where it goes: in a free slot it is written in place, not built aside and copied in.
    #[inline(always)]
    pub fn insert_with(&mut self, make: impl FnOnce() -> T) -> Option<(u32, &mut T)> {
        let id = self.free;
        if (id as usize) >= self.slots.len() {
            return self.push(make());
        }
        let slot = self.slots.get_mut(id as usize)?;
        let Entry::Free { next } = *slot else {
            return None;
        };
        self.free = next;
        // Replaced, not assigned: an assignment would run the drop glue of the free entry
        // it overwrites (an out-of-line call for a value with a `Drop`), which has nothing
        // to drop.
        let free = std::mem::replace(slot, Entry::Taken(make()));
        std::mem::forget(free);
        match slot {
            Entry::Taken(value) => Some((id, value)),
            Entry::Free { .. } => None,
        }
    }

    /// Stores `value` in a new slot at the end (no slot is free).
    #[inline(never)]
    fn push(&mut self, value: T) -> Option<(u32, &mut T)> {
        let id = u32::try_from(self.slots.len())
            .ok()
            .filter(|&id| id <= MAX_SLOT)?;
        self.slots.push(Entry::Taken(value));
        match self.slots.last_mut()? {
            Entry::Taken(value) => Some((id, value)),
            Entry::Free { .. } => None,
        }
    }

    /// The value in slot `id`, if it is taken.
    #[inline]
    pub fn get(&self, id: u32) -> Option<&T> {
        match self.slots.get(id as usize)? {
            Entry::Taken(value) => Some(value),
            Entry::Free { .. } => None,
        }
    }

    /// The value in slot `id`, if it is taken.
    #[inline]
    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        match self.slots.get_mut(id as usize)? {
            Entry::Taken(value) => Some(value),
            Entry::Free { .. } => None,
        }
    }

    /// Empties slot `id` and returns what it held.
    #[inline]
    pub fn remove(&mut self, id: u32) -> Option<T> {
        let slot = self.slots.get_mut(id as usize)?;
        if matches!(slot, Entry::Free { .. }) {
            return None;
        }
        let taken = std::mem::replace(slot, Entry::Free { next: self.free });
        self.free = id;
        match taken {
            Entry::Taken(value) => Some(value),
            Entry::Free { .. } => None,
        }
    }

    /// Empties slot `id`, dropping what it held where it lies (no copy out, unlike
    /// [`remove`](Slab::remove)); whether it was taken.
    #[inline(always)]
    pub fn free(&mut self, id: u32) -> bool {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return false;
        };
        if matches!(slot, Entry::Free { .. }) {
            return false;
        }
        *slot = Entry::Free { next: self.free };
        self.free = id;
        true
    }

    /// Empties slot `id` like [`free`](Slab::free), after `read` has read what it needs of
    /// the value (one look-up for both); `None` when the slot was not taken.
    #[inline(always)]
    pub fn free_after<R>(&mut self, id: u32, read: impl FnOnce(&T) -> R) -> Option<R> {
        let slot = self.slots.get_mut(id as usize)?;
        let Entry::Taken(value) = slot else {
            return None;
        };
        let out = read(value);
        *slot = Entry::Free { next: self.free };
        self.free = id;
        Some(out)
    }

    /// Slots taken: counted over the slots when asked, since the simulators never ask (a
    /// count kept up to date cost two instructions per request of the what-if bench).
    pub fn len(&self) -> usize {
        self.slots
            .iter()
            .filter(|e| matches!(e, Entry::Taken(_)))
            .count()
    }

    /// Whether no slot is taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most slots ever taken at once: a new slot is added only when none is free, so
    /// that is the number of slots.
    pub fn peak(&self) -> usize {
        self.slots.len()
    }

    /// Empties every slot (dropping the values), keeping the allocation.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.free = NO_SLOT;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_twice_is_none_and_peak_is_kept() {
        let mut s = Slab::new();
        let a = s.insert(1).expect("room");
        let _b = s.insert(2).expect("room");
        assert_eq!(s.remove(a), Some(1));
        assert_eq!(s.remove(a), None);
        assert!(!s.free(a));
        let c = s.insert(3).expect("room");
        assert_eq!(c, a, "a freed slot is reused");
        assert!(s.free(c));
        assert!(!s.free(c));
        assert_eq!(s.get_mut(99), None);
        assert_eq!(s.peak(), 2);
        s.clear();
        assert!(s.is_empty());
    }

    /// Slots come back last freed first, as from a stack of free slot numbers: the
    /// simulators' event order (ties broken by slot number) depends on it. Checked against
    /// such a stack over a random mix of inserts (by value and by builder) and frees.
    #[test]
    fn freed_slots_are_reused_last_freed_first() {
        use rand::{Rng, SeedableRng, rngs::SmallRng};
        let mut rng = SmallRng::seed_from_u64(5);
        let mut slab = Slab::new();
        let (mut stack, mut next, mut taken) = (Vec::<u32>::new(), 0u32, Vec::new());
        for i in 0..20_000u32 {
            if taken.is_empty() || rng.random_bool(0.55) {
                let expected = stack.pop().unwrap_or_else(|| {
                    next += 1;
                    next - 1
                });
                let (id, value) = if i % 2 == 0 {
                    slab.insert_mut(i)
                } else {
                    slab.insert_with(|| i)
                }
                .expect("room");
                assert_eq!((id, *value), (expected, i));
                *value += 1;
                assert_eq!(slab.get(id), Some(&(i + 1)));
                taken.push(id);
            } else {
                let id = taken.swap_remove(rng.random_range(0..taken.len()));
                if rng.random_bool(0.5) {
                    assert!(slab.free(id));
                } else {
                    assert_eq!(slab.free_after(id, |v| *v > 0), Some(true));
                }
                assert_eq!(slab.get(id), None);
                assert_eq!(slab.free_after(id, |_| ()), None);
                stack.push(id);
            }
            assert_eq!(slab.len(), taken.len());
        }
        assert_eq!(slab.peak(), next as usize);
    }
}
