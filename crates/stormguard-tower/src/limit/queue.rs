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
//!
//! # Late binding: a freed slot is held, then given to the newest waiter
//!
//! A limit that keeps its server busy keeps a queue behind it: one worker needs a request
//! waiting for the moment it finishes, or it idles through every hand-over (the wake-ups
//! between a released slot and the next request's work: a tenth of a 2 ms handler's time).
//! A request admitted into that queue waits the whole service time of the one ahead of it,
//! and doubles its latency. Which request waits there matters, not that one does: so while
//! the limiter's round trips show a queue behind the limit (the expected round trip at
//! least a quarter above the no-load one), a slot that comes free is not handed out at
//! once when another request is in flight to keep the server busy meanwhile. The queue
//! holds it, its round trip timed from the moment it came free (the limiter sees the same
//! slot times as if a request waited behind the limit, so its limit stays where it was), for
//! three quarters of the queueing the round trips show (at most of one no-load round trip:
//! a round trip stretched by something else than a queue must not hold slots), then gives it
//! to the newest waiter, who reaches the worker shortly before the request ahead finishes.
//! The worker keeps a request waiting for it, for a quarter of a service time instead of a
//! whole one, and the request that waits is one that arrived moments ago. Waiters joining
//! while a slot is held may wait until it is given, a quarter of the queueing longer (the
//! ones not picked then leave: the newest are served first).
//!
//! The round trips that show the queue are the last window's, and a window run below the
//! current limit shows none: Vegas's probe of its no-load round trip runs two windows at
//! half the limit (a limit of 1 for one worker), and a limit cut for a window grows back
//! the next. The limit back where a queue was seen keeps it, so slots are held (for three
//! quarters of a no-load round trip, the most the rule holds them) until a window at that
//! limit or above shows no queue; were they handed out at once, every request of that window
//! would wait a whole service time (`tests/limit_one_worker.rs`: the admitted p99 4.4 ms
//! instead of 3.8).
//!
//! Three things give a held slot out, whichever comes first: the layer's timer at the end
//! of the hold; a waiter joining after that end (tokio's timers count whole milliseconds,
//! arrivals do not); and another request finishing, which shows a worker free at once (a
//! request whose work was short, say): the held slot goes to the newest waiter then, and the
//! slot just freed is held in its place. At most one slot is held at a time, so a large
//! server, whose queue behind the limit is a few requests among many workers, barely
//! notices.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
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
    /// A slot held for late binding (see [the module docs](self#late-binding-a-freed-slot-is-held-then-given-to-the-newest-waiter)).
    held: Option<Held>,
}

/// A freed slot the queue holds until `bind_at`, then gives to its newest waiter.
#[derive(Debug)]
struct Held {
    /// Timed from when the slot came free.
    ticket: Ticket,
    bind_at: Instant,
    /// How much longer than `bind_at` a waiter joining meanwhile may wait.
    lead: Duration,
}

/// How long to hold a freed slot, and the lead left before the request ahead is expected to
/// finish, when the limiter's round trips show a queue behind the limit and another request
/// is in flight to keep the server busy meanwhile (see
/// [the module docs](self#late-binding-a-freed-slot-is-held-then-given-to-the-newest-waiter));
/// `None`: hand it out at once. The slot being freed is still counted in flight.
///
/// `queue_seen_at` is the lowest limit at which the round trips showed a queue behind it
/// (0: none), kept until a window at that limit or above shows none. A window run at a lower
/// limit than the current one (a probe of the no-load RTT, a window cut below the limit and
/// grown back) shows no queue, but says nothing of the one the current limit keeps: while the
/// limit is back at or above `queue_seen_at`, slots are held for the most the rule ever holds
/// them, three quarters of a no-load round trip (the queueing of one worker behind a limit of
/// 2; a larger server's was less, and a stale mark costs one window of one held slot).
fn hold_for(limiter: &Limiter, queue_seen_at: &AtomicU32) -> Option<(Duration, Duration)> {
    if limiter.in_flight() < 2 {
        return None;
    }
    let no_load = limiter.no_load_rtt()?;
    // One read: the limit and the round trips of the same window.
    let (window_limit, expected) = limiter.last_window()?;
    let measured = expected
        .checked_sub(no_load)
        .filter(|behind| !behind.is_zero() && *behind >= no_load / 4);
    let seen = queue_seen_at.load(Ordering::Relaxed);
    let behind = match measured {
        Some(behind) => {
            // The lowest limit seen with a queue, kept by whichever releaser stores last.
            queue_seen_at
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |seen| {
                    (seen == 0 || window_limit < seen).then_some(window_limit)
                })
                .ok();
            behind
        }
        // The last window ran below the limit at which a queue was seen, and the limit is
        // back up: the queue is still there.
        None if seen != 0 && window_limit < seen && seen <= limiter.limit() => no_load,
        None => {
            if seen != 0 && window_limit >= seen {
                // Only the mark this window disproves: a lower one stored meanwhile stays.
                let _ =
                    queue_seen_at.compare_exchange(seen, 0, Ordering::Relaxed, Ordering::Relaxed);
            }
            return None;
        }
    };
    // At most one service time: a round trip stretched by something else than a queue (a
    // slow dependency, a busy machine) must not hold slots longer than any request works.
    let behind = behind.min(no_load);
    let lead = behind / 4;
    Some((behind - lead, lead))
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
    /// Whether a slot is held, as of the last change: a release with nothing held and no
    /// queue behind the limit takes no lock either.
    held_hint: AtomicBool,
    /// The lowest limit at which the round trips showed a queue behind it, until a window at
    /// that limit or above shows none; 0: none (see [`hold_for`]).
    queue_seen_at: AtomicU32,
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
                held: None,
            }),
            len_hint: AtomicUsize::new(0),
            held_hint: AtomicBool::new(false),
            queue_seen_at: AtomicU32::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Joins the queue at `now` for a slot of `limiter` in `partition`, or `None` when it is
    /// full (or has no room at all). The wait allowed is capped by the limiter's round trips
    /// (none known yet: no cap).
    pub(super) fn join(&self, limiter: &Limiter, now: Instant, partition: usize) -> Option<Place> {
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
        let (expected, no_load) = (limiter.expected_rtt(), limiter.no_load_rtt());
        let mut patience = self.config.patience(standing, expected, no_load);
        let mut released = false;
        match state.held.take() {
            // The held slot is due: this waiter, the newest, gets it now.
            Some(held) if held.bind_at <= now => {
                released = bind_newest_or_forget(&mut state, held.ticket, limiter, now);
            }
            // A slot is held for the newest waiter: this one may be it.
            Some(held) => {
                let until_bound = held.bind_at.saturating_duration_since(now) + held.lead;
                patience = patience.max(until_bound);
                state.held = Some(held);
            }
            None => {}
        }
        self.publish_hints(&state);
        drop(state);
        if released {
            self.look(limiter, now);
        }
        Some(Place { slot, patience })
    }

    /// A waiter gave up at `now`, its patience spent: the queue stands.
    pub(super) fn gave_up(&self, now: Instant) {
        self.state().long_wait = Some(now);
    }

    /// An admitted request is done with its slot at `now`. If it ran (`outcome` is `Some`) a
    /// worker is free, so a slot held for later is due and goes to the newest waiter now.
    /// While the round trips show a queue behind the limit and no slot is held, the queue
    /// then holds the freed slot and the answer is the instant to call [`WaitQueue::bind`]
    /// with; otherwise it goes to a waiter if there is one (the newest while the queue
    /// stands), back to `limiter` if not. Its round trip is recorded with `outcome`, or not at
    /// all with `None` (the request did not run).
    #[must_use = "a held slot waits for `bind` at the instant returned"]
    pub(super) fn give_back(
        &self,
        limiter: &Limiter,
        ticket: Ticket,
        now: Instant,
        outcome: Option<Outcome>,
    ) -> Option<Instant> {
        if !self.held_hint.load(Ordering::Relaxed)
            && hold_for(limiter, &self.queue_seen_at).is_none()
        {
            // The common case, without the lock: nothing to bind, nothing to hold.
            self.hand_on(limiter, ticket, now, outcome);
            return None;
        }
        let mut state = self.state();
        let mut released = false;
        // A request that ran and finished shows a worker free; a slot given back unused
        // (its waiter gave up) shows nothing of the kind.
        if outcome.is_some()
            && let Some(held) = state.held.take()
        {
            released |= bind_newest_or_forget(&mut state, held.ticket, limiter, now);
        }
        // Decided with the held slot (if any) dealt with: it keeps no worker busy.
        let hold = if state.held.is_none() {
            hold_for(limiter, &self.queue_seen_at)
        } else {
            None
        };
        let mut bind_at = None;
        let ticket = match hold {
            Some((hold, lead)) => {
                let partition = ticket.partition();
                match limiter.pass_on(ticket, now, outcome, partition) {
                    Some(ticket) => {
                        state.held = Some(Held {
                            ticket,
                            bind_at: now + hold,
                            lead,
                        });
                        bind_at = Some(now + hold);
                    }
                    // The limit fell: the slot went back to the limiter.
                    None => released = true,
                }
                None
            }
            None => Some(ticket),
        };
        self.publish_hints(&state);
        drop(state);
        match ticket {
            Some(ticket) => self.hand_on(limiter, ticket, now, outcome),
            None if released => self.look(limiter, now),
            None => {}
        }
        bind_at
    }

    /// Gives a freed slot to a waiter if there is one (the newest while the queue stands),
    /// back to `limiter` if not.
    fn hand_on(&self, limiter: &Limiter, ticket: Ticket, now: Instant, outcome: Option<Outcome>) {
        if self.len_hint.load(Ordering::SeqCst) > 0 {
            self.admit(limiter, Some((ticket, outcome)), now);
        } else {
            self.release_and_look(limiter, ticket, now, outcome);
        }
    }

    /// Gives the slot held until `due` (the instant [`WaitQueue::give_back`] returned), if it
    /// is still held, to the newest waiter at `now`, or back to `limiter` when nobody waits.
    /// The layer calls it from a timer; a waiter joining after `due` is given the slot as it
    /// joins, and a request finishing first gives it to the newest waiter then (a worker is
    /// free).
    pub(super) fn bind(&self, limiter: &Limiter, now: Instant, due: Instant) {
        let mut state = self.state();
        let Some(held) = state.held.take_if(|held| held.bind_at == due) else {
            return;
        };
        let released = bind_newest_or_forget(&mut state, held.ticket, limiter, now);
        self.publish_hints(&state);
        drop(state);
        if released {
            self.look(limiter, now);
        }
    }

    /// Publishes the waiters' count and whether a slot is held, for the lock-free checks of
    /// a release; called before the lock on `state` is dropped.
    fn publish_hints(&self, state: &State) {
        self.len_hint.store(state.waiters.len(), Ordering::SeqCst);
        self.held_hint
            .store(state.held.is_some(), Ordering::Relaxed);
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
        self.look(limiter, now);
    }

    /// Hands free slots to waiters, if any joined.
    fn look(&self, limiter: &Limiter, now: Instant) {
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
        self.publish_hints(&state);
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

/// Hands `ticket`, a held slot, to the newest waiter still waiting in `state`, or gives
/// it back to `limiter` when nobody waits; `true` when the slot went back (the caller
/// looks for waiters once the lock is dropped). In the waiter's partition the round trip
/// goes on from when the slot came free; moved to another partition, it is timed from
/// `now`.
fn bind_newest_or_forget(
    state: &mut State,
    ticket: Ticket,
    limiter: &Limiter,
    now: Instant,
) -> bool {
    let mut ticket = ticket;
    while let Some(waiter) = state.waiters.pop_back() {
        if waiter.slot.is_closed() {
            continue;
        }
        let handed = if ticket.partition() == waiter.partition {
            ticket
        } else if let Some(handed) = limiter.pass_on(ticket, now, None, waiter.partition) {
            handed
        } else {
            // The limit fell: the slot went back to the limiter, and the waiter waits on.
            state.waiters.push_back(waiter);
            return true;
        };
        match waiter.slot.send(handed) {
            Ok(()) => return false,
            // It stopped waiting just now: the next newest.
            Err(back) => ticket = back,
        }
    }
    limiter.forget(ticket);
    true
}

/// Gives `ticket` back to `limiter`, with its round trip or (`None`) without.
fn release(limiter: &Limiter, ticket: Ticket, now: Instant, outcome: Option<Outcome>) {
    match outcome {
        Some(outcome) => limiter.release(ticket, now, outcome),
        None => limiter.forget(ticket),
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
