//! The queue's tests: its waits, its order, and late binding, under a manual clock.

use super::*;
use stormguard::clock::{Clock, ManualClock};
use stormguard::limit::{Aimd, LimiterConfig, Vegas};

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

fn join(queue: &WaitQueue, limiter: &Limiter, clock: &Clock) -> Place {
    queue.join(limiter, clock.now(), 0).expect("room")
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
    let mut waiter = join(&queue, &limiter, &clock);
    manual.advance(MS(2));
    assert_eq!(
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success)),
        None
    );
    // The waiter's task has not run yet: a request arriving now finds no free slot.
    assert!(limiter.try_acquire(0, clock.now()).is_err());
    assert_eq!(limiter.in_flight(), 1);
    let ticket = waiter.slot.try_recv().expect("the waiter holds the slot");
    assert_eq!(queue.len(), 0);
    assert_eq!(
        queue.give_back(&limiter, ticket, clock.now(), Some(Outcome::Success)),
        None
    );
    assert_eq!(
        limiter.in_flight(),
        0,
        "nobody waiting: the slot is free again"
    );
}

#[test]
fn a_slot_a_waiter_no_longer_wants_goes_on_to_the_next() {
    let (_manual, clock, limiter, running, queue) = one_slot_taken();
    let left = join(&queue, &limiter, &clock);
    let (mut shed, mut next) = (
        join(&queue, &limiter, &clock),
        join(&queue, &limiter, &clock),
    );
    // One caller left before the slot came...
    drop(left);
    assert_eq!(
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success)),
        None
    );
    // ...and one was shed (its deadline, say) just after it was handed the slot: it gives
    // the slot back without a round trip, as the layer's waiters do.
    shed.slot.close();
    let unused = shed.slot.try_recv().expect("it had been handed the slot");
    assert_eq!(queue.give_back(&limiter, unused, clock.now(), None), None);
    assert!(next.slot.try_recv().is_ok(), "the third waiter has it");
    assert_eq!((limiter.in_flight(), queue.len()), (1, 0));
    let mut last = join(&queue, &limiter, &clock);
    assert!(last.slot.try_recv().is_err(), "still waiting: no free slot");
}

#[test]
fn the_oldest_waiter_is_served_until_one_has_waited_the_target_then_the_newest() {
    let (manual, clock, limiter, running, queue) = one_slot_taken();
    let mut a = join(&queue, &limiter, &clock);
    manual.advance(MS(1));
    let mut b = join(&queue, &limiter, &clock);
    manual.advance(MS(1));
    let mut c = join(&queue, &limiter, &clock);
    assert_eq!(c.patience, MS(100), "a burst may wait the interval");
    // At 3 ms the oldest has waited less than the 5 ms target: oldest first.
    manual.advance(MS(1));
    assert_eq!(
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success)),
        None
    );
    let (first, running) = served(&mut [&mut a, &mut b, &mut c]);
    assert_eq!(first, 0);
    // At 7 ms the oldest (b) has waited 6 ms: the queue stands, the newest (c) goes first.
    manual.advance(MS(4));
    assert_eq!(
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success)),
        None
    );
    let (first, running) = served(&mut [&mut b, &mut c]);
    assert_eq!(first, 1);
    assert_eq!(
        join(&queue, &limiter, &clock).patience,
        MS(5),
        "a standing queue: the target"
    );
    // The old waiters are gone; an interval later, new ones are served oldest first again.
    drop(b);
    manual.advance(MS(101));
    let mut d = join(&queue, &limiter, &clock);
    manual.advance(MS(1));
    let mut e = join(&queue, &limiter, &clock);
    assert_eq!(
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success)),
        None
    );
    assert_eq!(served(&mut [&mut d, &mut e]).0, 0);
}

#[test]
fn a_waiter_that_gives_up_makes_the_queue_stand_for_an_interval() {
    let (manual, clock, limiter, running, queue) = one_slot_taken();
    let mut a = join(&queue, &limiter, &clock);
    manual.advance(MS(1));
    let mut b = join(&queue, &limiter, &clock);
    // Another waiter's patience ran out: the newest goes first.
    queue.gave_up(clock.now());
    assert_eq!(join(&queue, &limiter, &clock).patience, MS(5));
    manual.advance(MS(1));
    assert_eq!(
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success)),
        None
    );
    let (first, running) = served(&mut [&mut a, &mut b]);
    assert_eq!(first, 1);
    drop(a);
    manual.advance(MS(100));
    let mut c = join(&queue, &limiter, &clock);
    assert_eq!(
        c.patience,
        MS(100),
        "an interval without a long wait: no longer standing"
    );
    manual.advance(MS(1));
    let mut d = join(&queue, &limiter, &clock);
    assert_eq!(
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success)),
        None
    );
    assert_eq!(served(&mut [&mut c, &mut d]).0, 0);
}

/// A limit of 2 (Vegas, so that it knows a no-load round trip) whose round trips show a
/// queue behind it: 2 ms without, 4 ms expected. Both slots are taken.
fn one_slot_behind_a_queue() -> (ManualClock, Clock, Limiter, Ticket, WaitQueue) {
    one_slot_expecting(MS(4))
}

/// A Vegas limiter pinned at `limit`, closing a window at every release, that has seen a
/// 2 ms round trip (its no-load one) and then `expected`.
fn vegas_pinned_at(limit: u32, expected: Duration) -> (ManualClock, Clock, Limiter) {
    let manual = ManualClock::new();
    let clock = manual.clock();
    let vegas = Vegas::new().with_limits(limit, limit, limit);
    let limits = LimiterConfig::new(vegas).with_window(MS(1), 1);
    let limiter = Limiter::new(limits, &clock).expect("valid");
    for rtt in [MS(2), expected] {
        let ticket = limiter.try_acquire(0, clock.now()).expect("room");
        manual.advance(rtt);
        limiter.release(ticket, clock.now(), Outcome::Success);
    }
    (manual, clock, limiter)
}

/// A limit of 2 (Vegas pinned there) with a no-load round trip of 2 ms and `expected`
/// the last window's; both slots taken, one by a request that never finishes.
fn one_slot_expecting(expected: Duration) -> (ManualClock, Clock, Limiter, Ticket, WaitQueue) {
    let (manual, clock, limiter) = vegas_pinned_at(2, expected);
    assert_eq!(
        (limiter.no_load_rtt(), limiter.expected_rtt()),
        (Some(MS(2)), Some(expected))
    );
    let _never_finishes = limiter.try_acquire(0, clock.now()).expect("room");
    let running = limiter.try_acquire(0, clock.now()).expect("room");
    (manual, clock, limiter, running, WaitQueue::new(config()))
}

/// Two milliseconds of queueing behind the limit: the freed slot is held for three
/// quarters of them, then given to the newest waiter, not to the one that waited longest
/// nor to a newcomer meanwhile.
#[test]
fn a_slot_freed_over_a_queue_behind_the_limit_is_held_then_given_to_the_newest_waiter() {
    let (manual, clock, limiter, running, queue) = one_slot_behind_a_queue();
    let mut old = join(&queue, &limiter, &clock);
    manual.advance(MS(4));
    let bind_at = queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success));
    assert_eq!(bind_at, Some(clock.now() + Duration::from_micros(1_500)));
    assert!(old.slot.try_recv().is_err(), "held, not handed out");
    assert!(limiter.try_acquire(0, clock.now()).is_err(), "nor free");
    manual.advance(MS(1));
    let mut new = join(&queue, &limiter, &clock);
    assert_eq!(
        new.patience,
        Duration::from_micros(1_000),
        "until the slot is given (0.5 ms), and the lead (0.5 ms)"
    );
    manual.advance(Duration::from_micros(500));
    queue.bind(&limiter, clock.now(), bind_at.expect("held"));
    assert!(new.slot.try_recv().is_ok(), "the newest waiter has it");
    assert!(old.slot.try_recv().is_err());
    assert_eq!(limiter.in_flight(), 2);
}

/// Timers count whole milliseconds: a waiter joining once the held slot is due gets it
/// as it joins, before the timer fires.
#[test]
fn a_waiter_joining_after_the_held_slot_is_due_is_given_it_as_it_joins() {
    let (manual, clock, limiter, running, queue) = one_slot_behind_a_queue();
    manual.advance(MS(4));
    let bind_at = queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success));
    assert!(bind_at.is_some());
    manual.advance(MS(2));
    let mut late = join(&queue, &limiter, &clock);
    assert!(late.slot.try_recv().is_ok());
    // The timer then finds nothing held.
    queue.bind(&limiter, clock.now(), bind_at.expect("held"));
    assert_eq!((limiter.in_flight(), queue.len()), (2, 0));
}

#[test]
fn a_held_slot_nobody_waits_for_goes_back_to_the_limiter() {
    let (manual, clock, limiter, running, queue) = one_slot_behind_a_queue();
    manual.advance(MS(4));
    let bind_at = queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success));
    let left = join(&queue, &limiter, &clock);
    drop(left);
    manual.advance(MS(2));
    assert!(bind_at.is_some_and(|at| at <= clock.now()));
    queue.bind(&limiter, clock.now(), bind_at.expect("held"));
    assert_eq!(limiter.in_flight(), 1);
    assert!(limiter.try_acquire(0, clock.now()).is_ok(), "free again");
}

/// With no more queueing behind the limit than a quarter of a no-load round trip the
/// slot goes out at once, as before.
#[test]
fn a_slot_freed_without_a_queue_behind_the_limit_is_handed_out_at_once() {
    let (manual, clock, limiter, running, queue) = one_slot_expecting(Duration::from_micros(2_400));
    let mut waiter = join(&queue, &limiter, &clock);
    manual.advance(MS(2));
    assert_eq!(
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success)),
        None
    );
    assert!(waiter.slot.try_recv().is_ok());
}

/// Round trips stretched at a limit of 1 are no queue behind the limit (nothing else is in
/// flight; a busy machine, say): holding the only slot would idle the server, and stretch
/// the round trips further.
#[test]
fn a_slot_is_not_held_when_no_other_request_keeps_the_server_busy() {
    let (manual, clock, limiter) = vegas_pinned_at(1, MS(9));
    let queue = WaitQueue::new(config());
    let running = limiter.try_acquire(0, clock.now()).expect("room");
    let mut waiter = join(&queue, &limiter, &clock);
    manual.advance(MS(9));
    assert_eq!(
        queue.give_back(&limiter, running, clock.now(), Some(Outcome::Success)),
        None
    );
    assert!(waiter.slot.try_recv().is_ok());
}

/// A limit of 2 whose round trips show a queue behind it (2 ms without, 4 ms expected),
/// both slots taken.
fn two_slots_behind_a_queue() -> (ManualClock, Clock, Limiter, WaitQueue, [Ticket; 2]) {
    let (manual, clock, limiter) = vegas_pinned_at(2, MS(4));
    let taken = [(); 2].map(|()| limiter.try_acquire(0, clock.now()).expect("room"));
    (manual, clock, limiter, WaitQueue::new(config()), taken)
}

/// A request finishing while a slot is held means a worker is free: the held slot goes to
/// the newest waiter then, before its timer, and the slot just freed is held in its place;
/// the first slot's timer then finds nothing of its own to bind.
#[test]
fn a_release_gives_the_held_slot_to_the_newest_waiter_and_holds_its_own() {
    let (manual, clock, limiter, queue, [a, b]) = two_slots_behind_a_queue();
    manual.advance(MS(4));
    let first = queue.give_back(&limiter, a, clock.now(), Some(Outcome::Success));
    let first = first.expect("held");
    let mut waiter = join(&queue, &limiter, &clock);
    manual.advance(Duration::from_micros(500));
    let second = queue.give_back(&limiter, b, clock.now(), Some(Outcome::Success));
    let second = second.expect("held in its place");
    assert_ne!(first, second);
    assert!(waiter.slot.try_recv().is_ok(), "given before its timer");
    queue.bind(&limiter, first, first);
    let mut next = join(&queue, &limiter, &clock);
    assert!(
        next.slot.try_recv().is_err(),
        "the second slot is still held"
    );
    queue.bind(&limiter, clock.now(), second);
    assert!(next.slot.try_recv().is_ok());
    assert_eq!(limiter.in_flight(), 2);
}

/// A slot given back unused (its waiter gave up) shows no worker free: it goes to a waiter
/// as any free slot does, and the held slot stays held until its time.
#[test]
fn a_slot_given_back_unused_leaves_the_held_slot_alone() {
    let (manual, clock, limiter, queue, [a, b]) = two_slots_behind_a_queue();
    manual.advance(MS(4));
    let due = queue.give_back(&limiter, a, clock.now(), Some(Outcome::Success));
    let due = due.expect("held");
    let mut waiter = join(&queue, &limiter, &clock);
    assert_eq!(queue.give_back(&limiter, b, clock.now(), None), None);
    assert!(
        waiter.slot.try_recv().is_ok(),
        "the unused slot went to the waiter"
    );
    assert_eq!(limiter.in_flight(), 2, "the waiter's and the held one");
    queue.bind(&limiter, clock.now(), due);
    assert_eq!(
        limiter.in_flight(),
        1,
        "nobody waited for the held one at its time"
    );
}

/// A Vegas limit of 2 that probes its no-load round trip at a limit of 1 every third
/// window, each release closing a window.
fn vegas_probing() -> (ManualClock, Clock, Limiter) {
    let manual = ManualClock::new();
    let clock = manual.clock();
    let vegas = Vegas::new()
        .with_limits(1, 2, 2)
        .with_slow_start(false)
        .with_probe(3, 1);
    let limits = LimiterConfig::new(vegas).with_window(MS(1), 1);
    let limiter = Limiter::new(limits, &clock).expect("valid");
    (manual, clock, limiter)
}

/// One request taking `rtt` at a time, a window each.
fn windows(manual: &ManualClock, clock: &Clock, limiter: &Limiter, rtts: &[u64]) {
    for &rtt in rtts {
        let ticket = limiter.try_acquire(0, clock.now()).expect("room");
        manual.advance(MS(rtt));
        limiter.release(ticket, clock.now(), Outcome::Success);
    }
}

/// Whether a slot freed with both slots taken would be held, and for how long.
fn would_hold(limiter: &Limiter, clock: &Clock, seen: &AtomicU32) -> Option<(Duration, Duration)> {
    let tickets = [(); 2].map(|()| limiter.try_acquire(0, clock.now()).expect("room"));
    let hold = hold_for(limiter, seen);
    for ticket in tickets {
        limiter.forget(ticket);
    }
    hold
}

/// A probe of the no-load round trip runs two windows at a limit of 1, where nothing
/// waits: the window that restores the limit of 2 shows no queue, yet the limit keeps one
/// as before the probe, and the slots are held (for three quarters of a no-load round trip,
/// the most the rule holds them). A window at the limit of 2 that shows none ends it.
#[test]
fn a_limit_back_from_a_probe_keeps_holding_until_a_window_at_it_shows_no_queue() {
    let (manual, clock, limiter) = vegas_probing();
    let seen = AtomicU32::new(0);
    windows(&manual, &clock, &limiter, &[2, 3]);
    assert_eq!(limiter.last_window(), Some((2, MS(3))));
    let us = Duration::from_micros;
    assert_eq!(
        would_hold(&limiter, &clock, &seen),
        Some((us(750), us(250))),
        "a millisecond of queueing"
    );
    assert_eq!(seen.load(Ordering::Relaxed), 2);
    // The probe: a window at 2 starts it, two at 1 measure, the limit is back at 2.
    windows(&manual, &clock, &limiter, &[3, 3, 2]);
    assert_eq!(
        (limiter.limit(), limiter.last_window()),
        (2, Some((1, MS(2))))
    );
    assert_eq!(
        would_hold(&limiter, &clock, &seen),
        Some((us(1_500), us(500))),
        "still held"
    );
    windows(&manual, &clock, &limiter, &[2]);
    assert_eq!(limiter.last_window(), Some((2, MS(2))));
    assert_eq!(would_hold(&limiter, &clock, &seen), None);
    assert_eq!(seen.load(Ordering::Relaxed), 0, "forgotten");
}
