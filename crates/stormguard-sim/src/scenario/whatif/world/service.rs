//! The service side of the event loop: a request arriving at a service (refused, waiting
//! for a worker, or set to work), its answer going up to its caller, and a freed worker
//! going to the next request waiting.

use super::*;

impl<'p> World<'p> {
    /// A request (an attempt of `caller`, or an entry request) arrives at `node`. Returns
    /// when its answer is known to come ([`NEVER`]: not known): at once, refused; or at the
    /// end of work that needs no further call. A refusal's reply to the caller is pushed on
    /// the stack of steps, so it is the step worked on next, as if it were returned: the
    /// answer is one register, and most arrivals have no step to hand back.
    ///
    /// Out of line, though every request comes here: inlined at its three places in the
    /// event loop, its many values (the request being built, the draw, the slot) competed for
    /// the loop's registers and were moved to and from the stack around it; as a function of
    /// its own it is allocated alone, and the whole run executes about 0.6 % fewer
    /// instructions (outlining `send`, `finish` or `release` instead was measured too: each
    /// costs 2 to 5 % more; inlining it again once it returned one register cost 1.2 %
    /// more).
    #[inline(never)]
    pub(super) fn arrive(
        &mut self,
        now: Nanos,
        node: usize,
        service: usize,
        caller: u32,
        token: u32,
        deadline: Nanos,
    ) -> Nanos {
        let Some(state) = self.state.get_mut(service) else {
            return NEVER;
        };
        state.stats.now().arrivals += 1;
        let active = state.faults.at(now);
        let mut refused = if active.outage {
            Some(Answer::Refused)
        } else if active.p503 > 0.0 && crate::rng::unit(&mut self.rng) < active.p503 {
            Some(Answer::Unavailable)
        } else {
            None
        };
        if refused.is_none() {
            let deadline = deadline | state.ignored_deadline;
            let request = move || Request {
                node: node as u32,
                caller,
                token,
                next: 0,
                call_token: IDLE,
                arrived: now,
                deadline,
                call_deadline: NEVER,
                first: None,
                cut: false,
                held: false,
            };
            if state.busy < state.workers {
                let model = self.model;
                let Some(n) = model.nodes.get(node) else {
                    return NEVER;
                };
                // Stored first and then set to work where it lies (taking the slot draws
                // nothing, so the draws come in the same order).
                let Some((slot, r)) = self.requests.insert_with(request) else {
                    self.full("too many requests in flight");
                    return NEVER;
                };
                let end = begin_work(now, n, state, active, &mut self.rng, r);
                // Work that ends in time and calls nothing: its answer is known to come then.
                let known = if !r.cut && n.edges.is_empty() {
                    end
                } else {
                    NEVER
                };
                self.queue.push(end, pack(DONE, slot, 0));
                return known;
            }
            if state.waiting.len() < state.queue {
                let Some(slot) = self.insert(request()) else {
                    return NEVER;
                };
                if let Some(state) = self.state.get_mut(service) {
                    state.waiting.push_back(slot);
                    state.stats.queue_peak = state.stats.queue_peak.max(state.waiting.len());
                }
                return NEVER;
            }
            refused = Some(Answer::Unavailable);
        }
        // Answered at once, without a worker.
        if let Some(s) = self.state.get_mut(service) {
            s.stats.now().failed += 1;
        }
        if let Some(reply) = self.answer(caller, token, refused.unwrap_or(Answer::Unavailable)) {
            self.steps.push(reply);
        }
        now
    }

    /// Stores a request; `None` (and the run's error) when the slab is full.
    #[inline(always)]
    pub(super) fn insert(&mut self, request: Request<'p>) -> Option<u32> {
        let slot = self.requests.insert(request);
        if slot.is_none() {
            self.full("too many requests in flight");
        }
        slot
    }

    #[cold]
    pub(super) fn full(&mut self, why: &str) {
        self.error
            .get_or_insert_with(|| InvalidParam::new("rate", why.to_owned()));
    }

    /// Gives `slot` (waiting in its service's queue) a worker and schedules the end of its
    /// work.
    #[inline(always)]
    pub(super) fn start_work(&mut self, now: Nanos, slot: u32) -> Option<()> {
        let model = self.model;
        let r = self.requests.get_mut(slot)?;
        let node = model.nodes.get(r.node as usize)?;
        let state = self.state.get_mut(node.service)?;
        let active = state.faults.at(now);
        let end = begin_work(now, node, state, active, &mut self.rng, r);
        self.queue.push(end, pack(DONE, slot, 0));
        Some(())
    }

    /// Hands an answer to the caller: the reply step, unless it is an entry request.
    #[inline(always)]
    pub(super) fn answer(&mut self, caller: u32, token: u32, answer: Answer) -> Next {
        if caller == NONE {
            if answer == Answer::Ok {
                self.entry_ok += 1;
            } else {
                self.entry_failed += 1;
            }
            None
        } else {
            Some(Step::Reply {
                call: caller,
                token,
                answer,
            })
        }
    }

    /// A request ends with `answer`: its worker is freed once its caller has been told.
    #[inline(always)]
    pub(super) fn finish(&mut self, now: Nanos, slot: u32, answer: Answer) -> Next {
        let model = self.model;
        let (node, caller, token, arrived) = self
            .requests
            .free_after(slot, |r| (r.node, r.caller, r.token, r.arrived))?;
        let service = model.nodes.get(node as usize)?.service;
        let mut limited = true;
        if let Some(state) = self.state.get_mut(service) {
            limited = state.workers != UNLIMITED;
            let s = &mut state.stats;
            if answer == Answer::Ok {
                s.now().ok += 1;
                s.record_latency(now - arrived);
            } else {
                s.now().failed += 1;
            }
        }
        if !limited {
            // Nothing waits for a worker of a service without a limit.
            return self.answer(caller, token, answer);
        }
        let release = Step::Release {
            service: service as u32,
        };
        match self.answer(caller, token, answer) {
            Some(reply) => {
                self.steps.push(release);
                Some(reply)
            }
            None => Some(release),
        }
    }

    /// A worker of `service` is free: the next request in its queue gets it. A request
    /// whose deadline passed while it waited is dropped at no cost when the service honours
    /// deadlines.
    #[inline(always)]
    pub(super) fn release(&mut self, now: Nanos, service: usize) -> Next {
        let state = self.state.get_mut(service)?;
        state.busy = state.busy.saturating_sub(1);
        let next = state.waiting.pop_front()?;
        if self.requests.get(next).is_some_and(|r| r.deadline <= now) {
            self.requests.free(next);
            if let Some(s) = self.state.get_mut(service) {
                s.stats.abandoned += 1;
            }
            return self.release_more(now, service);
        }
        self.start_work(now, next);
        None
    }

    /// The rest of [`release`](World::release) once a queued request was dropped (rare:
    /// kept out of the common path).
    #[cold]
    pub(super) fn release_more(&mut self, now: Nanos, service: usize) -> Next {
        while let Some(next) = self
            .state
            .get_mut(service)
            .and_then(|s| s.waiting.pop_front())
        {
            let expired = self.requests.get(next).is_some_and(|r| r.deadline <= now);
            if expired {
                self.requests.free(next);
                if let Some(s) = self.state.get_mut(service) {
                    s.stats.abandoned += 1;
                }
                continue;
            }
            self.start_work(now, next);
            break;
        }
        None
    }
}

/// `r` gets a worker of `state` at `now`: draws its work (the faults in force at `now`,
/// `active`, stretch it) and returns when it ends, cut at its deadline; `r` is made ready
/// to make its node's calls.
#[inline(always)]
fn begin_work(
    now: Nanos,
    node: &Node,
    state: &mut ServiceState,
    active: faults::Active,
    rng: &mut SmallRng,
    r: &mut Request<'_>,
) -> Nanos {
    let mut work = node.work.sample(rng);
    if active.scale != 1.0 {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let scaled = (work as f64 * active.scale).min(Nanos::MAX as f64) as Nanos;
        work = scaled;
    }
    work = work.saturating_add(active.added);
    let mut end = now.saturating_add(work);
    if r.deadline < end {
        end = r.deadline;
        r.cut = true;
    }
    r.next = node.edges.start as u32;
    state.busy += u32::from(state.workers != UNLIMITED);
    state.stats.now().admitted += 1;
    end
}
