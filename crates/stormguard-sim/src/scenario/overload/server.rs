//! The overloaded server: a FIFO queue in front of one worker whose speed collapses above
//! capacity.
//!
//! The worker serves one request at a time in `1 / capacity` seconds while the load offered
//! over the last second is at most `capacity`, and `slowdown` times slower above it (Bronson
//! et al.'s "10× slower above 300 QPS": thrashing, lock contention, cache misses — work gets
//! more expensive exactly when there is more of it). Requests wait in an unbounded FIFO
//! queue, so latency grows with load.
//!
//! A server that knows each request's deadline (propagated by the client) refuses, when the
//! request reaches the head of the queue, any whose deadline has passed — at no cost, the way
//! a stormguard server refuses an expired `grpc-timeout` before running the handler. One
//! that does not know serves everything, including requests nobody waits for any more.
//! During an outage the server drops everything that arrives and loses its queue.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use stormguard::classify::Outcome;
use stormguard::limit::{Limiter, Ticket};

use crate::time::{NANOS_PER_SEC, Nanos};

/// A request (one attempt) waiting for or in service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Job {
    /// The logical request's slot.
    pub(super) req: u32,
    /// The attempt's unique number.
    pub(super) attempt: u32,
    /// When the client stops waiting; `Nanos::MAX` when the server is not told.
    pub(super) deadline: Nanos,
}

/// Slots of the one-second arrival window.
const WINDOW_SLOTS: usize = 100;
const SLOT: Nanos = NANOS_PER_SEC / WINDOW_SLOTS as Nanos;

/// Arrivals over the last second, in 10 ms slots.
#[derive(Debug)]
struct ArrivalWindow {
    slots: [u32; WINDOW_SLOTS],
    current: u64,
    sum: u64,
}

impl ArrivalWindow {
    fn new() -> Self {
        ArrivalWindow {
            slots: [0; WINDOW_SLOTS],
            current: 0,
            sum: 0,
        }
    }

    fn advance(&mut self, now: Nanos) {
        let target = now / SLOT;
        if target >= self.current + WINDOW_SLOTS as u64 {
            self.slots = [0; WINDOW_SLOTS];
            self.sum = 0;
            self.current = target;
            return;
        }
        while self.current < target {
            self.current += 1;
            let i = (self.current % WINDOW_SLOTS as u64) as usize;
            if let Some(s) = self.slots.get_mut(i) {
                self.sum -= u64::from(*s);
                *s = 0;
            }
        }
    }

    fn record(&mut self, now: Nanos) {
        self.advance(now);
        let i = (self.current % WINDOW_SLOTS as u64) as usize;
        if let Some(s) = self.slots.get_mut(i) {
            *s += 1;
            self.sum += 1;
        }
    }

    fn last_second(&mut self, now: Nanos) -> u64 {
        self.advance(now);
        self.sum
    }
}

/// What happened to an arriving request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Arrived {
    /// Queued or in service.
    Accepted,
    /// Lost in an outage.
    Lost,
    /// Shed on arrival by the adaptive limit, answered at once and at no cost.
    Shed,
}

/// The core's adaptive concurrency limiter in front of the server, on the virtual clock.
#[derive(Debug)]
pub(super) struct Limit {
    pub(super) limiter: Limiter,
    /// The virtual clock's instant at time zero.
    pub(super) origin: Instant,
}

impl Limit {
    fn at(&self, now: Nanos) -> Instant {
        self.origin + Duration::from_nanos(now)
    }
}

/// The server's state.
#[derive(Debug)]
pub(super) struct Server {
    slowdown: f64,
    checks_deadline: bool,
    queue: VecDeque<(Job, Option<Ticket>)>,
    busy: Option<(Job, Nanos)>,
    busy_ticket: Option<Ticket>,
    window: ArrivalWindow,
    limit: Option<Limit>,
    /// Requests refused at the head of the queue because their deadline had passed.
    pub(super) expired: u64,
    /// Requests shed on arrival by the limit (over it, or with too little time left).
    pub(super) shed: u64,
}

impl Server {
    pub(super) fn new(slowdown: f64, checks_deadline: bool, limit: Option<Limit>) -> Self {
        Server {
            slowdown,
            checks_deadline,
            queue: VecDeque::new(),
            busy: None,
            busy_ticket: None,
            window: ArrivalWindow::new(),
            limit,
            expired: 0,
            shed: 0,
        }
    }

    /// Whether the limit sheds a request arriving at `now`: one whose deadline leaves less
    /// than the time admitted requests take, or one over the limit. `Ok` carries the slot of
    /// an admitted request (`None` without a limit).
    fn admit(&mut self, now: Nanos, job: &Job) -> Result<Option<Ticket>, ()> {
        let Some(limit) = &self.limit else {
            return Ok(None);
        };
        let expected = limit
            .limiter
            .expected_rtt()
            .map_or(0, |d| d.as_nanos() as Nanos);
        if job.deadline.saturating_sub(now) < expected {
            self.shed += 1;
            return Err(());
        }
        match limit.limiter.try_acquire(0, limit.at(now)) {
            Ok(ticket) => Ok(Some(ticket)),
            Err(_) => {
                self.shed += 1;
                Err(())
            }
        }
    }

    fn give_back(&self, now: Nanos, ticket: Option<Ticket>, outcome: Outcome) {
        if let (Some(limit), Some(ticket)) = (&self.limit, ticket) {
            limit.limiter.release(ticket, limit.at(now), outcome);
        }
    }

    /// A request arrives. Returns what happened and, if the worker was idle and took a job,
    /// the job and the instant it will be done.
    pub(super) fn arrive(
        &mut self,
        now: Nanos,
        job: Job,
        up: bool,
        capacity: f64,
    ) -> (Arrived, Option<(Job, Nanos)>) {
        if !up {
            self.window.record(now);
            return (Arrived::Lost, None);
        }
        let Ok(ticket) = self.admit(now, &job) else {
            return (Arrived::Shed, None);
        };
        // The work taken on: a shed request costs the server nothing.
        self.window.record(now);
        self.queue.push_back((job, ticket));
        let started = if self.busy.is_none() {
            self.start_next(now, capacity)
        } else {
            None
        };
        (Arrived::Accepted, started)
    }

    /// The worker's job due at `now` is done: returns it if it is the one in service (not a
    /// job lost in an outage), and the next job started, if any.
    pub(super) fn finish(
        &mut self,
        now: Nanos,
        req: u32,
        attempt: u32,
        capacity: f64,
    ) -> (Option<Job>, Option<(Job, Nanos)>) {
        match self.busy {
            Some((job, until)) if until == now && job.req == req && job.attempt == attempt => {
                self.busy = None;
                let ticket = self.busy_ticket.take();
                self.give_back(now, ticket, Outcome::Success);
                (Some(job), self.start_next(now, capacity))
            }
            _ => (None, None),
        }
    }

    /// An outage starts: the queue and the job in service are lost.
    pub(super) fn crash(&mut self) {
        // The limiter restarts with the server, keeping what it learnt (its slots come back).
        let tickets = self
            .queue
            .drain(..)
            .filter_map(|(_, t)| t)
            .chain(self.busy_ticket.take());
        if let Some(limit) = &self.limit {
            for ticket in tickets {
                limit.limiter.forget(ticket);
            }
        }
        self.busy = None;
    }

    /// Requests waiting, not counting the one in service.
    #[cfg(test)]
    pub(super) fn backlog(&self) -> usize {
        self.queue.len()
    }

    fn start_next(&mut self, now: Nanos, capacity: f64) -> Option<(Job, Nanos)> {
        while let Some((job, ticket)) = self.queue.pop_front() {
            if self.checks_deadline && job.deadline <= now {
                self.expired += 1;
                self.give_back(now, ticket, Outcome::InDoubt);
                continue;
            }
            self.busy_ticket = ticket;
            let overloaded = self.window.last_second(now) as f64 > capacity;
            let seconds = if overloaded {
                self.slowdown / capacity
            } else {
                1.0 / capacity
            };
            let until = now.saturating_add((seconds * NANOS_PER_SEC as f64) as Nanos);
            self.busy = Some((job, until));
            return Some((job, until));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(req: u32) -> Job {
        Job {
            req,
            attempt: req,
            deadline: Nanos::MAX,
        }
    }

    #[test]
    fn serves_fifo_at_capacity_and_slows_down_above_it() {
        let mut s = Server::new(10.0, false, None);
        let (_, started) = s.arrive(0, job(1), true, 100.0);
        assert_eq!(started, Some((job(1), 10_000_000)));
        let (_, started) = s.arrive(1, job(2), true, 100.0);
        assert_eq!(started, None);
        for i in 0..200 {
            s.arrive(2 + i, job(3 + i as u32), true, 100.0);
        }
        let (done, next) = s.finish(10_000_000, 1, 1, 100.0);
        assert_eq!(done, Some(job(1)));
        // 202 arrivals in the last second > 100: ten times slower.
        assert_eq!(next, Some((job(2), 10_000_000 + 100_000_000)));
    }

    #[test]
    fn expired_requests_are_refused_at_the_head_of_the_queue() {
        let mut s = Server::new(1.0, true, None);
        s.arrive(0, job(1), true, 10.0);
        let stale = Job {
            deadline: 50_000_000,
            ..job(2)
        };
        s.arrive(1, stale, true, 10.0);
        s.arrive(2, job(3), true, 10.0);
        let (_, next) = s.finish(100_000_000, 1, 1, 10.0);
        assert_eq!(next.map(|(j, _)| j.req), Some(3));
        assert_eq!(s.expired, 1);
    }

    #[test]
    fn an_outage_loses_the_queue_and_ignores_the_lost_job() {
        let mut s = Server::new(1.0, false, None);
        s.arrive(0, job(1), true, 10.0);
        s.arrive(0, job(2), true, 10.0);
        s.crash();
        assert_eq!(s.backlog(), 0);
        assert_eq!(s.finish(100_000_000, 1, 1, 10.0), (None, None));
        assert_eq!(s.arrive(5, job(3), false, 10.0), (Arrived::Lost, None));
    }
}
