//! The middleware service and the request flow, as one plain `async fn`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::BoxError;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline};
use tower_service::Service;

use super::finish::Finisher;
use super::{Config, DoNotStore, FailureMode, IdempotencyLayer, InFlight, LeaseDeadline, Oversize};
use crate::problem;
use crate::store::{
    Begin, BeginRequest, Completion, LeaseToken, Millis, ScopedKey, Store, StoredResponse,
};
use stormguard_tower::body::ReplayBody;
use stormguard_tower::wire::{IDEMPOTENT_REPLAYED, idempotency_key};

/// The future of [`IdempotencyService`].
pub type ResponseFuture<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

/// The service [`IdempotencyLayer`] wraps around an inner service.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    shared: Arc<Shared>,
}

pub(super) struct Shared {
    pub(super) store: Arc<dyn Store>,
    pub(super) config: Config,
    pub(super) finisher: Finisher,
}

impl<S> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService").finish_non_exhaustive()
    }
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, layer: IdempotencyLayer) -> Self {
        IdempotencyService {
            inner,
            shared: Arc::new(Shared {
                store: layer.store,
                config: layer.config,
                finisher: Finisher::new(),
            }),
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone is not ready; the ready one goes into the future (tower's usual dance).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(run(Arc::clone(&self.shared), inner, req))
    }
}

async fn call_inner<S, ResBody>(
    inner: &mut S,
    req: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    Ok(inner.call(req).await?.map(Body::new))
}

async fn run<S, ReqBody, ResBody>(
    shared: Arc<Shared>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let cfg = &shared.config;
    if !cfg.methods.contains(req.method()) {
        return call_inner(&mut inner, req.map(Body::new)).await;
    }
    let key = match idempotency_key(req.headers()) {
        Ok(Some(key)) => key,
        Ok(None) if !cfg.key_required => {
            return call_inner(&mut inner, req.map(Body::new)).await;
        }
        Ok(None) => {
            return Ok(problem::response(
                StatusCode::BAD_REQUEST,
                problem::MISSING_KEY,
                "Idempotency-Key missing",
                "this endpoint requires an Idempotency-Key header, for example \
                 Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
            ));
        }
        Err(e) => {
            return Ok(problem::response(
                StatusCode::BAD_REQUEST,
                problem::MALFORMED_KEY,
                "Idempotency-Key malformed",
                &e.to_string(),
            ));
        }
    };
    let (parts, body) = req.into_parts();
    let tenant = match &cfg.tenant {
        None => String::new(),
        Some(extract) => match extract(&parts) {
            Some(t) => t,
            None => {
                return Ok(problem::response(
                    StatusCode::UNAUTHORIZED,
                    problem::NO_TENANT,
                    "No principal for the Idempotency-Key",
                    "idempotency keys are scoped by principal, and this request has none",
                ));
            }
        },
    };
    let deadline = request_deadline(&shared, &parts.headers);
    if deadline
        .as_ref()
        .is_some_and(|d| d.enforce && d.deadline.is_expired())
    {
        return Ok(deadline_exceeded(
            "the request's deadline had passed when it arrived",
        ));
    }
    let body = match Limited::new(body, cfg.max_request).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Ok(problem::response(
                StatusCode::PAYLOAD_TOO_LARGE,
                problem::REQUEST_TOO_LARGE,
                "Request too large for an idempotent request",
                &format!(
                    "requests with an Idempotency-Key may have at most {} bytes of body",
                    cfg.max_request
                ),
            ));
        }
        Err(e) => {
            return Ok(problem::response(
                StatusCode::BAD_REQUEST,
                problem::BAD_BODY,
                "Request body unreadable",
                &e.to_string(),
            ));
        }
    };
    let fingerprint = cfg.fingerprinter.fingerprint(&parts, &body);
    let scoped = ScopedKey::new(&tenant, key);
    let token = LeaseToken::random();

    // Begin, waiting for an in-flight holder if so configured.
    let wait_until = match cfg.in_flight {
        InFlight::Reject => None,
        InFlight::Wait { max, poll } => Some((tokio::time::Instant::now() + max, poll)),
    };
    let mut poll = wait_until.map(|(_, p)| p).unwrap_or_default();
    loop {
        let now = cfg.clock.now_millis();
        let lease = match &deadline {
            Some(d) => cfg
                .lease
                .min(d.deadline.remaining().saturating_add(cfg.lease_margin)),
            None => cfg.lease,
        };
        let req = BeginRequest {
            key: &scoped,
            fingerprint: &fingerprint,
            token,
            now,
            lease_until: now.saturating_add(millis(lease)),
            expires_at: now.saturating_add(millis(cfg.retention.max(cfg.lease))),
        };
        match shared.finisher.timed(cfg, shared.store.begin(req)).await {
            Ok(Begin::Acquired { took_over }) => {
                if took_over {
                    tracing::info!(
                        key = scoped.key().as_str(),
                        "idempotency lease expired; taking the key over"
                    );
                }
                break;
            }
            Ok(Begin::Completed(completion)) => return Ok(replay(completion)),
            Ok(Begin::Mismatch) => {
                return Ok(problem::response(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    problem::KEY_REUSED,
                    "Idempotency-Key reused",
                    "this Idempotency-Key was already used for a different request \
                     (method, path or body differ); use a new key for a new request",
                ));
            }
            Ok(Begin::InFlight { .. }) => {
                if let Some((deadline, _)) = wait_until {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if !left.is_zero() {
                        tokio::time::sleep(poll.min(left)).await;
                        poll = (poll * 2).min(wait_until.map(|(_, p)| p * 16).unwrap_or(poll));
                        continue;
                    }
                }
                let mut res = problem::response(
                    StatusCode::CONFLICT,
                    problem::IN_FLIGHT,
                    "Request in progress",
                    "a request with this Idempotency-Key is still being processed; \
                     retry later to receive its result",
                );
                res.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return Ok(res);
            }
            Err(e) => {
                return match cfg.failure {
                    FailureMode::Closed => {
                        tracing::error!(error = %e, "idempotency store failed; refusing the request (fail closed)");
                        Ok(problem::response(
                            StatusCode::SERVICE_UNAVAILABLE,
                            problem::STORE_UNAVAILABLE,
                            "Idempotency store unavailable",
                            "the request was not processed because its Idempotency-Key could \
                             not be checked; it is safe to retry with the same key",
                        ))
                    }
                    FailureMode::Open => {
                        tracing::warn!(
                            error = %e,
                            key = scoped.key().as_str(),
                            "idempotency store failed; running the handler WITHOUT idempotency protection (fail open)"
                        );
                        call_inner(&mut inner, Request::from_parts(parts, Body::from(body))).await
                    }
                };
            }
        }
    }

    // We hold the lease: run the handler to its end and store what it answers, in a task of
    // its own, so that a client that goes away (its per-try timeout, a dropped connection)
    // does not cancel a handler that may already have taken effect: its retry then gets the
    // stored answer instead of running it a second time.
    let handler = inner.call(Request::from_parts(parts, Body::from(body)));
    let task = tokio::spawn(finish_call(shared, handler, scoped, token, deadline));
    match task.await {
        Ok(answer) => answer,
        Err(join) => {
            tracing::error!(error = %join, "the handler's task panicked or was aborted");
            Ok(problem::response(
                StatusCode::INTERNAL_SERVER_ERROR,
                problem::BAD_RESPONSE,
                "Handler failed",
                "the request's handler did not finish; it may or may not have taken effect",
            ))
        }
    }
}

/// Runs the handler of a key this request holds (cut at a deadline only this layer knows of,
/// so it never outlives its lease), then stores or releases the key by what it answered.
async fn finish_call<F, ResBody, E>(
    shared: Arc<Shared>,
    handler: F,
    scoped: ScopedKey,
    token: LeaseToken,
    deadline: Option<RequestDeadline>,
) -> Result<Response<Body>, E>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let cfg = &shared.config;
    let called = match deadline.filter(|d| d.enforce) {
        None => Ok(handler.await),
        Some(d) => {
            let left = d.deadline.remaining();
            tokio::time::timeout(left, deadline::scope(d.deadline, handler)).await
        }
    };
    let res = match called {
        Ok(Ok(res)) => res,
        Ok(Err(e)) => {
            shared.release(&scoped, token, "the handler failed").await;
            return Err(e);
        }
        Err(_elapsed) => {
            tracing::info!(
                key = scoped.key().as_str(),
                "the request's deadline passed in the handler; its lease ends soon after"
            );
            return Ok(deadline_exceeded(
                "the request's deadline passed while it was processed; it may or may not have \
                 taken effect, and a retry with the same key after the deadline takes it over",
            ));
        }
    };
    let (res_parts, res_body) = res.into_parts();
    let storable =
        cfg.policy.stores(res_parts.status) && res_parts.extensions.get::<DoNotStore>().is_none();
    if !storable {
        shared
            .release(&scoped, token, "the outcome is not stored")
            .await;
        return Ok(Response::from_parts(res_parts, Body::new(res_body)));
    }
    // Read the response ahead up to the cap, recording it; the client gets it after the
    // completion is stored (or, over the cap, the recorded part and then the rest as it comes).
    let mut res_body = ReplayBody::new(res_body, cfg.max_response);
    match res_body.fill().await {
        Ok(true) => {
            let bytes = res_body.recorded_bytes().unwrap_or_default();
            let completion = Completion::Response(StoredResponse {
                status: res_parts.status,
                headers: cfg.replay_headers.select(&res_parts.headers),
                body: bytes,
            });
            shared.complete(&scoped, token, &completion).await;
            Ok(Response::from_parts(res_parts, Body::new(res_body)))
        }
        Ok(false) => {
            match cfg.oversize {
                Oversize::Mark => {
                    let completion = Completion::TooLarge {
                        status: res_parts.status,
                    };
                    shared.complete(&scoped, token, &completion).await;
                }
                Oversize::Release => {
                    shared
                        .release(&scoped, token, "the response is over the size cap")
                        .await;
                }
            }
            Ok(Response::from_parts(res_parts, Body::new(res_body)))
        }
        Err(e) => {
            // The handler ran and answered; only its body failed. Running it again on a retry
            // could repeat its effects, so the key is completed without a response.
            let completion = Completion::BodyFailed {
                status: res_parts.status,
            };
            shared.complete(&scoped, token, &completion).await;
            Ok(problem::response(
                StatusCode::BAD_GATEWAY,
                problem::BAD_RESPONSE,
                "Response failed",
                &format!(
                    "the request was processed, but the handler's response body failed: {e}; \
                     it will not be processed again with this Idempotency-Key"
                ),
            ))
        }
    }
}

/// The deadline that bounds a request's lease, and whether this layer must enforce it.
struct RequestDeadline {
    deadline: Deadline,
    /// Read from the headers: nothing outside this layer stops the handler at it.
    enforce: bool,
}

fn request_deadline(shared: &Shared, headers: &HeaderMap) -> Option<RequestDeadline> {
    let current = || {
        deadline::current().map(|deadline| RequestDeadline {
            deadline,
            enforce: false,
        })
    };
    match shared.config.lease_deadline {
        LeaseDeadline::Ignore => None,
        LeaseDeadline::Current => current(),
        LeaseDeadline::CurrentOrHeaders(list) => current().or_else(|| {
            let found = stormguard_tower::wire::read_deadline(
                headers,
                list,
                stormguard::deadline::Selection::Earliest,
                &shared.config.clock,
            )
            .found?;
            Some(RequestDeadline {
                deadline: Deadline::after(found.remaining, Clock::tokio()),
                enforce: true,
            })
        }),
    }
}

fn deadline_exceeded(detail: &str) -> Response<Body> {
    problem::response(
        StatusCode::GATEWAY_TIMEOUT,
        problem::DEADLINE_EXCEEDED,
        "Deadline exceeded",
        detail,
    )
}

pub(super) fn millis(d: Duration) -> Millis {
    Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}

fn replay(completion: Completion) -> Response<Body> {
    let mut res = match completion {
        Completion::Response(stored) => {
            let mut res = Response::new(Body::from(stored.body));
            *res.status_mut() = stored.status;
            for (name, value) in stored.headers {
                res.headers_mut().append(name, value);
            }
            res
        }
        Completion::TooLarge { status } => not_stored(status, "was too large to keep for replay"),
        Completion::BodyFailed { status } => {
            not_stored(status, "body failed before it could be kept for replay")
        }
    };
    res.headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    res
}

fn not_stored(status: StatusCode, why: &str) -> Response<Body> {
    problem::response(
        StatusCode::CONFLICT,
        problem::RESPONSE_NOT_STORED,
        "Response not stored",
        &format!(
            "the request with this Idempotency-Key was processed and answered {}, but its \
             response {why}; it was not processed again",
            status.as_u16()
        ),
    )
}
