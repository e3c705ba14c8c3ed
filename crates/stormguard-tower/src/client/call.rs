//! One call through the stack, in the documented order: deadline, throttle, retry or hedge
//! with the budget, breaker per attempt, attempt deadline on the wire, transport.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{self, Either, FutureExt, TryFutureExt};
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use stormguard::admission::{DeadlineTooClose, Refusal};
use stormguard::classify::Outcome;
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline, DeadlineHeaders, Selection};
use stormguard::hedge::{HedgeFailure, HedgeStop};
use stormguard::policy::Fallback as FallbackMode;
use stormguard::retry::{Attempt, Call, Failure, Report, StopReason};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_service::Service;

use super::ConnectTimeout;
use super::classify::CallClassifier;
use super::endpoint::Endpoint;
use super::error::{BodyNotReplayable, Error};
use super::fallback::{FALLBACK_HEADER, FallbackRequest};
use super::observer::CallObserver;
use super::{Shared, marks_exhausted};
use crate::body::ReplayBody;
use crate::observe::{CallEnd, CallInfo, FallbackReason, Observer};
use crate::wire::{self, BoxError, Protocol};

/// The response a call resolves to.
pub(crate) type CallResult<ResB> = Result<Response<ReplayBody<ResB>>, Error>;

/// One logical request. The service may borrow (a reqwest middleware chain's `Next`): the
/// call runs in the caller's task and spawns nothing.
pub(crate) async fn run<S, ReqB, ResB, O>(
    shared: Arc<Shared<O>>,
    endpoint: Arc<Endpoint<O>>,
    service: S,
    request: Request<ReqB>,
) -> CallResult<ResB>
where
    S: Service<Request<ReplayBody<ReqB>>, Response = Response<ResB>> + Clone + Send,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ReqB: Body + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
    O: Observer,
{
    let (mut original, body) = request.into_parts();
    let protocol = Protocol::of(&original.headers);
    wire::set_attempt(&mut original.headers, 1, protocol);
    let policy = &endpoint.policy;
    let keyed = wire::has_idempotency_key(&original.headers);
    let safe = wire::is_retry_safe(
        &original.method,
        protocol,
        keyed,
        policy.retry().idempotent(),
    );
    // The first attempt sends the caller's request itself; a copy of its head stays here for
    // retries, hedges, the observer and the fallback.
    let template = Template::of(&original);
    let parts = &template.parts;
    let request_id = wire::find(&parts.headers, &wire::REQUEST_ID).and_then(|v| v.to_str().ok());
    let info = CallInfo::new(&endpoint.name, &parts.method, protocol, request_id)
        .with_metric_keys(&endpoint.metric_keys);
    let observer = CallObserver::new(&*shared.observer, info);
    let started = O::ENABLED.then(Instant::now);

    if policy.fallback() == FallbackMode::Always {
        if let Some(answer) =
            fallback(&shared, &endpoint, parts, &observer, FallbackReason::Forced).await
        {
            return Ok(answer);
        }
    }

    // The call's own deadline: the policy's overall timeout, a deadline in the request's
    // extensions, and any deadline header already on the request (an outer
    // `PropagateDeadlineLayer`), whichever is earliest. The task's deadline is read too.
    let mut own = policy
        .overall_timeout()
        .map(|timeout| Deadline::after(timeout, Clock::tokio()));
    if let Some(d) = parts.extensions.get::<Deadline>() {
        own = Some(earliest(own, d.clone()));
    }
    let announced = wire::has_deadline_header(&parts.headers).then(|| {
        wire::read_deadline(
            &parts.headers,
            DeadlineHeaders::ALL,
            Selection::Earliest,
            &shared.options.wall,
        )
    });
    let mut rewrite = None;
    if let Some(found) = announced.and_then(|r| r.found) {
        own = Some(earliest(
            own,
            Deadline::after(found.remaining, Clock::tokio()),
        ));
        // The request already carries a deadline: keep its formats, with each attempt's time.
        rewrite = Some(
            DeadlineHeaders::ALL
                .iter()
                .filter(|h| parts.headers.contains_key(wire::header_name(*h)))
                .collect::<Vec<_>>(),
        );
    }
    // A keyed request is retry-safe; the key itself travels in the copied headers.
    let mut call = Call::new().idempotent(safe);
    if let Some(deadline) = own {
        call = call.with_deadline(deadline);
    }

    if let Some(throttle) = &endpoint.throttle {
        if let Err(throttled) = throttle.try_acquire() {
            let refusal = Refusal::Throttled(throttled);
            observer.observer().refused(observer.info(), &refusal);
            return refused(&shared, &endpoint, parts, &observer, refusal, 0, started).await;
        }
    }

    let body = ReplayBody::new(body, shared.options.body_limit);
    let formats = match &rewrite {
        Some(list) => DeadlineHeaders::new(list).ok(),
        None if shared.options.propagate => Some(policy.propagation().headers.0),
        None => None,
    };
    let reserve = if rewrite.is_some() {
        stormguard::deadline::Reserve::NONE
    } else {
        policy.propagation().reserve
    };
    let send = Sender {
        parts,
        body: &body,
        protocol,
        formats,
        reserve,
        min_call: policy.retry().min_call(),
        connect_timeout: policy.connect_timeout().map(ConnectTimeout),
        grpc_limit: shared.options.grpc_response_limit,
        wall: &shared.options.wall,
    };
    let classifier = CallClassifier {
        protocol,
        safe,
        grpc_codes: shared.options.grpc_codes,
        errors: shared.options.error_classifier,
        body: &body,
        observer: &observer,
    };

    // Copies run side by side: hedge only a body known to fit the replay limit.
    let fits = body
        .size_hint()
        .upper()
        .is_some_and(|len| len <= shared.options.body_limit as u64);
    let report = match &endpoint.hedger {
        Some(hedger) if call.is_retry_safe(policy.retry().idempotent()) && fits => {
            let breaker = endpoint.breaker.clone();
            let window = endpoint.window.clone().filter(|_| breaker.is_none());
            // The caller made `service` ready: the first attempt must go through it (a
            // clone of a `Buffer`, such as a tonic channel, is not ready); later ones through
            // clones made ready by `oneshot`.
            let mut spares = service.clone();
            let mut first = Some((service, original));
            let observer_ref = &observer;
            let op = move |attempt: Attempt| {
                // The first attempt uses up the caller's ready service and head, sent or not.
                let first = first.take();
                // The hedger polls an attempt as soon as it makes it, unless an earlier copy
                // has just answered: then this permit is taken and let go unused.
                let permit = match &breaker {
                    Some(breaker) => match breaker.try_acquire_owned() {
                        Ok(permit) => Some(permit),
                        Err(open) => {
                            let refused = BoxError::from(Refusal::BreakerOpen(open));
                            return Either::Left(future::ready(Err(refused)));
                        }
                    },
                    None => None,
                };
                let window = window.clone();
                let sent = send.attempt(&attempt, first, &mut spares, observer_ref);
                let at = Instant::now();
                Either::Right(sent.map(move |result| {
                    let health = || match &result {
                        Ok(response) => wire::health_outcome(response.status(), response.headers()),
                        Err(e) => wire::classify_transport_error(e.as_ref()),
                    };
                    if let Some(permit) = permit {
                        permit.record(health(), at.elapsed());
                    } else if let Some(window) = &window {
                        // The latency window a percentile hedge reads.
                        window.record(health(), at.elapsed());
                    }
                    result
                }))
            };
            let report = hedger
                .run_report_with(call, op, classifier, &observer)
                .await;
            let stop = match report.stop {
                HedgeStop::Succeeded => StopReason::Succeeded,
                HedgeStop::Fatal => StopReason::NeverRetry,
                HedgeStop::AllFailed => StopReason::AttemptsExhausted,
                HedgeStop::DeadlineExceeded => StopReason::DeadlineTooClose,
                HedgeStop::Cancelled => StopReason::Cancelled,
            };
            let result = match report.result {
                Ok(response) => Ok(response),
                Err(HedgeFailure::Error(e)) => Err(Failure::Error(e)),
                Err(HedgeFailure::DeadlineExceeded) => Err(Failure::TimedOut(Duration::ZERO)),
            };
            let (stop, result) = match &result {
                Err(Failure::Error(e)) => match wire::refusal_of(e.as_ref()) {
                    Some(refusal) => (refusal.stop_reason(), Err(Failure::Refused(refusal))),
                    None => (stop, result),
                },
                _ => (stop, result),
            };
            Report {
                result,
                attempts: report.sent,
                stop,
            }
        }
        _ => {
            // The operation holds references only: the retry loop keeps it (and moves it)
            // for the whole call, so each byte it holds is paid several times over.
            let mut spares = service.clone();
            let mut first = Some((service, original));
            let (first, spares, send, observer) = (&mut first, &mut spares, &send, &observer);
            let op = move |attempt: Attempt| send.attempt(&attempt, first.take(), spares, observer);
            endpoint
                .retrier
                .run_report_with(call, op, classifier, observer)
                .await
        }
    };

    if let Some(throttle) = &endpoint.throttle {
        let accepted = match &report.result {
            Ok(response) => wire::health_outcome(response.status(), response.headers()),
            Err(Failure::Refused(_)) => Outcome::Success,
            Err(_) => Outcome::InDoubt,
        };
        throttle.record(accepted);
    }
    finish(&shared, &endpoint, parts, &observer, report, started).await
}

/// Everything an attempt's request is made of.
struct Sender<'a, ReqB> {
    parts: &'a Parts,
    body: &'a ReplayBody<ReqB>,
    protocol: Protocol,
    /// The deadline headers each attempt carries, if any.
    formats: Option<DeadlineHeaders>,
    reserve: stormguard::deadline::Reserve,
    min_call: Duration,
    /// The policy's connect timeout, handed to the transport with each attempt.
    connect_timeout: Option<ConnectTimeout>,
    grpc_limit: usize,
    wall: &'a stormguard::deadline::WallClock,
}

impl<ReqB> Sender<'_, ReqB>
where
    ReqB: Body + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
{
    /// The future of one attempt: the first is sent through the service made ready by the
    /// caller with the caller's own head (`first`), a later one through a ready clone of
    /// `spare` with a copy of the template; each with its number and deadline on the wire,
    /// under the attempt's deadline. Either service is called on the attempt's first poll,
    /// inside the attempt's deadline scope and span, where a layer below reads them.
    ///
    /// Built from combinators, not an `async` block: a block would keep the request and the
    /// service's future twice over, once as what it captured and once as what it awaits,
    /// and every call pays for each byte of an attempt's future several times (it is moved
    /// into the retry loop's future, which is moved into the call's box).
    fn attempt<S, ResB, O>(
        &self,
        attempt: &Attempt,
        first: Option<(S, Parts)>,
        spares: &mut S,
        observer: &CallObserver<'_, O>,
    ) -> impl Future<Output = Result<Response<ReplayBody<ResB>>, BoxError>> + Send + use<ReqB, S, ResB, O>
    where
        S: Service<Request<ReplayBody<ReqB>>, Response = Response<ResB>> + Clone + Send,
        S::Future: Send,
        S::Error: Into<BoxError>,
        ResB: Body + Send + 'static,
        ResB::Data: Send,
        ResB::Error: Into<BoxError>,
        O: Observer,
    {
        let grpc_limit = self.grpc_limit;
        let fill = self.protocol == Protocol::Grpc;
        let (first, head) = match first {
            Some((service, head)) => (Some(service), Some(head)),
            None => (None, None),
        };
        let sent = match self.request(attempt, head) {
            Err(refused) => Either::Left(future::ready(Err(refused))),
            Ok((request, deadline)) => {
                let call = match first {
                    Some(mut service) => {
                        Either::Left(future::lazy(move |_| service.call(request)).flatten())
                    }
                    None => Either::Right(spares.clone().oneshot(request)),
                };
                let call = match deadline {
                    Some(deadline) => Either::Left(deadline::scope(deadline, call)),
                    None => Either::Right(call),
                };
                Either::Right(call.map_err(Into::into))
            }
        };
        let future = sent.and_then(move |response| {
            let (head, body) = response.into_parts();
            if !fill {
                let response = Response::from_parts(head, ReplayBody::passthrough(body));
                return Either::Left(future::ready(Ok(response)));
            }
            // A unary gRPC response says how it went in its trailers: read it (bounded).
            Either::Right(async move {
                let mut body = ReplayBody::new(body, grpc_limit);
                Box::pin(body.fill()).await?;
                Ok(Response::from_parts(head, body))
            })
        });
        #[cfg(feature = "tracing")]
        let future = tracing::Instrument::instrument(future, observer.span());
        #[cfg(not(feature = "tracing"))]
        let _ = observer;
        future
    }

    /// The request of `attempt` and the deadline it runs under, or why it cannot be sent:
    /// `original` is the caller's own head (the first attempt), else the template is copied.
    fn request(
        &self,
        attempt: &Attempt,
        original: Option<Parts>,
    ) -> Result<(Request<ReplayBody<ReqB>>, Option<Deadline>), BoxError> {
        let body = self
            .body
            .try_clone()
            .ok_or_else(|| BoxError::from(BodyNotReplayable))?;
        let mut request = match original {
            Some(head) => Request::from_parts(head, body),
            None => {
                let parts = self.parts;
                let mut request = Request::new(body);
                *request.method_mut() = parts.method.clone();
                *request.uri_mut() = parts.uri.clone();
                *request.version_mut() = parts.version;
                *request.extensions_mut() = parts.extensions.clone();
                *request.headers_mut() = parts.headers.clone();
                wire::set_attempt(request.headers_mut(), attempt.number, self.protocol);
                request
            }
        };
        if let Some(connect) = self.connect_timeout {
            request.extensions_mut().insert(connect);
        }
        let headers = request.headers_mut();
        // The attempt's own limit, else (only when it is to be written on the wire) what is
        // left of the task's deadline, which needs no scope of its own.
        let (timeout, scoped) = match attempt.timeout {
            Some(timeout) => (Some(timeout), true),
            None if self.formats.is_some() => (
                deadline::with_current(|d| d.map(Deadline::remaining)),
                false,
            ),
            None => (None, false),
        };
        let deadline = match timeout {
            None => None,
            Some(timeout) => {
                if let Some(formats) = self.formats {
                    let handed = timeout.saturating_sub(self.reserve.kept_from(timeout));
                    if handed.is_zero() || handed < self.min_call {
                        return Err(BoxError::from(DeadlineTooClose {
                            remaining: handed,
                            min_call: self.min_call,
                        }));
                    }
                    wire::write_deadline(headers, formats, handed, self.wall);
                }
                scoped.then(|| Deadline::after(timeout, Clock::tokio()))
            }
        };
        Ok((request, deadline))
    }
}

/// The caller's request head as the call keeps it: what retries copy, and what the observer
/// and the fallback read. Its header map comes from (and returns to) a small per-thread pool,
/// so keeping it costs no allocation once the pool is warm (header names and values are
/// reference-counted; one built from a string is moved to shared storage on its first copy).
struct Template {
    parts: Parts,
}

/// Header maps kept per thread for [`Template`]s, and their bounds.
const POOLED_MAPS: usize = 64;
const POOLED_CAPACITY: usize = 64;

thread_local! {
    static HEADER_MAPS: std::cell::RefCell<Vec<http::HeaderMap>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl Template {
    fn of(original: &Parts) -> Template {
        let mut headers = HEADER_MAPS
            .with(|pool| pool.try_borrow_mut().ok().and_then(|mut p| p.pop()))
            .unwrap_or_default();
        for (name, value) in &original.headers {
            headers.append(name.clone(), value.clone());
        }
        let (mut parts, ()) = Request::new(()).into_parts();
        parts.method = original.method.clone();
        parts.uri = original.uri.clone();
        parts.version = original.version;
        parts.extensions = original.extensions.clone();
        parts.headers = headers;
        Template { parts }
    }
}

impl Drop for Template {
    fn drop(&mut self) {
        let mut headers = std::mem::take(&mut self.parts.headers);
        if headers.capacity() > POOLED_CAPACITY {
            return;
        }
        headers.clear();
        HEADER_MAPS.with(|pool| {
            if let Ok(mut pool) = pool.try_borrow_mut() {
                if pool.len() < POOLED_MAPS {
                    pool.push(headers);
                }
            }
        });
    }
}

fn earliest(a: Option<Deadline>, b: Deadline) -> Deadline {
    match a {
        Some(a) => a.min(b),
        None => b,
    }
}

/// Turns the report into the caller's answer: marks exhausted failures, asks the fallback
/// when the stack gave up, and tells the observer.
async fn finish<ResB, O: Observer>(
    shared: &Shared<O>,
    endpoint: &Endpoint<O>,
    parts: &Parts,
    observer: &CallObserver<'_, O>,
    report: Report<Response<ReplayBody<ResB>>, BoxError>,
    started: Option<Instant>,
) -> CallResult<ResB> {
    let Report {
        result,
        attempts,
        stop,
    } = report;
    if let Err(Failure::Refused(refusal)) = &result {
        observer.observer().refused(observer.info(), refusal);
    }
    let gave_up = !matches!(
        stop,
        StopReason::Succeeded
            | StopReason::Cancelled
            | StopReason::NeverRetry
            | StopReason::NotIdempotent
    );
    let marked = stop != StopReason::Succeeded && marks_exhausted(stop, attempts);
    let answer = match result {
        Ok(mut response) => {
            if marked {
                wire::mark_exhausted(response.headers_mut());
            }
            Ok(response)
        }
        Err(Failure::Error(source)) => Err(match wire::refusal_of(source.as_ref()) {
            Some(refusal) => Error::Refused {
                attempts,
                source: refusal,
            },
            None => Error::Transport {
                attempts,
                stop,
                source,
            },
        }),
        Err(Failure::TimedOut(after)) => Err(Error::TimedOut {
            attempts,
            stop,
            after,
        }),
        Err(Failure::Refused(source)) => Err(Error::Refused { attempts, source }),
    };
    if O::ENABLED {
        observer.observer().call_finished(
            observer.info(),
            &CallEnd {
                attempts,
                stop,
                elapsed: started.map(|t| t.elapsed()).unwrap_or_default(),
                marked_exhausted: marked,
            },
        );
    }
    if gave_up && endpoint.policy.fallback() == FallbackMode::OnGiveUp && shared.fallback.is_some()
    {
        let reason = match &answer {
            Err(Error::Refused { source, .. }) => FallbackReason::Refused(*source),
            _ => FallbackReason::GaveUp(stop),
        };
        if let Some(response) = fallback(shared, endpoint, parts, observer, reason).await {
            return Ok(response);
        }
    }
    answer
}

/// A call refused before anything was sent.
async fn refused<ResB, O: Observer>(
    shared: &Shared<O>,
    endpoint: &Endpoint<O>,
    parts: &Parts,
    observer: &CallObserver<'_, O>,
    refusal: Refusal,
    attempts: u32,
    started: Option<Instant>,
) -> CallResult<ResB> {
    if O::ENABLED {
        observer.observer().call_finished(
            observer.info(),
            &CallEnd {
                attempts,
                stop: refusal.stop_reason(),
                elapsed: started.map(|t| t.elapsed()).unwrap_or_default(),
                marked_exhausted: true,
            },
        );
    }
    if endpoint.policy.fallback() == FallbackMode::OnGiveUp {
        if let Some(response) = fallback(
            shared,
            endpoint,
            parts,
            observer,
            FallbackReason::Refused(refusal),
        )
        .await
        {
            return Ok(response);
        }
    }
    Err(Error::Refused {
        attempts,
        source: refusal,
    })
}

/// The fallback's answer, marked with the reason, if a fallback is installed and answers.
async fn fallback<ResB, O: Observer>(
    shared: &Shared<O>,
    endpoint: &Endpoint<O>,
    parts: &Parts,
    observer: &CallObserver<'_, O>,
    reason: FallbackReason,
) -> Option<Response<ReplayBody<ResB>>> {
    let source = shared.fallback.as_ref()?;
    let request = FallbackRequest {
        head: parts,
        endpoint: &endpoint.name,
        reason,
    };
    let answer: Response<Bytes> = source.answer(&request).await?;
    observer.observer().fallback(observer.info(), reason);
    let (mut head, bytes) = answer.into_parts();
    if let Ok(value) = http::HeaderValue::from_str(reason.label()) {
        head.headers.insert(FALLBACK_HEADER, value);
    }
    Some(Response::from_parts(head, ReplayBody::from_bytes(bytes)))
}
