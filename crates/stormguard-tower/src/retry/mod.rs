//! The core's retrier as a tower layer, for HTTP and gRPC clients.
//!
//! # Why a retry layer needs more than a loop
//!
//! Retrying an HTTP request is easy to write and easy to get wrong in ways that only show
//! in an outage: the body was a stream and the retry sends nothing; a `POST` that timed out
//! is sent again and the customer is charged twice; a server that said `Retry-After: 5` is
//! hit again after 100 ms; and three services that each retry three times turn one failing
//! database into 27 requests per user click. [`RetryLayer`] is the core's
//! [`Retrier`](stormguard::retry::Retrier) (attempts, backoff, budget, deadline, per-try
//! timeout) with those HTTP and gRPC facts wired in. It adds no retry loop of its own: each
//! request runs [`Retrier::run_report`](stormguard::retry::Retrier::run_report) once.
//!
//! # What is retried
//!
//! - **Idempotency.** A request is *retry-safe* when its method is idempotent (GET, HEAD,
//!   OPTIONS, TRACE, PUT, DELETE), when it carries an `Idempotency-Key` header (the same
//!   header, hence the same key, goes out on every attempt), or when its route's policy says
//!   `idempotency = "idempotent"`. A retry-safe request is retried after any retryable
//!   failure, including an in-doubt one (a timeout or a reset after sending). A request that
//!   is not retry-safe is retried only when it provably never reached the server (a refused
//!   connection); any response or in-doubt failure ends it, with stop reason
//!   `not_idempotent` — a `503` from an application may come after a side effect.
//! - **Responses** are classified by the core's
//!   [`classify_http_response`](stormguard::classify::classify_http_response): 408, 425, 502,
//!   503 and 504 are retried, 429 and 503 with `Retry-After` are retried no sooner than it
//!   says (a malformed `Retry-After` counts as absent), every other 4xx/5xx is not. The
//!   failure response of the last attempt is returned as the response (as tower's retry
//!   does), not as an error.
//! - **Transport errors** of the inner service are classified by type
//!   ([`classify_transport_error`]): a refused connection is retried for any request, a
//!   reset or an incomplete response after sending only for a retry-safe one.
//! - **Per-try timeout** and deadline: the core's — each attempt gets
//!   `min(per_try, remaining)`, no retry starts when the deadline cannot fit the wait plus
//!   the policy's minimum call time, and the task's deadline
//!   ([`stormguard::deadline::scope`]) or the route's `overall` timeout bounds the call.
//! - **Bodies** are read into memory before the first attempt, up to
//!   [`RetryLayerBuilder::with_body_limit`] (64 KiB by default), and every attempt sends the
//!   same bytes and trailers. A larger body is sent once, as it streams, and **its request is
//!   not retried**. Reading first delays the first byte of a large upload by its transfer
//!   time; raise the limit only as far as memory per request in flight allows.
//!
//! Every attempt is a copy of the original request: method, URI, version, extensions and
//! *all* headers, so the trace context (`traceparent`, `tracestate`), `x-request-id`, an
//! `Idempotency-Key` and any header of your own reach every attempt unchanged. The layer
//! sets `x-stormguard-attempt: <n>` on each (1 for the first) and, on gRPC retries,
//! `grpc-previous-rpc-attempts: <n - 1>` (gRPC A6).
//!
//! # gRPC
//!
//! A request whose `content-type` starts with `application/grpc` is classified by gRPC A6
//! ([`classify_grpc`](stormguard::classify::classify_grpc)) against
//! [`RetryLayerBuilder::with_grpc_codes`] (`{UNAVAILABLE}` by default), honouring
//! `grpc-retry-pushback-ms` (a negative or malformed value means do not retry). The status is
//! read from the response headers (a trailers-only response) or, for a unary response, from
//! the trailers: the layer reads the response body, up to
//! [`RetryLayerBuilder::with_grpc_response_limit`], and hands back the buffered copy. A
//! longer (streaming) response is handed on unread and counts as committed — it is not
//! retried, as A6 commits an RPC once response data arrives. gRPC methods are all `POST`, so
//! the method says nothing: the configured codes are retried for every gRPC call (A6), and
//! an in-doubt failure only with a key or an idempotent route policy.
//!
//! # Only one layer of a chain retries
//!
//! In a chain A → B → C where every hop retries 3 times, C sees 27 requests for one of A's
//! — exactly when C is failing. So a layer never retries a response marked
//! `X-Retry-Exhausted: true` (or carrying Finagle's `finagle-http-nonretryable-nack`), and
//! marks the failures it gave up on, so the hop that forwards them stops the layer above.
//!
//! ## When a response is marked
//!
//! The layer adds `X-Retry-Exhausted: true` to the response it returns when that response
//! is a failure and either
//!
//! - it **sent more than one attempt** — it retried, and retrying did not help; or
//! - it **was refused a retry** of a retryable failure by its **budget** or its
//!   **deadline** (stop reasons `budget_exhausted`, `deadline_too_close`) — the downstream
//!   is failing too often, or there is no time left; a layer further up must not try
//!   instead.
//!
//! It does not mark a success; a first-attempt failure that is deterministic (`never_retry`:
//! no layer retries it anyway, and a mark received from downstream is passed on as it
//! came); a first-attempt failure of a request that is not retry-safe (`not_idempotent`: a
//! layer upstream that holds an idempotency key may still retry safely); a request whose
//! body was over the replay limit; or a failure under a policy of one attempt
//! (`max_attempts = 1` is how a hop says "let my caller retry"). So in a chain, the layer
//! nearest the failure that is allowed to retry does, and every layer above passes its
//! verdict on. The mark travels only if each hop's handler forwards it: copy the header
//! when you turn a downstream response into your own, and call [`mark_exhausted`] when
//! [`Error::is_exhausted`] (a transport failure has no response to carry it).
//!
//! # Cost
//!
//! Per request: the request's head is cloned once per attempt (the replay needs the
//! original), a non-empty body is read into one buffer, and the future is boxed (the
//! core's retrier is an `async fn`). Nothing else allocates on the success path; no timer
//! is armed unless the policy has a per-try timeout; observability
//! ([`crate::observe`]) compiles to nothing unless its features are on.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::convert::Infallible;
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use stormguard::retry::RetryPolicy;
//! use stormguard_tower::retry::{RequestBody, RetryLayer};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! // A downstream that fails twice with 503, then succeeds.
//! let calls = Arc::new(AtomicU32::new(0));
//! let seen = calls.clone();
//! let downstream = service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
//!     let n = seen.fetch_add(1, Ordering::Relaxed) + 1;
//!     let status = if n < 3 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
//!     async move { Ok::<_, Infallible>(Response::builder().status(status).body(Full::new(Bytes::new())).unwrap()) }
//! });
//! let client = ServiceBuilder::new()
//!     .layer(RetryLayer::new(RetryPolicy::new(3)))
//!     .service(downstream);
//! let request = Request::get("http://orders/1").body(Full::new(Bytes::new())).unwrap();
//! let response = client.oneshot(request).await.unwrap();
//! assert_eq!(response.status(), StatusCode::OK);
//! assert_eq!(calls.load(Ordering::Relaxed), 3);
//! # }
//! ```

mod body;
mod error;
mod layer;
mod route;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use stormguard::classify::Outcome;
use stormguard::clock::Clock;
use stormguard::deadline::Deadline;
use stormguard::retry::{Attempt, Call, Failure, Report, StopReason};
use tower::ServiceExt;
use tower_service::Service;

pub use body::{RequestBody, ResponseBody};
pub use error::Error;
pub use layer::{
    DEFAULT_BODY_LIMIT, DEFAULT_GRPC_RESPONSE_LIMIT, ErrorClassifier, RetryLayer, RetryLayerBuilder,
};
pub use route::{DEFAULT_ROUTE, InvalidRoute, RouteError, RoutePattern, Routes};

use body::{BodySource, read_up_to};
use error::BodyNotReplayable;
use layer::Shared;

use crate::{observe, wire};

/// A boxed, thread-safe error: what inner services and bodies fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The service [`RetryLayer`] wraps around an inner HTTP or gRPC client service.
///
/// The inner service gets each attempt as an `http::Request<`[`RequestBody`]`<B>>`; the
/// caller gets an `http::Response<`[`ResponseBody`]`<ResB>>` or an [`Error`].
#[derive(Clone, Debug)]
pub struct Retry<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Retry<S> {
    /// Wraps `inner` with `layer`'s configuration.
    pub fn new(inner: S, layer: &RetryLayer) -> Self {
        tower_layer::Layer::layer(layer, inner)
    }

    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        Retry { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, by value.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// What a [`Retry`] call resolves to.
type CallResult<B> = Result<Response<ResponseBody<B>>, Error>;

/// The future of a [`Retry`] call.
pub struct ResponseFuture<B> {
    inner: Pin<Box<dyn Future<Output = CallResult<B>> + Send>>,
}

impl<B> Future for ResponseFuture<B> {
    type Output = CallResult<B>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B> std::fmt::Debug for ResponseFuture<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Retry<S>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqB: Body + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = Error;
    type Future = ResponseFuture<ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::NotReady(e.into()))
    }

    fn call(&mut self, request: Request<ReqB>) -> ResponseFuture<ResB> {
        // The first attempt goes to the service that was made ready; retries to clones.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            inner: Box::pin(run(self.shared.clone(), ready, request)),
        }
    }
}

/// One logical request: the body read for replay, then the core's retrier.
async fn run<S, ReqB, ResB>(
    shared: Arc<Shared>,
    mut service: S,
    request: Request<ReqB>,
) -> Result<Response<ResponseBody<ResB>>, Error>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqB: Body + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    // The template carries the first attempt's number, so copying it needs no regrowth.
    wire::set_attempt(&mut parts.headers, 1, wire::Protocol::Http);
    let route = shared.route(&parts.method, parts.uri.path());
    let protocol = wire::Protocol::of(&parts.headers);
    let grpc = protocol == wire::Protocol::Grpc;
    let key = wire::idempotency_key(&parts.headers).ok().flatten();
    let safe = wire::is_retry_safe(
        &parts.method,
        protocol,
        key.is_some(),
        route.retrier.policy().idempotent(),
    );

    let mut body = if body.is_end_stream() {
        BodySource::empty()
    } else {
        let read = read_up_to(body, shared.body_limit)
            .await
            .map_err(|e| Error::RequestBody(e.into()))?;
        BodySource::from_read(read)
    };
    let replayable = body.is_replayable();

    let mut call = Call::new().idempotent(safe);
    if let Some(key) = key {
        call = call.with_key(key);
    }
    if let Some(overall) = route.overall {
        call = call.with_deadline(Deadline::after(overall, Clock::tokio()));
    }

    let grpc_limit = shared.grpc_response_limit;
    let info = observe::CallInfo::new(&parts, grpc);
    let parts = &parts;
    let op = |attempt: Attempt| {
        let number = attempt.number;
        let sent = match body.for_attempt() {
            None => Sent::Consumed,
            Some(body) if number == 1 => {
                Sent::Called(service.call(attempt_request(parts, body, number, grpc)))
            }
            Some(body) => Sent::Fresh(service.clone(), body),
        };
        observe::instrument(async move {
            let response = match sent {
                Sent::Consumed => return Err(BoxError::from(BodyNotReplayable)),
                Sent::Called(future) => future.await.map_err(Into::into)?,
                Sent::Fresh(mut service, body) => {
                    if let Err(e) = service.ready().await {
                        return Err(e.into());
                    }
                    let request = attempt_request(parts, body, number, grpc);
                    service.call(request).await.map_err(Into::into)?
                }
            };
            if !grpc {
                return Ok(response.map(ResponseBody::stream));
            }
            // Boxed: only gRPC calls pay for the room this future needs.
            let (head, body) = response.into_parts();
            let read = Box::pin(read_up_to(body, grpc_limit))
                .await
                .map_err(Into::into)?;
            Ok(Response::from_parts(head, ResponseBody::from_read(read)))
        })
    };
    let classifier = |result: &Result<Response<ResponseBody<ResB>>, BoxError>| {
        let outcome = match result {
            Ok(response) if grpc => {
                let trailers = response.body().buffered_trailers();
                let status = wire::grpc_status(
                    response.status(),
                    response.headers(),
                    trailers,
                    response.body().is_complete(),
                );
                observe::record_response(response.status(), status.map(|(code, _)| code));
                wire::grpc_outcome(
                    status,
                    response.headers(),
                    trailers,
                    shared.grpc_codes,
                    true,
                )
            }
            Ok(response) => {
                observe::record_response(response.status(), None);
                match wire::classify_response_head(response.status(), response.headers()) {
                    // A response may follow a side effect: retry it only when that is safe.
                    Outcome::Retryable | Outcome::Overloaded { .. } if !safe => Outcome::InDoubt,
                    outcome => outcome,
                }
            }
            Err(error) => {
                observe::record_error(error.as_ref());
                (shared.error_classifier)(error.as_ref())
            }
        };
        if !replayable && outcome.is_failure() {
            Outcome::NeverRetry
        } else {
            outcome
        }
    };
    let report = observe::in_call(info, route.retrier.run_report(call, op, classifier)).await;
    finish(report)
}

/// How an attempt is sent: to the service made ready by the caller, or to a fresh clone
/// (with the body its request will carry).
enum Sent<S, F, B> {
    Called(F),
    Fresh(S, B),
    Consumed,
}

/// The request of attempt `number`: a copy of the template (the original request with
/// `x-stormguard-attempt: 1`) with the attempt headers of a retry.
fn attempt_request<B>(
    parts: &Parts,
    body: RequestBody<B>,
    number: u32,
    grpc: bool,
) -> Request<RequestBody<B>> {
    let mut request = Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.extensions_mut() = parts.extensions.clone();
    let headers = request.headers_mut();
    *headers = parts.headers.clone();
    if number > 1 {
        let protocol = if grpc {
            wire::Protocol::Grpc
        } else {
            wire::Protocol::Http
        };
        wire::set_attempt(headers, number, protocol);
    }
    request
}

/// Whether a call that stopped for `stop` after `attempts` attempts marks its failure
/// response `X-Retry-Exhausted: true` (see [When a response is marked](self#when-a-response-is-marked)).
pub(crate) fn marks_exhausted(stop: StopReason, attempts: u32) -> bool {
    match stop {
        StopReason::Succeeded | StopReason::Cancelled => false,
        // Refused by the budget, the deadline or an open breaker: retrying upstream cannot help.
        StopReason::BudgetExhausted
        | StopReason::DeadlineTooClose
        | StopReason::BreakerOpen
        | StopReason::Throttled => true,
        StopReason::NeverRetry | StopReason::NotIdempotent | StopReason::AttemptsExhausted => {
            attempts > 1
        }
    }
}

/// Turns the retrier's report into the caller's result, marking exhausted failures.
fn finish<B>(
    report: Report<Response<ResponseBody<B>>, BoxError>,
) -> Result<Response<ResponseBody<B>>, Error> {
    let Report {
        result,
        attempts,
        stop,
    } = report;
    observe::finished(stop);
    match result {
        Ok(mut response) => {
            if marks_exhausted(stop, attempts) {
                wire::mark_exhausted(response.headers_mut());
            }
            Ok(response)
        }
        Err(Failure::Error(source)) => Err(Error::Transport {
            attempts,
            stop,
            source,
        }),
        Err(Failure::TimedOut(after)) => Err(Error::TimedOut {
            attempts,
            stop,
            after,
        }),
        Err(Failure::Refused(source)) => Err(Error::Refused { attempts, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_rule() {
        use StopReason as S;
        assert!(!marks_exhausted(S::Succeeded, 3));
        assert!(!marks_exhausted(S::Cancelled, 3));
        assert!(marks_exhausted(S::AttemptsExhausted, 3));
        assert!(!marks_exhausted(S::AttemptsExhausted, 1));
        assert!(marks_exhausted(S::BudgetExhausted, 1));
        assert!(marks_exhausted(S::DeadlineTooClose, 1));
        assert!(!marks_exhausted(S::NeverRetry, 1));
        assert!(marks_exhausted(S::NeverRetry, 2));
        assert!(!marks_exhausted(S::NotIdempotent, 1));
    }
}
