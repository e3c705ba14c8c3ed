//! The short queue in front of the limit: CoDel-style waiting times, adaptive LIFO, and
//! slots handed straight to the waiters.
//!
//! From Facebook's "Fail at Scale" (Maurer, ACM Queue 2015), after Nichols & Jacobson's CoDel:
//! a queue absorbing a burst lets a request wait up to `interval`; a *standing* queue, the mark
//! of an overloaded server, lets it wait only `target` before it is shed. While the queue
//! stands, the newest waiter is served first (adaptive LIFO): the oldest have the least time
//! left and their callers are the likeliest to have given up.
//!
//! # Standing, judged by the waiters' sojourn
//!
//! The queue stands from the moment a waiter is seen to have waited long — its whole patience
//! (it gave up), or CoDel's `target` (the oldest waiter, when a slot is handed over) — until
//! `interval` passes without another. Whether the queue ever empties says little in front of a
//! small limit: at a limit of 1 it empties between most arrivals even at three times the
//! capacity, and a queue judged by that never stands, so it keeps serving its oldest waiter,
//! one that has waited nearly its whole patience. Under LIFO the oldest waiters keep giving up,
//! so the queue stands for as long as the overload lasts.
//!
//! # No overtaking
//!
//! A finished request's slot goes straight to the waiter the queue picks
//! ([`Limiter::pass_on`]), without coming free: were it given back to the limiter and the
//! waiter woken to take it, a request arriving before the woken waiter ran would take it, and
//! the waiter would wait another service time. A waiter woken by a raised limit takes a free
//! slot the usual way.
//!
//! # How long a waiter may wait
//!
//! Both waits are also capped by what the limiter knows of its round trips. An admitted
//! request should wait about one no-load round trip at most, queue in front of the limit and
//! queue behind it together (Vegas's RTT tolerance of 2 says the same of the queue behind
//! it): with the limiter's expected round trip (the last window's mean) and its no-load round
//! trip, the queue in front gets what is left, `2 × no_load − expected`, in either mode. A
//! limit that already keeps one service time of queue behind it leaves none: its server is
//! busy without waiters, and a waiter would double the latency the limit protects. Without a
//! no-load estimate (AIMD, Gradient2) the cap is one expected round trip, and a burst may
//! always wait `target`. With a 2 ms handler a standing queue then holds requests for about
//! one round trip at most instead of CoDel's fixed 5 ms (100 ms while bursting).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use stormguard::classify::Outcome;
use stormguard::limit::{Limiter, Ticket};
use tokio::sync::oneshot;

/// The queue's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct QueueConfig {
    pub(super) capacity: usize,
    pub(super) target: Duration,
    pub(super) interval: Duration,
}

impl QueueConfig {
    /// How long a request joining the queue may wait: CoDel's `target` while the queue
    /// stands, its `interval` while it absorbs a burst, capped by the limiter's round trips
    /// (see [the module docs](self)): `expected` is what an admitted request currently takes,
    /// `no_load` what it takes without a queue.
    fn patience(
        &self,
        standing: bool,
        expected: Option<Duration>,
        no_load: Option<Duration>,
    ) -> Duration {
        let codel = if standing { self.target } else { self.interval };
        match (expected, no_load) {
            (Some(expected), Some(no_load)) => {
                codel.min(no_load.saturating_mul(2).saturating_sub(expected))
            }
            (Some(round_trip), None) if standing => codel.min(round_trip),
            (Some(round_trip), None) => codel.min(round_trip.max(self.target)),
            (None, _) => codel,
        }
    }
}

/// A request waiting for a slot.
#[derive(Debug)]
struct Waiter {
    slot: oneshot::Sender<Ticket>,
    partition: usize,
    joined: Instant,
}

#[derive(Debug)]
struct State {
    /// Oldest first.
    waiters: VecDeque<Waiter>,
    /// When a waiter was last seen to have waited long (see [the module docs](self)).
    long_wait: Option<Instant>,
}

impl State {
    fn standing(&self, now: Instant, interval: Duration) -> bool {
        self.long_wait
            .is_some_and(|at| now.saturating_duration_since(at) <= interval)
    }
}

/// Requests waiting for a slot.
#[derive(Debug)]
pub(super) struct WaitQueue {
    config: QueueConfig,
    state: Mutex<State>,
    /// The waiters' count as of the last change: a release with nobody waiting takes no lock.
    len_hint: AtomicUsize,
}

/// A place in the queue: wait on `slot` for at most `patience`. A ticket sent after the
/// waiter stopped waiting is its to give back (close `slot`, then look in it).
pub(super) struct Place {
    pub(super) slot: oneshot::Receiver<Ticket>,
    pub(super) patience: Duration,
}

impl WaitQueue {
    pub(super) fn new(config: QueueConfig) -> Self {
        WaitQueue {
            config,
            state: Mutex::new(State {
                waiters: VecDeque::with_capacity(config.capacity),
                long_wait: None,
            }),
            len_hint: AtomicUsize::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Joins the queue at `now` for a slot in `partition`, or `None` when it is full (or has
    /// no room at all). `expected` and `no_load` are the limiter's round trips (none known
    /// yet: no cap).
    pub(super) fn join(
        &self,
        now: Instant,
        partition: usize,
        expected: Option<Duration>,
        no_load: Option<Duration>,
    ) -> Option<Place> {
        if self.config.capacity == 0 {
            return None;
        }
        let mut state = self.state();
        state.waiters.retain(|w| !w.slot.is_closed());
        if state.waiters.len() >= self.config.capacity {
            return None;
        }
        let standing = state.standing(now, self.config.interval);
        let (tx, slot) = oneshot::channel();
        state.waiters.push_back(Waiter {
            slot: tx,
            partition,
            joined: now,
        });
        self.len_hint.store(state.waiters.len(), Ordering::SeqCst);
        Some(Place {
            slot,
            patience: self.config.patience(standing, expected, no_load),
        })
    }

    /// A waiter gave up at `now`, its patience spent: the queue stands.
    pub(super) fn gave_up(&self, now: Instant) {
        self.state().long_wait = Some(now);
    }

    /// An admitted request is done with its slot at `now`: it goes to a waiter if there is
    /// one (the newest while the queue stands), back to `limiter` otherwise. Its round trip
    /// is recorded with `outcome`, or not at all with `None` (the request did not run).
    pub(super) fn give_back(
        &self,
        limiter: &Limiter,
        ticket: Ticket,
        now: Instant,
        outcome: Option<Outcome>,
    ) {
        if self.len_hint.load(Ordering::SeqCst) > 0 {
            return self.admit(limiter, Some((ticket, outcome)), now);
        }
        self.release_and_look(limiter, ticket, now, outcome);
    }

    /// Gives `ticket` back to `limiter`, then looks for waiters once more: a request refused
    /// a moment ago may have joined as the slot came free (after the last look), and it must
    /// not wait for the next slot.
    fn release_and_look(
        &self,
        limiter: &Limiter,
        ticket: Ticket,
        now: Instant,
        outcome: Option<Outcome>,
    ) {
        release(limiter, ticket, now, outcome);
        if self.len_hint.load(Ordering::SeqCst) > 0 {
            self.admit(limiter, None, now);
        }
    }

    /// Hands `slot` to the next waiter, then free slots (a raised limit's) to the next ones
    /// while the limiter has room; a slot left over goes back to `limiter`.
    fn admit(&self, limiter: &Limiter, mut slot: Option<(Ticket, Option<Outcome>)>, now: Instant) {
        let mut state = self.state();
        while state.waiters.front().is_some_and(|w| w.slot.is_closed()) {
            state.waiters.pop_front();
        }
        let oldest_waited = state
            .waiters
            .front()
            .map(|w| now.saturating_duration_since(w.joined));
        if oldest_waited.is_some_and(|waited| waited >= self.config.target) {
            state.long_wait = Some(now);
        }
        let newest_first = state.standing(now, self.config.interval);
        loop {
            let next = if newest_first {
                state.waiters.pop_back()
            } else {
                state.waiters.pop_front()
            };
            let Some(waiter) = next else { break };
            if waiter.slot.is_closed() {
                continue;
            }
            let ticket = match slot.take() {
                Some((ticket, outcome)) => limiter.pass_on(ticket, now, outcome, waiter.partition),
                None => limiter.try_acquire(waiter.partition, now).ok(),
            };
            let Some(ticket) = ticket else {
                if newest_first {
                    state.waiters.push_back(waiter);
                } else {
                    state.waiters.push_front(waiter);
                }
                break;
            };
            if let Err(ticket) = waiter.slot.send(ticket) {
                // It stopped waiting just now: the slot goes on, with nothing more recorded.
                slot = Some((ticket, None));
            }
        }
        self.len_hint.store(state.waiters.len(), Ordering::SeqCst);
        drop(state);
        if let Some((ticket, outcome)) = slot {
            // Every waiter had gone; one may have joined since the lock was dropped.
            self.release_and_look(limiter, ticket, now, outcome);
        }
    }

    /// Waiters (some may have given up).
    pub(super) fn len(&self) -> usize {
        self.len_hint.load(Ordering::Relaxed)
    }
}

/// Gives `ticket` back to `limiter`, with its round trip or (`None`) without.
fn release(limiter: &Limiter, ticket: Ticket, now: Instant, outcome: Option<Outcome>) {
    match outcome {
        Some(outcome) => limiter.release(ticket, now, outcome),
        None => limiter.forget(ticket),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stormguard::clock::{Clock, ManualClock};
    use stormguard::limit::{Aimd, LimiterConfig};

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn config() -> QueueConfig {
        QueueConfig {
            capacity: 8,
            target: MS(5),
            interval: MS(100),
        }
    }

    #[test]
    fn without_a_known_round_trip_the_waits_are_codels() {
        assert_eq!(config().patience(false, None, None), MS(100));
        assert_eq!(config().patience(true, None, None), MS(5));
    }

    #[test]
    fn a_short_round_trip_caps_both_waits_but_a_burst_keeps_the_target() {
        assert_eq!(config().patience(false, Some(MS(2)), None), MS(5));
        assert_eq!(config().patience(true, Some(MS(2)), None), MS(2));
        assert_eq!(config().patience(false, Some(MS(20)), None), MS(20));
        assert_eq!(config().patience(true, Some(MS(20)), None), MS(5));
    }

    #[test]
    fn a_long_round_trip_leaves_codels_waits() {
        assert_eq!(config().patience(false, Some(MS(500)), None), MS(100));
        assert_eq!(config().patience(true, Some(MS(500)), None), MS(5));
    }

    /// A 2 ms handler: with no queue behind the limit (the expected round trip is the no-load
    /// one) a waiter may wait one round trip, burst or not; with half a round trip of queue
    /// behind it, half; with a whole one (one worker behind a limit of 2), none.
    #[test]
    fn the_queue_gets_what_the_queue_behind_the_limit_leaves_of_one_no_load_round_trip() {
        let no_load = Some(MS(2));
        for standing in [false, true] {
            assert_eq!(config().patience(standing, Some(MS(2)), no_load), MS(2));
            assert_eq!(config().patience(standing, Some(MS(3)), no_load), MS(1));
            assert_eq!(config().patience(standing, Some(MS(4)), no_load), MS(0));
            assert_eq!(config().patience(standing, Some(MS(9)), no_load), MS(0));
        }
        // A slow handler: CoDel's waits are shorter than the budget.
        assert_eq!(config().patience(true, Some(MS(50)), Some(MS(50))), MS(5));
        assert_eq!(
            config().patience(false, Some(MS(500)), Some(MS(500))),
            MS(100)
        );
    }

    /// A limit of 1 with its slot taken, and an empty queue, all under a manual clock.
    fn one_slot_taken() -> (ManualClock, Clock, Limiter, Ticket, WaitQueue) {
        let manual = ManualClock::new();
        let clock = manual.clock();
        let one = LimiterConfig::new(Aimd::new().with_limits(1, 1, 1));
        let limiter = Limiter::new(one, &clock).expect("valid");
        let running = limiter.try_acquire(0, clock.now()).expect("room");
        (manual, clock, limiter, running, WaitQueue::new(config()))
    }

    fn join(queue: &WaitQueue, clock: &Clock) -> Place {
        queue.join(clock.now(), 0, None, None).expect("room")
    }

    /// Which of `places` got the slot (the others are left waiting), and its ticket.
    fn served(places: &mut [&mut Place]) -> (usize, Ticket) {
        let mut got: Vec<(usize, Ticket)> = (0..places.len())
            .filter_map(|i| places[i].slot.try_recv().ok().map(|t| (i, t)))
            .collect();
        assert_eq!(got.len(), 1, "one waiter served");
        got.remove(0)
    }

    #[test]
    fn a_freed_slot_goes_to_the_waiter_and_never_to_a_newcomer() {
        let (manual, clock, limiter, running, queue) = one_slot_taken();
        let mut waiter = join(&queue, &clock);
        manual.advance(MS(2));
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success));
        // The waiter's task has not run yet: a request arriving now finds no free slot.
        assert!(limiter.try_acquire(0, clock.now()).is_err());
        assert_eq!(limiter.in_flight(), 1);
        let ticket = waiter.slot.try_recv().expect("the waiter holds the slot");
        assert_eq!(queue.len(), 0);
        queue.give_back(&limiter, ticket, clock.now(), Some(Outcome::Success));
        assert_eq!(
            limiter.in_flight(),
            0,
            "nobody waiting: the slot is free again"
        );
    }

    #[test]
    fn a_slot_a_waiter_no_longer_wants_goes_on_to_the_next() {
        let (_manual, clock, limiter, running, queue) = one_slot_taken();
        let left = join(&queue, &clock);
        let (mut shed, mut next) = (join(&queue, &clock), join(&queue, &clock));
        // One caller left before the slot came...
        drop(left);
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success));
        // ...and one was shed (its deadline, say) just after it was handed the slot: it gives
        // the slot back without a round trip, as the layer's waiters do.
        shed.slot.close();
        let unused = shed.slot.try_recv().expect("it had been handed the slot");
        queue.give_back(&limiter, unused, clock.now(), None);
        assert!(next.slot.try_recv().is_ok(), "the third waiter has it");
        assert_eq!((limiter.in_flight(), queue.len()), (1, 0));
        let mut last = join(&queue, &clock);
        assert!(last.slot.try_recv().is_err(), "still waiting: no free slot");
    }

    #[test]
    fn the_oldest_waiter_is_served_until_one_has_waited_the_target_then_the_newest() {
        let (manual, clock, limiter, running, queue) = one_slot_taken();
        let mut a = join(&queue, &clock);
        manual.advance(MS(1));
        let mut b = join(&queue, &clock);
        manual.advance(MS(1));
        let mut c = join(&queue, &clock);
        assert_eq!(c.patience, MS(100), "a burst may wait the interval");
        // At 3 ms the oldest has waited less than the 5 ms target: oldest first.
        manual.advance(MS(1));
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success));
        let (first, running) = served(&mut [&mut a, &mut b, &mut c]);
        assert_eq!(first, 0);
        // At 7 ms the oldest (b) has waited 6 ms: the queue stands, the newest (c) goes first.
        manual.advance(MS(4));
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success));
        let (first, running) = served(&mut [&mut b, &mut c]);
        assert_eq!(first, 1);
        assert_eq!(
            join(&queue, &clock).patience,
            MS(5),
            "a standing queue: the target"
        );
        // The old waiters are gone; an interval later, new ones are served oldest first again.
        drop(b);
        manual.advance(MS(101));
        let mut d = join(&queue, &clock);
        manual.advance(MS(1));
        let mut e = join(&queue, &clock);
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success));
        assert_eq!(served(&mut [&mut d, &mut e]).0, 0);
    }

    #[test]
    fn a_waiter_that_gives_up_makes_the_queue_stand_for_an_interval() {
        let (manual, clock, limiter, running, queue) = one_slot_taken();
        let mut a = join(&queue, &clock);
        manual.advance(MS(1));
        let mut b = join(&queue, &clock);
        // Another waiter's patience ran out: the newest goes first.
        queue.gave_up(clock.now());
        assert_eq!(join(&queue, &clock).patience, MS(5));
        manual.advance(MS(1));
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success));
        let (first, running) = served(&mut [&mut a, &mut b]);
        assert_eq!(first, 1);
        drop(a);
        manual.advance(MS(100));
        let mut c = join(&queue, &clock);
        assert_eq!(
            c.patience,
            MS(100),
            "an interval without a long wait: no longer standing"
        );
        manual.advance(MS(1));
        let mut d = join(&queue, &clock);
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success));
        assert_eq!(served(&mut [&mut c, &mut d]).0, 0);
    }
}
