//! The call side of the event loop: a request's calls one after another, each attempt sent,
//! answered or timed out, and the core's [`RetryRun`](stormguard::retry::RetryRun) deciding
//! what follows; the per-edge timer queues that time the attempts.

use super::*;

impl<'p> World<'p> {
    /// Drops answered attempts from the front of edge `e`'s timers and schedules its event
    /// for the first one still waiting, unless one is scheduled.
    #[inline(always)]
    pub(super) fn arm(&mut self, e: usize) {
        if self.armed.get(e).is_none_or(|&at| at != NEVER) {
            return;
        }
        let Some(fifo) = self.timers.get_mut(e) else {
            return;
        };
        while let Some((at, call, token)) = fifo.front() {
            if self
                .requests
                .get(call)
                .is_some_and(|r| r.call_token == token)
            {
                self.queue.push(at, pack(TIMER, e as u32, 0));
                if let Some(armed) = self.armed.get_mut(e) {
                    *armed = at;
                }
                return;
            }
            fifo.pop_front();
        }
    }

    /// Request `slot` makes its next call, or finishes when it has made them all.
    #[inline(always)]
    pub(super) fn next_call(&mut self, now: Nanos, slot: u32) -> Next {
        let model = self.model;
        let r = self.requests.get_mut(slot)?;
        let next = next_of(r, model.nodes.get(r.node as usize)?);
        self.go_on(now, slot, next)
    }

    /// Request `slot` makes the call [`next_of`] found, or finishes with `None` (it has made
    /// them all).
    #[inline(always)]
    pub(super) fn go_on(&mut self, now: Nanos, slot: u32, next: Option<(usize, Nanos)>) -> Next {
        match next {
            Some((index, deadline)) => self.call(now, slot, index, deadline),
            None => self.finish(now, slot, Answer::Ok),
        }
    }

    /// Request `slot` makes call `index` of the model, bringing its `deadline` (what
    /// [`next_of`] read of the request).
    #[inline(always)]
    pub(super) fn call(&mut self, now: Nanos, slot: u32, index: usize, deadline: Nanos) -> Next {
        let model = self.model;
        let edge = model.edges.get(index)?;
        let mut deadline = deadline;
        if let Some(reserve) = edge.reserve.filter(|_| deadline != NEVER) {
            let left = deadline.saturating_sub(now);
            let kept = crate::time::nanos(reserve.kept_from(duration(left)));
            deadline = now.saturating_add(left.saturating_sub(kept));
        }
        if let Some(overall) = edge.overall {
            deadline = deadline.min(now.saturating_add(overall));
        }
        if deadline <= now {
            return self.finish(now, slot, Answer::Unavailable);
        }
        let token = self.token();
        let r = self.requests.get_mut(slot)?;
        r.call_deadline = deadline;
        r.first = Some(RequestGuard::new(&*edge.budget));
        // The first attempt is sent with the call and edge at hand (`send` looks them up).
        match attempt(r, &mut self.calls, slot, edge, now, token) {
            Some((deadline, per_try)) => {
                self.dispatch(now, slot, token, edge, index as u32, deadline, per_try)
            }
            None => self.fail_call(now, slot, index as u32),
        }
    }

    /// Sends the next attempt of `call`.
    #[inline(always)]
    pub(super) fn send(&mut self, now: Nanos, call: u32) -> Next {
        let model = self.model;
        let token = self.token();
        let r = self.requests.get_mut(call)?;
        let edge_index = r.edge();
        let edge = model.edges.get(edge_index as usize)?;
        match attempt(r, &mut self.calls, call, edge, now, token) {
            Some((deadline, per_try)) => {
                self.dispatch(now, call, token, edge, edge_index, deadline, per_try)
            }
            None => self.fail_call(now, call, edge_index),
        }
    }

    /// Sends attempt `token` of `call` on `edge` (number `edge_index`), made ready by
    /// [`attempt`] (its deadline, and its per-try deadline if any), and times it.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn dispatch(
        &mut self,
        now: Nanos,
        call: u32,
        token: u32,
        edge: &Edge,
        edge_index: u32,
        deadline: Nanos,
        per_try: Option<Nanos>,
    ) -> Next {
        let known = self.arrive(now, edge.callee, edge.callee_service, call, token, deadline);
        if deadline != NEVER && known > deadline {
            if per_try == Some(deadline) {
                // Every attempt on this call of the graph gets the same per-try timeout,
                // so these deadlines come in sending order.
                if let Some(fifo) = self.timers.get_mut(edge_index as usize) {
                    fifo.push_back((deadline, call, token));
                }
                self.arm(edge_index as usize);
            } else {
                self.queue.push(deadline, pack(TIMEOUT, call, token));
            }
        }
        // A refusal's reply, if any, is on the stack: it is the step worked on next.
        None
    }

    /// An attempt of `call` was answered.
    #[inline(always)]
    pub(super) fn reply(&mut self, now: Nanos, call: u32, token: u32, answer: Answer) -> Next {
        let model = self.model;
        self.decide(now, call, |r| {
            if r.call_token != token {
                return None;
            }
            // A success (nearly every answer) needs nothing of the call's policy.
            let outcome = if answer == Answer::Ok {
                Outcome::Success
            } else {
                let edge = model.edges.get(r.edge() as usize)?;
                match answer {
                    Answer::Ok => Outcome::Success,
                    Answer::Refused => Outcome::Retryable,
                    Answer::Unavailable if edge.retries_503 => Outcome::Retryable,
                    Answer::Unavailable => Outcome::NeverRetry,
                    Answer::Exhausted if edge.caller_signal => Outcome::NeverRetry,
                    Answer::Exhausted => Outcome::Retryable,
                }
            };
            Some(outcome.into())
        })
    }

    /// Records how an attempt of `call` ended — what `ended` makes of the call, `None` when
    /// the answer is stale (it reads the call in the same look-up) — and follows the core's
    /// decision.
    #[inline(always)]
    pub(super) fn decide(
        &mut self,
        now: Nanos,
        call: u32,
        ended: impl FnOnce(&mut Request<'_>) -> Option<AttemptOutcome>,
    ) -> Next {
        let model = self.model;
        let r = self.requests.get_mut(call)?;
        let ended = ended(r)?;
        if r.held
            && let Some(h) = self.calls.get_mut(call as usize)
            && let Some(permit) = h.permit.take()
        {
            permit.record(ended.outcome, duration(now.saturating_sub(h.sent)));
        }
        let edge = r.edge();
        let decision = match &r.first {
            // The first attempt succeeded (nearly every call): what the run would record
            // (it stops), without building one; the call ends here, and its request goes
            // on, where it was looked up (what `end_call` does for a success). The guard,
            // dropped as it ends, tells the budget that the request ended.
            Some(first) if ended.outcome.is_success() => {
                first.first_attempt_succeeded();
                r.end_call(&mut self.calls, call);
                let next = next_of(r, model.nodes.get(r.node as usize)?);
                return self.go_on(now, call, next);
            }
            _ => self.decide_with_run(now, call, ended)?,
        };
        match decision {
            Decision::Retry { delay, .. } => {
                let at = now.saturating_add(crate::time::nanos(delay));
                if at == now {
                    return self.send(now, call);
                }
                // The call waits under a token of its own: the ended attempt's timer, still
                // queued when its answer came first, must not time it out a second time.
                let token = self.token();
                self.requests.get_mut(call)?.call_token = token;
                self.queue.push(at, pack(RETRY, call, token));
                None
            }
            Decision::Stop(reason) => self.end_call(now, call, edge, reason),
        }
    }

    /// The core's decision after an attempt of `call` that ended so — the run of a call
    /// whose first attempt did not succeed, built then from its guard. Out of line: only
    /// calls that failed once come here, and keeping the run's code out of the event loop
    /// leaves the loop's registers to the common path.
    #[inline(never)]
    fn decide_with_run(
        &mut self,
        now: Nanos,
        call: u32,
        ended: AttemptOutcome,
    ) -> Option<Decision> {
        let model = self.model;
        let r = self.requests.get_mut(call)?;
        let deadline = r.call_deadline;
        let remaining = || (deadline != NEVER).then(|| duration(deadline.saturating_sub(now)));
        let h = held(&mut self.calls, call)?;
        // A run is only ever this call's: every way a call ends empties its `Held`.
        debug_assert!(r.held || h.run.is_none(), "a run left over in slot {call}");
        let run = match &mut h.run {
            Some(run) => run,
            None => {
                let first = r.first.take()?;
                let edge = model.edges.get(r.edge() as usize)?;
                r.held = true;
                h.run.insert(RetryRun::after_first_attempt(
                    &edge.policy,
                    first,
                    edge.retry_safe,
                ))
            }
        };
        Some(run.finish_attempt(ended, remaining, &mut self.rng))
    }

    /// `call` (on `edge`) stopped: its request goes on, or fails.
    #[inline(always)]
    pub(super) fn end_call(
        &mut self,
        now: Nanos,
        call: u32,
        edge: u32,
        reason: StopReason,
    ) -> Next {
        if reason == StopReason::Succeeded {
            // Ended where it lies: the budget hears that the call ended (nothing below
            // reads the budget, so this may come before the request goes on).
            if let Some(r) = self.requests.get_mut(call) {
                r.end_call(&mut self.calls, call);
            }
            return self.next_call(now, call);
        }
        self.fail_call(now, call, edge)
    }

    /// `call` (on `edge`) failed: its request fails. (Apart from
    /// [`end_call`](World::end_call), so that [`send`](World::send), which calls it when the
    /// breaker is open, is not part of a cycle of calls; out of line, since calls seldom
    /// fail, so that its copies of the request's end take no registers from the common
    /// path.)
    #[inline(never)]
    pub(super) fn fail_call(&mut self, now: Nanos, call: u32, edge: u32) -> Next {
        let model = self.model;
        if let Some(r) = self.requests.get_mut(call) {
            r.end_call(&mut self.calls, call);
        }
        let signals = model
            .edges
            .get(edge as usize)
            .is_some_and(|e| e.retries && e.caller_signal);
        let answer = if signals {
            Answer::Exhausted
        } else {
            Answer::Unavailable
        };
        self.finish(now, call, answer)
    }
}

/// Makes the call of request `r` (in slot `slot`) on `edge` ready to send attempt `token`
/// at `now`: takes the breaker's permit, if any (kept in `calls`), and returns the
/// attempt's deadline and its per-try deadline (if any); `None` when the breaker refuses
/// (the call fails; a refused retry's withdrawal is given back when the run is dropped).
#[inline(always)]
fn attempt<'p>(
    r: &mut Request<'p>,
    calls: &mut Vec<Held<'p>>,
    slot: u32,
    edge: &Edge,
    now: Nanos,
    token: u32,
) -> Option<(Nanos, Option<Nanos>)> {
    if let Some(breaker) = &edge.breaker {
        let permit = breaker.try_acquire_owned().ok()?;
        let h = held(calls, slot)?;
        h.permit = Some(permit);
        h.sent = now;
        r.held = true;
    }
    let per_try = edge.per_try.map(|t| now.saturating_add(t));
    let deadline = per_try.map_or(r.call_deadline, |t| t.min(r.call_deadline));
    r.call_token = token;
    Some((deadline, per_try))
}

/// The call request `r` (at `node`, its node) makes next (its index among the model's
/// calls, now counted as made) and the deadline it brings; `None` when it has made them all.
#[inline(always)]
pub(super) fn next_of(r: &mut Request<'_>, node: &Node) -> Option<(usize, Nanos)> {
    if r.next as usize >= node.edges.end {
        return None;
    }
    let index = r.next as usize;
    r.next += 1;
    Some((index, r.deadline))
}
