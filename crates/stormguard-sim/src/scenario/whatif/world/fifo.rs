//! The per-edge queue of attempts waiting on their per-try timeout.
//!
//! A `VecDeque` would do, but its push is left out of line by the compiler in the event
//! loop (a call per attempt sent); this queue is a vector read from a moving head: a push
//! is a vector push, a pop moves the head, and the vector is emptied when the head reaches
//! its end or, once the head is past half of it, compacted (the entries behind the head
//! moved to the front: each compaction copies fewer entries than were popped since the
//! last, so a pop costs a bounded amount of copying on average).

use crate::time::Nanos;

/// An attempt waiting on its per-try timeout: `(deadline, call, token)`.
pub(super) type Waiting = (Nanos, u32, u32);

/// Below this many popped entries, a vector is not compacted (a copy costs more than it
/// saves).
const COMPACT_AFTER: usize = 1024;

/// A first-in first-out queue of [`Waiting`] attempts.
#[derive(Default)]
pub(super) struct Fifo {
    items: Vec<Waiting>,
    head: usize,
}

impl Fifo {
    /// Adds `item` at the back.
    #[inline(always)]
    pub(super) fn push_back(&mut self, item: Waiting) {
        self.items.push(item);
    }

    /// The item at the front.
    #[inline(always)]
    pub(super) fn front(&self) -> Option<Waiting> {
        self.items.get(self.head).copied()
    }

    /// Drops the item at the front.
    #[inline(always)]
    pub(super) fn pop_front(&mut self) {
        self.head += 1;
        if self.head >= self.items.len() {
            self.items.clear();
            self.head = 0;
        } else if self.head >= COMPACT_AFTER && 2 * self.head >= self.items.len() {
            self.compact();
        }
    }

    #[cold]
    fn compact(&mut self) {
        self.items.drain(..self.head);
        self.head = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Pushes and pops in a random mix (long runs of pushes, so that compaction happens)
    /// give the same fronts as a `VecDeque`.
    #[test]
    fn behaves_like_a_vecdeque() {
        use rand::{Rng, SeedableRng, rngs::SmallRng};
        let mut rng = SmallRng::seed_from_u64(11);
        let (mut ours, mut theirs) = (Fifo::default(), VecDeque::new());
        for i in 0..200_000u32 {
            if rng.random_bool(0.52) {
                ours.push_back((u64::from(i), i, i ^ 7));
                theirs.push_back((u64::from(i), i, i ^ 7));
            } else if theirs.pop_front().is_some() {
                ours.pop_front();
            }
            assert_eq!(ours.front(), theirs.front().copied(), "step {i}");
        }
    }
}
