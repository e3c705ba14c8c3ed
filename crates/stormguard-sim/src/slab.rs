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
    slots: Vec<Option<T>>,
    free: Vec<u32>,
    len: usize,
    peak: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
            peak: 0,
        }
    }
}

impl<T> Slab<T> {
    /// An empty slab.
    pub fn new() -> Self {
        Slab::default()
    }

    /// Stores `value`; `None` when all [`MAX_SLOT`] + 1 slots are taken.
    ///
    /// Always inlined: the value is then written straight into its slot, not built and
    /// copied (the simulator's per-call state is over a hundred bytes).
    #[inline(always)]
    pub fn insert(&mut self, value: T) -> Option<u32> {
        let id = match self.free.pop() {
            Some(id) => {
                let slot = self.slots.get_mut(id as usize)?;
                *slot = Some(value);
                id
            }
            None => {
                let id = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&id| id <= MAX_SLOT)?;
                self.slots.push(Some(value));
                id
            }
        };
        self.len += 1;
        self.peak = self.peak.max(self.len);
        Some(id)
    }

    /// The value in slot `id`, if it is taken.
    #[inline]
    pub fn get(&self, id: u32) -> Option<&T> {
        self.slots.get(id as usize)?.as_ref()
    }

    /// The value in slot `id`, if it is taken.
    #[inline]
    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        self.slots.get_mut(id as usize)?.as_mut()
    }

    /// Empties slot `id` and returns what it held.
    #[inline]
    pub fn remove(&mut self, id: u32) -> Option<T> {
        let value = self.slots.get_mut(id as usize)?.take()?;
        self.free.push(id);
        self.len -= 1;
        Some(value)
    }

    /// Empties slot `id`, dropping what it held where it lies (no copy out, unlike
    /// [`remove`](Slab::remove)); whether it was taken.
    #[inline(always)]
    pub fn free(&mut self, id: u32) -> bool {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return false;
        };
        if slot.is_none() {
            return false;
        }
        *slot = None;
        self.free.push(id);
        self.len -= 1;
        true
    }

    /// Slots taken.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no slot is taken.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most slots ever taken at once.
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// Empties every slot (dropping the values), keeping the allocation.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
        self.len = 0;
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
}
