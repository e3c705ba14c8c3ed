//! The event queue: a timing wheel of 33-microsecond buckets for the next 34 ms, in front
//! of a radix heap for the rest.
//!
//! A discrete-event simulation never schedules into the past: every event is pushed at or
//! after the instant of the last one popped, and most are pushed a little ahead (the end of
//! a few milliseconds of work). A *timing wheel* (Varghese and Lauck, 1987) files such an
//! event once, in the bucket of its instant — a shift, a mask and a vector push — and pops
//! it from a short sorted *run*: when the run is empty, the next occupied bucket (found
//! through a two-level occupancy map) is sorted into it; it holds a few events. Events
//! beyond the wheel's horizon go to a radix heap (bytes of the time as digits),
//! which takes any time and hands them back, in order, as the wheel comes to them.
//!
//! Why not `std::collections::BinaryHeap`: with 16-byte events its pop is a sift over
//! log₂(pending) levels of cache lines. The `events` bench prints both on the same hold
//! workload. Why not the radix heap alone (this queue's previous form): an event a few
//! milliseconds ahead differs from the current time in the third or fourth byte, so it was
//! filed twice (spread from a 16 ms slot into 65 µs ones) before being sorted; the wheel
//! files it once. Nothing is allocated once the buckets have grown to the peak load.
//!
//! The price is a fixed bucket width, chosen for the simulators' loads: the what-if bench's
//! 130 events per millisecond put about four in a bucket (widths of 8 to 65 µs were
//! measured; 33 µs ran the fewest instructions). A much denser load sorts bigger buckets:
//! the `events` bench's hold model (a thousand or a hundred thousand events pending within
//! one millisecond: thirty or three thousand to a bucket) runs about a quarter slower than
//! on the radix heap alone, though still ahead of a binary heap.
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
use radix::RadixHeap;

mod radix;

/// Bits of the slot field of a packed payload.
pub const SLOT_BITS: u32 = 28;

/// The largest slot number a payload can carry.
pub const MAX_SLOT: u32 = (1 << SLOT_BITS) - 1;

/// A bucket of the wheel spans 2^`BUCKET_BITS` ns (32.8 µs).
const BUCKET_BITS: u32 = 15;
/// Buckets in the wheel: its horizon is `BUCKETS` × 32.8 µs, 34 ms. Their 1,024 vector
/// headers (24 KiB) stay in the first-level cache; 4,096 ran slightly more instructions and
/// cache misses on the what-if bench.
const BUCKETS: u64 = 1024;
/// Words of the wheel's occupancy map (one bit per bucket); one bit per word in `summary`.
const WORDS: usize = (BUCKETS / 64) as usize;

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
    /// The wheel: bucket `b % BUCKETS` holds the events whose bucket number (time >>
    /// `BUCKET_BITS`) is `b`, for `b` in `(cursor, cursor + BUCKETS)`.
    /// A fixed-size array, so that filing an event needs no bounds check.
    buckets: Box<[Vec<(Nanos, u64)>; BUCKETS as usize]>,
    /// Bit `b % 64` of word `b / 64` set when bucket `b` is not empty.
    occupied: [u64; WORDS],
    /// Bit `w` set when word `w` of `occupied` is not zero.
    summary: u64,
    /// The bucket number whose events are in `run`: every event at or before its end is
    /// there.
    cursor: u64,
    /// The earliest events, in descending (time, payload) order: popped from the end.
    run: Vec<(Nanos, u64)>,
    /// Events at or after the wheel's horizon (bucket number `cursor + BUCKETS`) when
    /// pushed; moved into the wheel as the cursor comes within reach of them.
    far: RadixHeap,
    /// The earliest time in `far` (`Nanos::MAX`: it is empty), so that moving the cursor
    /// asks it nothing while it holds nothing within reach.
    far_first: Nanos,
    /// Time of the last event popped.
    now: Nanos,
}

impl Default for EventQueue {
    fn default() -> Self {
        EventQueue {
            buckets: Box::new(std::array::from_fn(|_| Vec::new())),
            occupied: [0; WORDS],
            summary: 0,
            cursor: 0,
            run: Vec::new(),
            far: RadixHeap::default(),
            far_first: Nanos::MAX,
            now: 0,
        }
    }
}

impl EventQueue {
    /// An empty queue at time zero.
    pub fn new() -> Self {
        EventQueue::default()
    }

    /// An empty queue at time zero. Buckets grow on demand and keep their room, so the
    /// capacity hint only pre-sizes the run of earliest events.
    pub fn with_capacity(n: usize) -> Self {
        let mut q = EventQueue::default();
        q.run.reserve(n.min(256));
        q
    }

    /// Schedules the event `payload` at `at` (at or after the last event popped).
    #[inline(always)]
    pub fn push(&mut self, at: Nanos, payload: u64) {
        let at = at.max(self.now);
        let bucket = at >> BUCKET_BITS;
        if bucket <= self.cursor {
            self.insert_into_run(at, payload);
        } else if bucket - self.cursor < BUCKETS {
            self.file(bucket, at, payload);
        } else {
            self.far_first = self.far_first.min(at);
            self.far.push(at, payload);
        }
    }

    /// Puts an event of the cursor's bucket into its place in the run (rare: most events
    /// are due tens of buckets ahead).
    #[cold]
    fn insert_into_run(&mut self, at: Nanos, payload: u64) {
        let event = (at, payload);
        let i = self.run.partition_point(|&e| e > event);
        self.run.insert(i, event);
    }

    /// Puts an event into bucket number `bucket` of the wheel (within its horizon).
    #[inline(always)]
    fn file(&mut self, bucket: u64, at: Nanos, payload: u64) {
        let b = (bucket % BUCKETS) as usize;
        let word = b / 64;
        if let (Some(events), Some(bits)) = (self.buckets.get_mut(b), self.occupied.get_mut(word)) {
            events.push((at, payload));
            *bits |= 1 << (b % 64);
            self.summary |= 1 << word;
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
        Some(event)
    }

    /// Moves the cursor to the next bucket holding events and sorts them into the run;
    /// `None` when the queue is empty.
    #[inline(never)]
    fn advance(&mut self) -> Option<()> {
        loop {
            self.cursor = match self.next_occupied() {
                Some(bucket) => bucket,
                // The wheel is empty: on to the far side's earliest event.
                None => self.far.peek()? >> BUCKET_BITS,
            };
            let b = (self.cursor % BUCKETS) as usize;
            let word = b / 64;
            let bits = self.occupied.get_mut(word)?;
            if *bits & (1 << (b % 64)) != 0 {
                *bits &= !(1 << (b % 64));
                if *bits == 0 {
                    self.summary &= !(1 << word);
                }
                // The run is empty here: it takes the bucket's vector, and the bucket the
                // run's (both keep their room).
                std::mem::swap(&mut self.run, self.buckets.get_mut(b)?);
            }
            if self.far_first >> BUCKET_BITS < self.cursor + BUCKETS {
                self.take_from_far();
            }
            if !self.run.is_empty() {
                sort_descending(&mut self.run);
                return Some(());
            }
        }
    }

    /// The number of the first occupied bucket after the cursor, if any (the wheel holds
    /// buckets `cursor + 1 ..= cursor + BUCKETS - 1`, so searching on from the cursor's
    /// place and wrapping round meets them in order).
    #[inline]
    fn next_occupied(&self) -> Option<u64> {
        if self.summary == 0 {
            return None;
        }
        let start = ((self.cursor + 1) % BUCKETS) as usize;
        let word = start / 64;
        let here = self.occupied.get(word)? & (u64::MAX << (start % 64));
        let found = if here != 0 {
            word * 64 + here.trailing_zeros() as usize
        } else {
            // A later word, or else the first one from the start of the wheel (wrapped).
            let later = self.summary & u64::MAX.checked_shl(word as u32 + 1).unwrap_or(0);
            let w = if later != 0 { later } else { self.summary }.trailing_zeros() as usize;
            w * 64 + self.occupied.get(w)?.trailing_zeros() as usize
        };
        let distance = (found as u64 + BUCKETS - start as u64) % BUCKETS;
        Some(self.cursor + 1 + distance)
    }

    /// Moves the far side's events that are now within the wheel's horizon into the wheel
    /// (or into the run, those of the cursor's bucket).
    #[inline]
    fn take_from_far(&mut self) {
        loop {
            let Some(at) = self.far.peek() else {
                self.far_first = Nanos::MAX;
                return;
            };
            self.far_first = at;
            let bucket = at >> BUCKET_BITS;
            if bucket >= self.cursor + BUCKETS {
                return;
            }
            let Some((at, payload)) = self.far.pop() else {
                return;
            };
            if bucket <= self.cursor {
                self.run.push((at, payload));
            } else {
                self.file(bucket, at, payload);
            }
        }
    }

    /// Events pending: counted over the wheel and the far side when asked, since the event
    /// loops never ask (a count kept on every push and pop cost two instructions per
    /// event).
    pub fn len(&self) -> usize {
        self.run.len() + self.buckets.iter().map(Vec::len).sum::<usize>() + self.far.len()
    }

    /// Whether no event is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every pending event and goes back to time zero, keeping the allocations.
    pub fn clear(&mut self) {
        for b in self.buckets.iter_mut() {
            b.clear();
        }
        self.occupied = [0; WORDS];
        self.summary = 0;
        self.cursor = 0;
        self.run.clear();
        self.far.clear();
        self.far_first = Nanos::MAX;
        self.now = 0;
    }
}

/// Sorts `run` in descending (time, payload) order, on one 128-bit key.
#[inline(always)]
fn sort_descending(run: &mut [(Nanos, u64)]) {
    match run {
        [] | [_] => {}
        // The commonest case of a wheel's bucket: one comparison.
        [a, b] => {
            if *a < *b {
                std::mem::swap(a, b);
            }
        }
        [_, _, _] => network(run, &NETWORK_3),
        [_, _, _, _] => network(run, &NETWORK_4),
        [_, _, _, _, _] => network(run, &NETWORK_5),
        [_, _, _, _, _, _] => network(run, &NETWORK_6),
        _ => run.sort_unstable_by_key(|&(at, payload)| std::cmp::Reverse(key(at, payload))),
    }
}

// Sorting networks of the fewest comparators for 3 to 6 items (Knuth, The Art of Computer
// Programming, vol. 3, 5.3.4). Up to six: the what-if bench's buckets hold 4.4 events on
// average, and networks for seven and eight too cost 11 M more instructions on its 10 s
// run for 0.2 M fewer simulated mispredictions (those up to six: 11 M for 0.7 M).
#[rustfmt::skip]
const NETWORK_3: [(usize, usize); 3] = [(0, 2), (0, 1), (1, 2)];
#[rustfmt::skip]
const NETWORK_4: [(usize, usize); 5] = [(0, 2), (1, 3), (0, 1), (2, 3), (1, 2)];
#[rustfmt::skip]
const NETWORK_5: [(usize, usize); 9] =
    [(0, 3), (1, 4), (0, 2), (1, 3), (0, 1), (2, 4), (1, 2), (3, 4), (2, 3)];
#[rustfmt::skip]
const NETWORK_6: [(usize, usize); 12] = [
    (0, 5), (1, 3), (2, 4), (1, 2), (3, 4), (0, 3), (2, 5), (0, 1), (2, 3), (4, 5), (1, 2),
    (3, 4),
];

/// The 128-bit sort key of an event.
#[inline(always)]
fn key(at: Nanos, payload: u64) -> u128 {
    (u128::from(at) << 64) | u128::from(payload)
}

/// Sorts `run` in descending order by the sorting network `pairs`, one for its length:
/// each pair `(i, j)`, `i < j`, puts the greater of events `i` and `j` at `i`, by
/// selection, not by a branch. A wheel's bucket holds a few events in no order, so a sort
/// that branches on its comparisons (the standard library's, for short slices an insertion
/// sort) mispredicts about one branch in three: on the what-if bench, 1.4 M of the 7.0 M
/// mispredictions cachegrind simulates for the 10 s run.
#[inline(always)]
fn network(run: &mut [(Nanos, u64)], pairs: &[(usize, usize)]) {
    for &(i, j) in pairs {
        if let (Some(&a), Some(&b)) = (run.get(i), run.get(j)) {
            let swap = key(a.0, a.1) < key(b.0, b.1);
            let (hi, lo) = if swap { (b, a) } else { (a, b) };
            if let Some(x) = run.get_mut(i) {
                *x = hi;
            }
            if let Some(y) = run.get_mut(j) {
                *y = lo;
            }
        }
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

    /// Delays on both sides of the wheel's horizon (34 ms), and a population that empties
    /// the wheel now and then: events move from the far side into the wheel, and the
    /// cursor jumps to the far side's earliest event, in the same order as a binary heap.
    #[test]
    fn events_beyond_the_horizon_pop_in_order() {
        matches_a_binary_heap(400_000_000, 3_000, 30_000, 5);
        matches_a_binary_heap(140_000_000, 20, 10_000, 6);
        matches_a_binary_heap(1 << 40, 5, 5_000, 7);
    }

    /// Twenty events to a bucket on average: buckets too long for the sorting networks
    /// pop in order too.
    #[test]
    fn crowded_buckets_pop_in_order() {
        matches_a_binary_heap(30_000_000, 20_000, 40_000, 8);
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
        q.clear();
        assert!(q.is_empty());
        q.push(7, 4);
        assert_eq!(q.pop(), Some((7, 4)));
        assert_eq!(q.pop(), None);
    }

    /// Every order of up to eight distinct events, and some with ties, comes out of
    /// `sort_descending` in descending order.
    #[test]
    fn short_runs_sort_descending_in_any_order() {
        fn permutations(n: usize) -> Vec<Vec<usize>> {
            if n == 0 {
                return vec![vec![]];
            }
            let mut all = Vec::new();
            for p in permutations(n - 1) {
                for at in 0..=p.len() {
                    let mut q = p.clone();
                    q.insert(at, n - 1);
                    all.push(q);
                }
            }
            all
        }
        for n in 0..=8 {
            for p in permutations(n) {
                // Times with ties (i / 2), broken by the payload (i % 3): every key distinct,
                // as the queue's are (equal events could not be told apart anyway).
                let mut run: Vec<(Nanos, u64)> = p
                    .iter()
                    .map(|&i| ((i / 2) as u64, (i % 3) as u64))
                    .collect();
                let mut expected = run.clone();
                expected.sort_unstable_by(|a, b| b.cmp(a));
                sort_descending(&mut run);
                assert_eq!(run, expected, "{p:?}");
            }
        }
    }

    #[test]
    fn pack_round_trips_at_the_edges() {
        for (k, s, o) in [(0, 0, 0), (15, MAX_SLOT, u32::MAX), (7, 12345, 678)] {
            assert_eq!(unpack(pack(k, s, o)), (k, s, o));
        }
        assert_eq!(unpack(u64::MAX).0, 15);
    }
}
