//! The observer and the per-request context it writes to, when any observability feature
//! is on. What only spans and log lines read (request id, method, status, error type) is
//! kept only when `tracing` or `json-log` is on; `metrics` alone needs just the timings.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use http::StatusCode;
use http::request::Parts;
use stormguard::classify::GrpcCode;
use stormguard::retry::{AttemptOutcome, RetryObserver, RetryReason, StopReason};
use tokio::time::Instant;

/// What the observer knows about the request, set once before its first attempt.
pub(crate) struct CallInfo {
    #[cfg(any(feature = "tracing", feature = "json-log"))]
    pub(super) request_id: Option<http::HeaderValue>,
    #[cfg(any(feature = "tracing", feature = "json-log"))]
    pub(super) method: http::Method,
}

impl CallInfo {
    pub(crate) fn new(parts: &Parts, _grpc: bool) -> Self {
        #[cfg(not(any(feature = "tracing", feature = "json-log")))]
        let _ = parts;
        CallInfo {
            #[cfg(any(feature = "tracing", feature = "json-log"))]
            request_id: parts.headers.get("x-request-id").cloned(),
            #[cfg(any(feature = "tracing", feature = "json-log"))]
            method: parts.method.clone(),
        }
    }

    #[cfg(any(feature = "tracing", feature = "json-log"))]
    pub(super) fn request_id(&self) -> Option<&str> {
        self.request_id.as_ref().and_then(|v| v.to_str().ok())
    }
}

/// What a response or error told about the attempt in flight.
#[cfg(any(feature = "tracing", feature = "json-log"))]
#[derive(Clone, Copy, Default)]
pub(super) struct Details {
    pub(super) status: Option<StatusCode>,
    pub(super) grpc: Option<GrpcCode>,
    pub(super) error_type: Option<&'static str>,
}

/// How one attempt ended, as the sinks report it.
pub(super) struct AttemptEnd<'a> {
    pub(super) elapsed: Duration,
    #[cfg(any(feature = "tracing", feature = "json-log"))]
    pub(super) ended: &'a AttemptOutcome,
    #[cfg(any(feature = "tracing", feature = "json-log"))]
    pub(super) details: Details,
    #[cfg(not(any(feature = "tracing", feature = "json-log")))]
    pub(super) _ended: std::marker::PhantomData<&'a AttemptOutcome>,
}

/// The context of the request in flight, in a task-local.
struct CallState {
    #[cfg(any(feature = "tracing", feature = "json-log"))]
    info: CallInfo,
    started: Option<Instant>,
    pending: Option<(RetryReason, Duration)>,
    #[cfg(any(feature = "tracing", feature = "json-log"))]
    details: Details,
    #[cfg(feature = "tracing")]
    span: ::tracing::Span,
}

tokio::task_local! {
    static CALL: RefCell<CallState>;
}

/// Runs `f` on the current request's context; does nothing outside a request.
fn with_state(f: impl FnOnce(&mut CallState)) {
    let _ = CALL.try_with(|cell| {
        if let Ok(mut state) = cell.try_borrow_mut() {
            f(&mut state);
        }
    });
}

/// Runs `future` (the core's retrier for one request) with the request's context.
pub(crate) fn in_call<F: Future>(info: CallInfo, future: F) -> impl Future<Output = F::Output> {
    #[cfg(not(any(feature = "tracing", feature = "json-log")))]
    let _ = info;
    let state = CallState {
        #[cfg(any(feature = "tracing", feature = "json-log"))]
        info,
        started: None,
        pending: None,
        #[cfg(any(feature = "tracing", feature = "json-log"))]
        details: Details::default(),
        #[cfg(feature = "tracing")]
        span: ::tracing::Span::none(),
    };
    CALL.scope(RefCell::new(state), future)
}

/// Runs one attempt's future inside the attempt's span.
#[cfg(feature = "tracing")]
pub(crate) fn instrument<F: Future>(future: F) -> impl Future<Output = F::Output> {
    use ::tracing::Instrument;
    let span = CALL
        .try_with(|cell| cell.try_borrow().map(|s| s.span.clone()).ok())
        .ok()
        .flatten()
        .unwrap_or_else(::tracing::Span::none);
    future.instrument(span)
}

/// Without spans there is nothing to run the attempt in.
#[cfg(not(feature = "tracing"))]
pub(crate) fn instrument<F: Future>(future: F) -> F {
    future
}

/// The attempt got a response with this status (and gRPC status).
pub(crate) fn record_response(status: StatusCode, grpc: Option<GrpcCode>) {
    #[cfg(any(feature = "tracing", feature = "json-log"))]
    with_state(|s| {
        s.details.status = Some(status);
        s.details.grpc = grpc;
    });
    #[cfg(not(any(feature = "tracing", feature = "json-log")))]
    let _ = (status, grpc);
}

/// The attempt failed with a transport error.
pub(crate) fn record_error(error: &(dyn std::error::Error + Send + Sync + 'static)) {
    #[cfg(any(feature = "tracing", feature = "json-log"))]
    with_state(|s| s.details.error_type = Some(crate::wire::error_type(error)));
    #[cfg(not(any(feature = "tracing", feature = "json-log")))]
    let _ = error;
}

/// The request ended; failures were counted when the retrier gave up.
pub(crate) fn finished(stop: StopReason) {
    #[cfg(feature = "metrics")]
    if stop == StopReason::Succeeded {
        super::metrics::request_finished(stop);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = stop;
}

/// The core retrier's observer: forwards each event to the sinks that are compiled in,
/// with the context of the request in flight.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Observe;

impl RetryObserver for Observe {
    fn attempt_started(&self, attempt: u32) {
        with_state(|s| {
            s.started = Some(Instant::now());
            let retry = s.pending.take();
            #[cfg(any(feature = "tracing", feature = "json-log"))]
            {
                s.details = Details::default();
            }
            #[cfg(feature = "metrics")]
            super::metrics::attempt_started(retry);
            #[cfg(feature = "tracing")]
            {
                s.span = super::tracing::attempt_span(&s.info, attempt, retry);
            }
            #[cfg(not(feature = "tracing"))]
            let _ = (attempt, retry);
        });
    }

    fn attempt_ended(&self, attempt: u32, ended: &AttemptOutcome) {
        with_state(|s| {
            #[cfg(any(feature = "tracing", feature = "json-log"))]
            if ended.timed_out {
                s.details.error_type = Some("timeout");
            }
            let end = AttemptEnd {
                elapsed: s.started.map(|t| t.elapsed()).unwrap_or_default(),
                #[cfg(any(feature = "tracing", feature = "json-log"))]
                ended,
                #[cfg(any(feature = "tracing", feature = "json-log"))]
                details: s.details,
                #[cfg(not(any(feature = "tracing", feature = "json-log")))]
                _ended: std::marker::PhantomData,
            };
            #[cfg(feature = "metrics")]
            super::metrics::attempt_ended(&end);
            #[cfg(feature = "tracing")]
            super::tracing::attempt_ended(&s.span, &end);
            #[cfg(feature = "json-log")]
            {
                #[cfg(feature = "tracing")]
                let _inside = s.span.enter();
                super::json::attempt_ended(&s.info, attempt, &end);
            }
            #[cfg(feature = "tracing")]
            {
                s.span = ::tracing::Span::none();
            }
            #[cfg(not(feature = "json-log"))]
            let _ = attempt;
            #[cfg(not(any(feature = "tracing", feature = "json-log")))]
            let _ = ended;
        });
    }

    fn retry_scheduled(&self, _next_attempt: u32, delay: Duration, reason: RetryReason) {
        with_state(|s| s.pending = Some((reason, delay)));
    }

    fn gave_up(&self, _attempts: u32, reason: StopReason) {
        #[cfg(feature = "metrics")]
        super::metrics::request_finished(reason);
        #[cfg(not(feature = "metrics"))]
        let _ = reason;
    }
}
