//! The stack's per-call view of its [`Observer`]: the core's retrier, hedger and breaker
//! report bare events (attempt 2 started, attempt ended in doubt); these bridges add what the
//! call knows (endpoint, method, request id, the response's status, the attempt's span) and
//! hand the result to the observer.

use std::sync::Mutex;
use std::time::Duration;

use http::StatusCode;
use stormguard::classify::{GrpcCode, Outcome};
use stormguard::hedge::{HedgeObserver, HedgeStop, HedgingStopped};
use stormguard::retry::{AttemptOutcome, RetryObserver, RetryReason, StopReason};
use tokio::time::Instant;

use crate::observe::{AttemptEnd, AttemptStart, CallInfo, HedgeEvent, Observer};

/// What the classifier saw of the attempt in flight.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Details {
    pub(super) status: Option<StatusCode>,
    pub(super) grpc: Option<GrpcCode>,
    pub(super) error_type: Option<&'static str>,
}

#[derive(Default)]
struct AttemptState {
    started: Option<Instant>,
    pending: Option<(RetryReason, Duration)>,
    details: Details,
    /// Start times of hedged attempts, by number.
    hedges: [Option<Instant>; 5],
    #[cfg(feature = "tracing")]
    span: Option<tracing::Span>,
}

/// One call's observer: the stack's [`Observer`] with the call's context.
pub(super) struct CallObserver<'a, O: Observer> {
    observer: &'a O,
    info: CallInfo<'a>,
    state: Mutex<AttemptState>,
}

impl<'a, O: Observer> CallObserver<'a, O> {
    pub(super) fn new(observer: &'a O, info: CallInfo<'a>) -> Self {
        CallObserver {
            observer,
            info,
            state: Mutex::new(AttemptState::default()),
        }
    }

    /// Whether anyone listens: no bookkeeping otherwise.
    const ACTIVE: bool = O::ENABLED || cfg!(feature = "tracing");

    fn with_state(&self, f: impl FnOnce(&mut AttemptState)) {
        if Self::ACTIVE {
            if let Ok(mut state) = self.state.lock() {
                f(&mut state);
            }
        }
    }

    pub(super) fn info(&self) -> &CallInfo<'a> {
        &self.info
    }

    pub(super) fn observer(&self) -> &'a O {
        self.observer
    }

    /// What the classifier read off the attempt's result.
    pub(super) fn record(&self, details: Details) {
        self.with_state(|s| s.details = details);
    }

    /// The span of the attempt in flight (feature `tracing`).
    #[cfg(feature = "tracing")]
    pub(super) fn span(&self) -> tracing::Span {
        self.state
            .lock()
            .ok()
            .and_then(|s| s.span.clone())
            .unwrap_or_else(tracing::Span::none)
    }

    fn ended(
        &self,
        number: u32,
        ended: AttemptOutcome,
        started: Option<Instant>,
        d: Details,
    ) -> AttemptEnd {
        AttemptEnd {
            number,
            elapsed: started.map(|t| t.elapsed()).unwrap_or_default(),
            outcome: ended.outcome,
            timed_out: ended.timed_out,
            status: d.status,
            grpc_status: d.grpc,
            error_type: if ended.timed_out {
                Some("timeout")
            } else {
                d.error_type
            },
        }
    }
}

impl<O: Observer> RetryObserver for CallObserver<'_, O> {
    fn attempt_started(&self, attempt: u32) {
        self.with_state(|s| {
            s.started = Some(Instant::now());
            s.details = Details::default();
            let start = AttemptStart {
                number: attempt,
                retry: s.pending.take(),
            };
            #[cfg(feature = "tracing")]
            {
                s.span = Some(crate::observe::span::attempt_span(&self.info, &start));
            }
            self.observer.attempt_started(&self.info, &start);
        });
    }

    fn attempt_ended(&self, attempt: u32, ended: &AttemptOutcome) {
        self.with_state(|s| {
            let end = self.ended(attempt, *ended, s.started, s.details);
            #[cfg(feature = "tracing")]
            let span = s.span.take();
            #[cfg(feature = "tracing")]
            let _inside = span.as_ref().map(|span| {
                crate::observe::span::attempt_ended(span, &end);
                span.enter()
            });
            self.observer.attempt_ended(&self.info, &end);
        });
    }

    fn retry_scheduled(&self, _next_attempt: u32, delay: Duration, reason: RetryReason) {
        self.with_state(|s| s.pending = Some((reason, delay)));
    }

    fn gave_up(&self, _attempts: u32, reason: StopReason) {
        if reason == StopReason::BudgetExhausted {
            self.observer.budget_refused(&self.info);
        }
    }
}

impl<O: Observer> HedgeObserver for CallObserver<'_, O> {
    fn attempt_sent(&self, attempt: u32) {
        self.with_state(|s| {
            if let Some(slot) = s.hedges.get_mut(attempt.saturating_sub(1) as usize) {
                *slot = Some(Instant::now());
            }
        });
        self.observer.attempt_started(
            &self.info,
            &AttemptStart {
                number: attempt,
                retry: None,
            },
        );
        if attempt > 1 {
            self.observer
                .hedge(&self.info, HedgeEvent::Sent { attempt });
        }
    }

    fn attempt_ended(&self, attempt: u32, outcome: &Outcome) {
        self.with_state(|s| {
            let started = s
                .hedges
                .get(attempt.saturating_sub(1) as usize)
                .copied()
                .flatten();
            let end = self.ended(attempt, AttemptOutcome::from(*outcome), started, s.details);
            self.observer.attempt_ended(&self.info, &end);
        });
    }

    fn attempt_cancelled(&self, attempt: u32) {
        self.observer
            .hedge(&self.info, HedgeEvent::Cancelled { attempt });
    }

    fn hedging_stopped(&self, _sent: u32, why: HedgingStopped) {
        if why == HedgingStopped::Budget {
            self.observer.budget_refused(&self.info);
        }
    }

    fn finished(&self, sent: u32, winner: Option<u32>, stop: HedgeStop) {
        if let (Some(attempt), true) = (winner, sent > 1 && stop == HedgeStop::Succeeded) {
            self.observer.hedge(&self.info, HedgeEvent::Won { attempt });
        }
    }
}
