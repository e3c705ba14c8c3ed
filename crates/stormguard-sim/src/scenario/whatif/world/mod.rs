//! The event loop: requests at services, calls between them driven by the core's
//! [`RetryRun`], budgets and breakers.
//!
//! Events are few on purpose (the run's cost is its events): a request that starts work
//! schedules one `DONE` at its end; a call's attempt needs a timer only when its answer is
//! not already known to come in time, and the attempts whose deadline is their per-try
//! timeout share one `TIMER` per call of the graph (their deadlines come in sending order, so
//! a FIFO holds them and an attempt answered in time costs no event); any other deadline is
//! a `TIMEOUT` of its own; a retry's wait is a `RETRY`. Everything that
//! follows from one event at the same instant (a reply going up several layers, the next
//! call of a request, the next request out of a queue) is worked through a stack of steps
//! in the same event, never by recursion, so a deep graph cannot overflow the stack.
//!
//! # Cost
//!
//! Nearly every event is a request's `DONE`, so the run's cost is what one request costs
//! from its arrival to its answer, and the loop is written for that path:
//!
//! - one handler ([`World::handle`]) takes every `DONE`, `RETRY` and `TIMEOUT` and holds the
//!   step loop with the per-request code inlined into it (one function, no calls between the
//!   steps of a request), except a request's arrival ([`World::arrive`]), which costs fewer
//!   instructions as a function of its own than spread over the loop's registers;
//! - a step handler returns the step that comes *next* instead of pushing it (the stack
//!   would pop it at once anyway), so only steps that wait for others (a freed worker
//!   behind a reply) touch the stack, and the order is exactly the stack's;
//! - what always follows at once is called, not returned as a step: a request going on
//!   makes its next call, a call sends its attempt, a call that succeeded lets its request
//!   go on (the calls form no cycle — a failed call is [`World::fail_call`], apart from
//!   the successful end — so all of them are inlined into one loop); only a reply going up
//!   to the caller is a step, which bounds the native stack whatever the graph's depth;
//! - the faults in force at a service are kept until their next change point ([`faults`]),
//!   and read once for a request that gets a worker as it arrives; each call of the graph
//!   carries its per-try timeout in nanoseconds;
//! - latencies are counted in buckets of our own, the histogram's own bounds (no finer:
//!   the counts are hit in no order, so their size is what stays in cache), and handed to
//!   the HDR histogram only for the report ([`latency`](super::latency));
//! - a request's work is drawn from the few straight segments of its endpoint's quantile
//!   function ([`Segments`](super::model::Segments)), not from a table of it at every
//!   1/1000: the tables (16 KiB an endpoint) did not fit in the first-level cache, and the
//!   load of a random entry took 14 % of the bench's time samples (the 120 s bench: 2.04 to
//!   2.20 s -> 1.80 to 1.94 s in paired runs; under callgrind, 1.8 % more instructions and
//!   18 % fewer first-level data misses);
//! - the bench's cost is as much its first-level cache misses as its instructions (the
//!   slots of the requests in flight and the latency counts are touched in no order and do
//!   not all fit), so a request and the call it is making are
//!   one record of one cache line ([`Request`]): the end of its work reads it, its call
//!   is written into it, and the reply to that call reads it again and goes on with it
//!   (what only a call that did not succeed at once, or one through a breaker, needs is
//!   kept apart, in [`Held`]). As a request with a call state of its own (120 bytes over two
//!   or three cache lines, at the same slot number) it took 75 % more misses (11.6 M against
//!   6.6 M on the 10 s bench) for 2.9 % fewer instructions (708 M against 729 M);
//! - what a step has looked up, it hands on rather than have the next step look it up
//!   again: a request whose work ended makes its next call with the slot `done` read
//!   ([`calls::next_of`]), a call makes its first attempt with its request and edge at
//!   hand (`send`, which looks both up, is for retries), and a call whose first attempt
//!   succeeded ends, and its request goes on, where `decide` read it (together about 2.3 %
//!   of the bench's instructions);
//! - neither the event queue nor the slab keeps a count of what it holds (asked only by
//!   tests, they count when asked: two instructions per event and per request), and the
//!   queue's buckets are a fixed-size array, filed into with no bounds check (about 0.6 %);
//! - slab slots are written and dropped where they lie, never copied in or out: a request
//!   that gets a worker at once is built in its slot ([`Slab::insert_with`] calls the
//!   builder where the value goes; built aside and moved in, it cost a copy of the record,
//!   48 bytes then, and 1.3 % of the bench's instructions) and set to work there, and a
//!   slab's free list lives in its free slots;
//! - [`World::arrive`] returns one register, when the answer is known to come ([`NEVER`]:
//!   not known). The rare refusal pushes its reply on the stack instead of returning it
//!   beside the time: nothing else is pushed before the arrival's caller hands back to the
//!   step loop, which pops it next, exactly where a returned step would have been worked
//!   on (the pair came back through memory, about 2 % of the bench's instructions);
//! - whether a service honours deadlines is kept as a mask OR-ed into the deadline a
//!   request brings ([`NEVER`] where it does not), not a flag to branch on (about 0.8 % of
//!   the bench's instructions);
//! - a `DONE` event carries no generation to check, since it is never stale: a request's
//!   slot is freed only after its `DONE` was handled (its calls start after its work ends,
//!   and one waiting for a worker has no `DONE` yet). Its payload's operand is 0, which
//!   changes no tie: two `DONE` events of one slot are never pending at once (about 1.5 %
//!   of the bench's instructions);
//! - each service counts into a field for the time bin the loop is in, added to its
//!   series when the loop leaves the bin ([`ServiceStats::close`]), not into an indexed bin;
//! - a slab that is full records the error, which the event's caller returns, instead of
//!   every handler passing a `Result` up;
//! - a request that ends at a service without a worker limit (where nothing ever waits for a
//!   worker) frees none: no `Release` step is pushed and popped, and its `busy` count stays 0
//!   (a quarter of the requests of the 10-service bench; about 0.7 % of its instructions);
//! - a wheel bucket of three to six events is sorted by a sorting network that selects
//!   instead of branching ([`queue`](crate::queue)): the events of a bucket come in no
//!   order, and the standard library's insertion sort mispredicted about a third of its
//!   comparisons (cachegrind's simulated mispredictions 7.0 M -> 6.3 M for 1.5 % more
//!   instructions; paired runs 1.4 to 6.7 % faster on a noisy machine).
//!
//! Measured and not kept (on the 10 s bench): a software prefetch of the request slot the
//! next event names, while the current one is handled (nine instructions an event; paired
//! runs 1.4 % faster at the median on a noisy machine, within the noise; it needs an
//! `unsafe` intrinsic the workspace denies); a call's retry run boxed, so that a call's
//! state fits fewer cache lines (5 % fewer first-level cache misses, 1.3 % more
//! instructions for the allocations, no clear wall-clock gain); the event queue's wheel
//! buckets holding their first seven events in place beside their count (two cache lines
//! a bucket, a vector for the rest: 3 % more misses, 6.63 M -> 6.83 M, and 1.5 % more
//! instructions; the buckets' vectors stay); when work was drawn from a quantile table
//! (above), the table as points only, half its size (more misses, not fewer: a random
//! draw misses the cache either way), and as 32-bit points, a quarter of its size when
//! they fit (the table's misses 1.17 M -> 1.05 M, the run's instructions 3.8 % more); the
//! latency counts as 32-bit numbers, with a carry for the rare count that wraps (2.5 %
//! fewer misses, 0.5 % more instructions, and the counts are written off the loop's
//! critical path); the tokens of the attempts in flight in a vector of their own by slot, so that the per-try timers' checks of attempts
//! long answered read four bytes, not a request's line (1.1 % fewer misses, 0.3 % more
//! instructions, no wall-clock gain in paired runs); a wheel bucket of up to 16 events
//! sorted by rank (each event's place counted by comparisons whose outcomes are added, not
//! branched on: cachegrind's simulated mispredictions 7.0 M -> 6.5 M, for 21 % more
//! instructions); a `Release` step for every request that ends, so that none branches on
//! whether its service limits its workers (0.2 M fewer simulated mispredictions for 0.9 %
//! more instructions); token buckets and unlimited budgets called by their own types, not
//! through the trait object (0.26 % fewer instructions, for a second copy of the core's
//! mapping from a budget spec to its type); and, measured in wall-clock time once the
//! draws no longer read a table (paired runs, where time samples pointed): the latency counts recorded as bucket numbers in a batch of 64 per
//! service, counted a batch at a time (the instruction after a count held 8 % of the time
//! samples; six paired 120 s runs, 1.90 to 2.11 s against 1.63 to 2.07 s without), and the
//! wheel's buckets holding their first eight events in one block of events, with their
//! counts in an array of their own, so that filing an event reads no bucket's vector first
//! (the pushes held 13 % of the time samples; ten paired 60 s runs took 9.92 s in all
//! either way).
//!
//! The order of everything that draws a random number or takes a slab slot (so the order of
//! the events, whose ties are broken by slot numbers) is unchanged by any of this, with one
//! exception: since work is drawn from segments, a draw may differ from the table's by
//! about a nanosecond, which can move an event past another (the 120 s bench handles 36
//! more of its 16.4 M events). The `whatif_pinned` test compares two whole reports with
//! ones saved before it was written; both are unchanged by that too.

use std::collections::VecDeque;

use rand::rngs::SmallRng;
use stormguard::breaker::OwnedPermit;
use stormguard::budget::{RequestGuard, RetryBudget};
use stormguard::classify::Outcome;
use stormguard::retry::{AttemptOutcome, Decision, RetryRun, StopReason};

use super::inject::Injection;
use super::model::{Edge, Model, Node};
use super::stats::ServiceStats;
use crate::error::InvalidParam;
use crate::queue::{EventQueue, pack};
use crate::slab::Slab;
use crate::time::{Nanos, duration};
use faults::Faults;
use fifo::Fifo;

mod calls;
mod faults;
mod fifo;
mod service;

pub(super) const ARRIVAL: u8 = 0;
pub(super) const DONE: u8 = 1;
pub(super) const RETRY: u8 = 2;
pub(super) const TIMEOUT: u8 = 3;
pub(super) const TIMER: u8 = 4;

/// No caller: an entry request.
const NONE: u32 = u32::MAX;
/// No deadline.
const NEVER: Nanos = Nanos::MAX;
/// The workers of a service without a limit.
const UNLIMITED: u32 = u32::MAX;
/// The token of no attempt: a slot with no call in flight ([`World::token`] never hands
/// it out).
const IDLE: u32 = 0;

/// How a request ended, as its caller sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    /// A 503 (an injected 503, the endpoint's own failures, a failed call, a full queue).
    Unavailable,
    /// Refused before the request was read (an outage).
    Refused,
    /// Failed after retrying below, with the don't-retry signal.
    Exhausted,
}

/// One request at a service, and the call it is making (a request makes its calls one
/// at a time): an event of a call (a retry, a timeout) names it by its request's slot and
/// the attempt's token.
///
/// One cache line, aligned: what a request and a call whose attempts succeed at once read
/// and write, from its arrival through each of its calls to its answer, so that the event
/// of its work's end, and each reply to one of its calls, touch one line. What only a call
/// that did not succeed at once, or one through a breaker, needs is kept apart, in
/// [`World::calls`]. Its service and the end of its calls are read from its node, which
/// every step of a request reads anyway.
///
/// A call's first attempt runs under the budget's [`RequestGuard`] alone, as in the tokio
/// retrier: the core's [`RetryRun`] is built only when that attempt did not succeed, so a
/// call that succeeds at once (nearly every call) builds none.
#[repr(align(64))]
struct Request<'p> {
    node: u32,
    /// The call whose attempt this is ([`NONE`] for an entry request) and the attempt's token.
    caller: u32,
    token: u32,
    /// Its next call to make, as an index into the model's calls (set when it starts work,
    /// from its node): the call it is making is the one before.
    next: u32,
    /// The attempt of its call in flight (a reply or timeout with another token is stale);
    /// [`IDLE`]: no call.
    call_token: u32,
    arrived: Nanos,
    /// The deadline the service honours ([`NEVER`]: none).
    deadline: Nanos,
    /// The deadline of the call it is making.
    call_deadline: Nanos,
    /// The request on the call's budget while the first attempt is in flight.
    first: Option<RequestGuard<'p, dyn RetryBudget + 'p>>,
    /// Its work is cut short by its deadline: it ends without an answer.
    cut: bool,
    /// Its slot of [`World::calls`] holds a run or a permit.
    held: bool,
}

// A request's record is one cache line, and so is its slab slot (the free slot's link fits
// in the record's spare bytes): a field added must take the room of another (or go to
// `Held`).
const _: () = assert!(std::mem::size_of::<Request<'static>>() == 64);
const _: () = assert!(Slab::<Request<'static>>::SLOT_BYTES == 64);

/// What a call keeps apart from its request ([`Request`]): the run that took the request
/// over when the first attempt did not succeed, and the breaker's permit with the time the
/// attempt was sent. Kept at the request's slot number in [`World::calls`], which grows only
/// when a call needs it.
struct Held<'p> {
    run: Option<RetryRun<'p, dyn RetryBudget + 'p>>,
    permit: Option<OwnedPermit>,
    sent: Nanos,
}

impl Held<'_> {
    /// Nothing held.
    const fn none() -> Self {
        Held {
            run: None,
            permit: None,
            sent: 0,
        }
    }
}

impl<'p> Request<'p> {
    /// The index of the call it is making (or made last) among the model's calls.
    #[inline(always)]
    fn edge(&self) -> u32 {
        self.next.wrapping_sub(1)
    }

    /// Ends its call: the budget hears that the request ended (from the guard or the run,
    /// dropped here), and events of its attempts are stale from now on.
    #[inline(always)]
    fn end_call(&mut self, calls: &mut [Held<'p>], slot: u32) {
        self.call_token = IDLE;
        self.first = None;
        if self.held {
            self.held = false;
            if let Some(h) = calls.get_mut(slot as usize) {
                h.run = None;
                h.permit = None;
            }
        }
    }
}

/// The slot of [`World::calls`] of the call of request `slot`, made when the vector is
/// shorter (it grows only with calls that need it).
#[inline]
fn held<'a, 'p>(calls: &'a mut Vec<Held<'p>>, slot: u32) -> Option<&'a mut Held<'p>> {
    if calls.len() <= slot as usize {
        calls.resize_with(slot as usize + 1, Held::none);
    }
    calls.get_mut(slot as usize)
}

/// Work that follows from an event at the same instant.
#[derive(Clone, Copy)]
enum Step {
    /// An attempt of a call ended with an answer.
    Reply {
        call: u32,
        token: u32,
        answer: Answer,
    },
    /// A worker of a service became free.
    Release { service: u32 },
}

/// What a step handler hands back: the step to work on next, before any on the stack.
type Next = Option<Step>;

/// A service: its limits (copied from the model, so that a request's arrival reads one
/// place), its changing state and what it saw.
struct ServiceState {
    /// Workers ([`UNLIMITED`]: no limit).
    workers: u32,
    /// Queue places (`usize::MAX`: no limit).
    queue: usize,
    /// OR-ed into the deadline a request brings: 0 at a service that honours deadlines,
    /// all ones ([`NEVER`]) at one that does not (one instruction, no branch).
    ignored_deadline: Nanos,
    /// Workers at work; always 0 at a service without a limit, where nothing ever waits
    /// for a worker, so that a request ending there needs no `Release` step.
    busy: u32,
    waiting: VecDeque<u32>,
    faults: Faults,
    stats: ServiceStats,
}

/// The mutable state of one run.
pub(super) struct World<'p> {
    model: &'p Model,
    state: Vec<ServiceState>,
    requests: Slab<Request<'p>>,
    /// What the call of the request in each slot of `requests` keeps apart ([`Held`]):
    /// grown when a call needs it.
    calls: Vec<Held<'p>>,
    pub(super) queue: EventQueue,
    rng: SmallRng,
    steps: Vec<Step>,
    tokens: u32,
    /// The time bin of the event being handled, and where it ends.
    bin: usize,
    bin_end: Nanos,
    bin_width: Nanos,
    /// Per call of the graph, the attempts whose deadline is their per-try timeout, in
    /// sending order (so in deadline order): `(deadline, call, token)`. One `TIMER` event
    /// per call of the graph stands for all of them, so an attempt answered in time costs no
    /// event of its own.
    timers: Vec<Fifo>,
    /// When each call of the graph's `TIMER` event is due ([`NEVER`]: none is scheduled).
    armed: Vec<Nanos>,
    /// A slab that could not take another request or call: the event ends the run with it.
    error: Option<InvalidParam>,
    /// Entry requests that succeeded and failed.
    pub(super) entry_ok: u64,
    pub(super) entry_failed: u64,
}

impl<'p> World<'p> {
    pub(super) fn new(
        model: &'p Model,
        injections: &[Injection],
        stats: Vec<ServiceStats>,
        bin_width: Nanos,
        rng: SmallRng,
    ) -> World<'p> {
        let bin_width = bin_width.max(1);
        let state = model
            .services
            .iter()
            .zip(stats)
            .map(|(s, stats)| ServiceState {
                workers: s.workers,
                queue: s.queue,
                ignored_deadline: if s.honours_deadline { 0 } else { NEVER },
                busy: 0,
                waiting: VecDeque::new(),
                faults: Faults::of(&s.name, injections),
                stats,
            })
            .collect();
        World {
            model,
            state,
            requests: Slab::new(),
            calls: Vec::new(),
            queue: EventQueue::with_capacity(4096),
            rng,
            steps: Vec::with_capacity(64),
            timers: model.edges.iter().map(|_| Fifo::default()).collect(),
            armed: vec![NEVER; model.edges.len()],
            tokens: 0,
            bin: 0,
            bin_end: bin_width,
            bin_width,
            error: None,
            entry_ok: 0,
            entry_failed: 0,
        }
    }

    /// Moves the current time bin to the one holding `now` (events come in time order).
    #[inline]
    pub(super) fn tick(&mut self, now: Nanos) {
        if now >= self.bin_end {
            self.next_bin(now);
        }
    }

    /// Where the current time bin ends: [`tick`](World::tick) has nothing to do before.
    pub(super) fn bin_end(&self) -> Nanos {
        self.bin_end
    }

    /// Closes the bins of every service up to the one holding `now`.
    #[cold]
    fn next_bin(&mut self, now: Nanos) {
        while now >= self.bin_end {
            self.close_bins();
            self.bin += 1;
            self.bin_end = self.bin_end.saturating_add(self.bin_width);
        }
    }

    /// Adds what every service counted in the current bin to its series.
    fn close_bins(&mut self) {
        for s in &mut self.state {
            s.stats.close(self.bin);
        }
    }

    /// What each service saw, in the model's order (the current bin closed first).
    pub(super) fn stats(&mut self) -> impl Iterator<Item = &ServiceStats> {
        self.close_bins();
        self.state.iter().map(|s| &s.stats)
    }

    /// Requests waiting in each service's queue.
    pub(super) fn queued(&self) -> Vec<usize> {
        self.state.iter().map(|s| s.waiting.len()).collect()
    }

    /// A fresh attempt token (never [`IDLE`]).
    #[inline]
    fn token(&mut self) -> u32 {
        self.tokens = self.tokens.wrapping_add(1).max(1);
        self.tokens
    }

    /// An entry request arrives at `node`.
    pub(super) fn entry(&mut self, now: Nanos, node: usize) -> Result<(), InvalidParam> {
        let Some(service) = self.model.nodes.get(node).map(|n| n.service) else {
            return Ok(());
        };
        self.arrive(now, node, service, NONE, 0, NEVER);
        self.drain_out_of_line(now, None)
    }

    /// Handles a `DONE`, `RETRY` or `TIMEOUT` event and everything that follows from it.
    ///
    /// Nearly every event of a run comes here, so this is the one place the step loop is
    /// inlined into; and it is inlined into the run's loop, its one caller, so that an
    /// event costs no call and no saving and restoring of registers.
    #[inline(always)]
    pub(super) fn handle(
        &mut self,
        now: Nanos,
        kind: u8,
        slot: u32,
        operand: u32,
    ) -> Result<(), InvalidParam> {
        let first = match kind {
            DONE => self.done(now, slot),
            RETRY => self.retry(now, slot, operand),
            TIMEOUT => self.timeout(now, slot, operand),
            _ => None,
        };
        self.drain(now, first)
    }

    /// A request's work ended.
    #[inline(always)]
    fn done(&mut self, now: Nanos, slot: u32) -> Next {
        // Looked up once: a request that goes on makes its next call with it.
        let model = self.model;
        let r = self.requests.get_mut(slot)?;
        let n = model.nodes.get(r.node as usize)?;
        let service = n.service as u32;
        if r.cut {
            self.requests.free(slot);
            let mut limited = true;
            if let Some(s) = self.state.get_mut(service as usize) {
                s.stats.abandoned += 1;
                limited = s.workers != UNLIMITED;
            }
            limited.then_some(Step::Release { service })
        } else if n.failure_rate > 0.0 && crate::rng::unit(&mut self.rng) < n.failure_rate {
            self.finish(now, slot, Answer::Unavailable)
        } else {
            let next = calls::next_of(r, n);
            self.go_on(now, slot, next)
        }
    }

    /// A call's backoff ended: send its next attempt.
    #[inline(always)]
    fn retry(&mut self, now: Nanos, call: u32, token: u32) -> Next {
        if self
            .requests
            .get(call)
            .is_some_and(|r| r.call_token == token)
        {
            self.send(now, call)
        } else {
            None
        }
    }

    /// A call's attempt reached its deadline without an answer.
    #[inline(always)]
    fn timeout(&mut self, now: Nanos, call: u32, token: u32) -> Next {
        let fresh = self.token();
        self.decide(now, call, |r| {
            if r.call_token != token {
                return None;
            }
            // A reply to this attempt that comes later is stale.
            r.call_token = fresh;
            Some(AttemptOutcome::TIMED_OUT)
        })
    }

    /// The timer of edge `edge` fired: every attempt on it whose deadline has come times
    /// out (those answered since are skipped), and the timer is set for the next one still
    /// waiting.
    pub(super) fn timer(&mut self, now: Nanos, edge: u32) -> Result<(), InvalidParam> {
        let e = edge as usize;
        if self.armed.get(e) != Some(&now) {
            return Ok(());
        }
        if let Some(armed) = self.armed.get_mut(e) {
            *armed = NEVER;
        }
        loop {
            let front = self.timers.get(e).and_then(Fifo::front);
            match front {
                Some((at, call, token)) if at <= now => {
                    if let Some(fifo) = self.timers.get_mut(e) {
                        fifo.pop_front();
                    }
                    let next = self.timeout(now, call, token);
                    self.drain_out_of_line(now, next)?;
                }
                _ => break,
            }
        }
        self.arm(e);
        Ok(())
    }

    /// [`drain`](World::drain) for the rarer events (arrivals, timers), kept out of line
    /// so that only [`handle`](World::handle) holds a copy of the loop.
    #[inline(never)]
    fn drain_out_of_line(&mut self, now: Nanos, first: Next) -> Result<(), InvalidParam> {
        self.drain(now, first)
    }

    /// Works through `first` and then the steps on the stack until none is left; the error
    /// of a slab that was full, if any.
    #[inline(always)]
    fn drain(&mut self, now: Nanos, first: Next) -> Result<(), InvalidParam> {
        let mut next = first;
        loop {
            // `next` is overwritten below: read, not taken.
            let step = match next {
                Some(step) => step,
                None => match self.steps.pop() {
                    Some(step) => step,
                    None => break,
                },
            };
            next = match step {
                Step::Reply {
                    call,
                    token,
                    answer,
                } => self.reply(now, call, token, answer),
                Step::Release { service } => self.release(now, service as usize),
            };
        }
        // Read before it is taken: nearly always there is none, and then nothing is written.
        if self.error.is_none() {
            return Ok(());
        }
        self.error.take().map_or(Ok(()), Err)
    }
}
