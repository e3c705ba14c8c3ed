//! The event loop of one protection's run: arrivals, attempts, timeouts, the server.

use std::time::Duration;

use rand::rngs::SmallRng;
use stormguard::budget::{RetryBudget, Unlimited};
use stormguard::classify::Outcome;
use stormguard::retry::{AttemptOutcome, Decision, RetryPolicy, RetryRun, StopReason};

use super::server::{Arrived, Job, Limit, Server};
use super::summary::summarise;
use super::{OverloadConfig, OverloadRow, Protection, Trigger};
use crate::bins::Bins;
use crate::budgets::{BudgetKind, invalid_budget};
use crate::error::InvalidParam;
use crate::queue::{EventQueue, pack, unpack};
use crate::rng;
use crate::slab::Slab;
use crate::strategy::Strategy;
use crate::time::{NANOS_PER_MILLI, Nanos, duration, nanos, nth_of_rate};
use crate::vclock::VirtualClock;
use stormguard::limit::{Limiter, LimiterConfig};

const ARRIVAL: u8 = 0;
const SEND: u8 = 1;
const TIMEOUT: u8 = 2;
const SERVED: u8 = 3;
const TRIGGER_START: u8 = 4;
const TRIGGER_END: u8 = 5;

/// The two arrival streams (operand of `ARRIVAL`).
const BASE_STREAM: u32 = 0;
const SPIKE_STREAM: u32 = 1;

struct Request<'p> {
    run: RetryRun<'p, dyn RetryBudget + 'p>,
    attempt: u32,
    waiting: bool,
    started: Nanos,
    /// The caller's deadline; `Nanos::MAX` when there is none.
    deadline: Nanos,
}

/// Per-bin counters.
pub(super) struct Series {
    pub(super) offered: Bins,
    pub(super) goodput: Bins,
    pub(super) latency_us: Bins,
}

pub(super) struct World<'p> {
    cfg: &'p OverloadConfig,
    policy: &'p RetryPolicy,
    budget: &'p dyn RetryBudget,
    deadline: Option<Nanos>,
    /// Whether attempts carry their deadline to the server.
    tells_deadline: bool,
    timeout: Nanos,
    requests: Slab<Request<'p>>,
    pub(super) server: Server,
    queue: EventQueue,
    rng: SmallRng,
    pub(super) series: Series,
    next_attempt: u32,
    triggered: bool,
    pub(super) wasted: u64,
}

/// The core's limiter, for the protections that put one in front of the server.
fn limit(
    cfg: &OverloadConfig,
    protection: Protection,
    vclock: &VirtualClock,
) -> Result<Option<Limit>, InvalidParam> {
    if !protection.limit() {
        return Ok(None);
    }
    let clock = vclock.clock();
    let limiter = Limiter::new(LimiterConfig::new(cfg.limit.algorithm()), &clock)
        .map_err(|e| InvalidParam::new("limit", e.to_string()))?;
    Ok(Some(Limit {
        limiter,
        origin: clock.now(),
    }))
}

pub(super) fn run_protection(
    cfg: &OverloadConfig,
    protection: Protection,
    progress: &mut dyn FnMut(u64),
) -> Result<(OverloadRow, u64), InvalidParam> {
    let mut vclock = VirtualClock::read_if(protection.budget() && cfg.budget == BudgetKind::Ratio);
    let budget: Box<dyn RetryBudget> = if protection.budget() {
        cfg.budget
            .build(&cfg.budget_params, vclock.clock())
            .map_err(|e| invalid_budget(&e))?
    } else {
        Box::new(Unlimited)
    };
    let strategy = if protection.deadline() {
        Strategy::Full
    } else {
        Strategy::None
    };
    let backoff = strategy
        .backoff(cfg.base, cfg.cap)
        .map_err(|e| InvalidParam::new("cap", e.to_string()))?;
    let min_call = if protection.deadline() {
        cfg.min_call
    } else {
        Duration::ZERO
    };
    let policy = RetryPolicy::new(cfg.retries + 1)
        .with_backoff(backoff)
        .with_per_try_timeout(cfg.timeout)
        .with_min_call(min_call)
        .with_idempotent(true);
    policy
        .validate()
        .map_err(|e| InvalidParam::new("timeout", e.to_string()))?;
    let run_ns = nanos(cfg.duration);
    let bin = nanos(cfg.bin);
    let mut w = World {
        cfg,
        policy: &policy,
        budget: &*budget,
        deadline: protection.deadline().then(|| nanos(cfg.deadline)),
        tells_deadline: protection.deadline() || protection.limit(),
        timeout: nanos(cfg.timeout),
        requests: Slab::new(),
        server: Server::new(
            cfg.slowdown,
            protection.deadline() || protection.limit(),
            limit(cfg, protection, &vclock)?,
        ),
        queue: EventQueue::with_capacity(4096),
        rng: rng::stream(cfg.seed, protection as u64),
        series: Series {
            offered: Bins::new(bin, run_ns),
            goodput: Bins::new(bin, run_ns),
            latency_us: Bins::new(bin, run_ns),
        },
        next_attempt: 0,
        triggered: false,
        wasted: 0,
    };
    let trigger_at = nanos(cfg.trigger_at);
    let trigger_end = cfg.trigger_end();
    w.queue.push(0, pack(ARRIVAL, 0, BASE_STREAM));
    w.queue.push(trigger_at, pack(TRIGGER_START, 0, 0));
    w.queue.push(trigger_end, pack(TRIGGER_END, 0, 0));
    if cfg.trigger == Trigger::Spike && cfg.spike > 0.0 {
        w.queue.push(trigger_at, pack(ARRIVAL, 0, SPIKE_STREAM));
    }
    let mut arrived = [0u64; 2];
    let mut events = 0u64;
    let mut next_progress = 0;
    while let Some((now, payload)) = w.queue.pop() {
        if now >= run_ns {
            break;
        }
        events += 1;
        vclock.advance_to(now);
        if now >= next_progress {
            progress(now / NANOS_PER_MILLI);
            next_progress = now + 100 * NANOS_PER_MILLI;
        }
        let (kind, slot, operand) = unpack(payload);
        match kind {
            ARRIVAL => {
                let (start, rate, stop) = if operand == SPIKE_STREAM {
                    (trigger_at, cfg.spike, trigger_end)
                } else {
                    (0, cfg.rate, run_ns)
                };
                let k = &mut arrived[usize::from(operand == SPIKE_STREAM)];
                *k += 1;
                let next = nth_of_rate(start, *k, rate);
                if next < stop {
                    w.queue.push(next, pack(ARRIVAL, 0, operand));
                }
                w.new_request(now)?;
            }
            SEND => w.send(now, slot),
            TIMEOUT => w.timed_out(now, slot, operand),
            SERVED => w.served(now, slot, operand),
            TRIGGER_START => {
                w.triggered = true;
                if cfg.trigger == Trigger::Outage {
                    w.server.crash();
                }
            }
            _ => w.triggered = false,
        }
    }
    progress(run_ns / NANOS_PER_MILLI);
    Ok((summarise(cfg, protection, &w), events))
}

impl<'p> World<'p> {
    fn capacity(&self) -> f64 {
        if self.triggered && self.cfg.trigger == Trigger::CapacityDrop {
            self.cfg.capacity * self.cfg.drop_to
        } else {
            self.cfg.capacity
        }
    }

    fn up(&self) -> bool {
        !(self.triggered && self.cfg.trigger == Trigger::Outage)
    }

    fn new_request(&mut self, now: Nanos) -> Result<(), InvalidParam> {
        let run = RetryRun::start(self.policy, self.budget, self.policy.idempotent());
        let id = self
            .requests
            .insert(Request {
                run,
                attempt: 0,
                waiting: false,
                started: now,
                deadline: self.deadline.map_or(Nanos::MAX, |d| now.saturating_add(d)),
            })
            .ok_or_else(|| InvalidParam::new("rate", "too many requests in flight"))?;
        self.send(now, id);
        Ok(())
    }

    /// Sends the next attempt of request `id`, bounded by min(timeout, time left).
    fn send(&mut self, now: Nanos, id: u32) {
        let attempt = self.next_attempt;
        self.next_attempt = self.next_attempt.wrapping_add(1);
        let Some(req) = self.requests.get_mut(id) else {
            return;
        };
        req.attempt = attempt;
        req.waiting = true;
        let per_try = self.timeout.min(req.deadline.saturating_sub(now));
        let attempt_deadline = now.saturating_add(per_try);
        self.queue
            .push(attempt_deadline, pack(TIMEOUT, id, attempt));
        self.series.offered.add(now);
        let job = Job {
            req: id,
            attempt,
            deadline: if self.tells_deadline {
                attempt_deadline
            } else {
                Nanos::MAX
            },
        };
        let capacity = self.capacity();
        let up = self.up();
        match self.server.arrive(now, job, up, capacity) {
            (Arrived::Accepted, Some((job, until))) => {
                self.queue.push(until, pack(SERVED, job.req, job.attempt));
            }
            (Arrived::Shed, _) => self.shed(now, id, attempt),
            _ => {}
        }
    }

    /// The server shed attempt `attempt` of request `id` at once: a client without a budget
    /// retries at once (it ignores the pushback: the worst case).
    fn shed(&mut self, now: Nanos, id: u32, attempt: u32) {
        self.finish_failed(now, id, attempt, Outcome::Retryable.into());
    }

    fn served(&mut self, now: Nanos, id: u32, attempt: u32) {
        let capacity = self.capacity();
        let (done, next) = self.server.finish(now, id, attempt, capacity);
        if let Some((job, until)) = next {
            self.queue.push(until, pack(SERVED, job.req, job.attempt));
        }
        if done.is_none() {
            return;
        }
        let waited = self
            .requests
            .get(id)
            .is_some_and(|r| r.waiting && r.attempt == attempt);
        if !waited {
            self.wasted += 1;
            return;
        }
        if let Some(mut req) = self.requests.remove(id) {
            req.waiting = false;
            let decision = req
                .run
                .finish_attempt(Outcome::Success.into(), || None, &mut self.rng);
            if decision == Decision::Stop(StopReason::Succeeded) {
                self.series.goodput.add(now);
                self.series
                    .latency_us
                    .add_n(now, (now - req.started) / 1_000);
            }
        }
    }

    fn timed_out(&mut self, now: Nanos, id: u32, attempt: u32) {
        self.finish_failed(now, id, attempt, AttemptOutcome::TIMED_OUT);
    }

    /// Attempt `attempt` of request `id` failed with `outcome`: retry or stop.
    fn finish_failed(&mut self, now: Nanos, id: u32, attempt: u32, outcome: AttemptOutcome) {
        let Some(req) = self.requests.get_mut(id) else {
            return;
        };
        if !(req.waiting && req.attempt == attempt) {
            return;
        }
        req.waiting = false;
        let deadline = req.deadline;
        let remaining = || (deadline != Nanos::MAX).then(|| duration(deadline.saturating_sub(now)));
        match req.run.finish_attempt(outcome, remaining, &mut self.rng) {
            Decision::Retry { delay, .. } if delay.is_zero() => self.send(now, id),
            Decision::Retry { delay, .. } => {
                self.queue
                    .push(now.saturating_add(nanos(delay)), pack(SEND, id, 0));
            }
            Decision::Stop(_) => {
                self.requests.remove(id);
            }
        }
    }
}
