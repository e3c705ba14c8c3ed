//! What a response or a transport error means, for retrying and for health.
//!
//! Two readers look at every answer and must not be confused with each other:
//!
//! - a **retrier** asks "may I send this again?": a response marked `X-Retry-Exhausted: true`
//!   (a hop below already retried, or was refused a retry) must not be retried, so the mark
//!   makes any failure [`Outcome::NeverRetry`] ([`classify_response_head`]);
//! - a **breaker, throttle or health window** asks "how is the downstream doing?": the mark
//!   says nothing about that — a 503 marked exhausted is still a 503 — so it is ignored
//!   ([`health_outcome`]). Reading the mark there is how a breaker above a retrier would never
//!   open.
//!
//! A local refusal (a breaker, throttle or deadline check of this project between the caller
//! and the network) is neither: it was never sent. [`refusal_of`] finds one in an error's
//! cause chain, and a response carrying [`REJECTED_BY`](super::REJECTED_BY) is one too; both
//! stop a retrier at once and are recorded by nobody.

use std::error::Error as StdError;
use std::io;
use std::time::SystemTime;

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, StatusCode};
use stormguard::admission::{DeadlineTooClose, Refusal};
use stormguard::breaker::BreakerOpen;
use stormguard::classify::{
    Classifier, Classify, GrpcCode, GrpcCodeSet, Outcome, classify_grpc, classify_http_response,
    classify_io_error, parse_retry_after,
};
use stormguard::fault::Abort;
use stormguard::throttle::Throttled;

use super::{GRPC_PUSHBACK, GRPC_STATUS, is_exhausted};

/// How a retrier reads an HTTP response: the core's [`classify_http_response`] over the
/// status, the `Retry-After` header (read only for 409, 429 and 503, the statuses it changes; a
/// malformed one counts as absent) and the exhausted mark (`X-Retry-Exhausted: true` or a
/// Finagle non-retryable nack, see [`is_exhausted`](super::is_exhausted)).
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use stormguard::classify::Outcome;
/// use stormguard_tower::wire::classify_response_head;
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(classify_response_head(StatusCode::SERVICE_UNAVAILABLE, &headers), Outcome::Retryable);
/// headers.insert("x-retry-exhausted", "true".parse().unwrap());
/// assert_eq!(classify_response_head(StatusCode::SERVICE_UNAVAILABLE, &headers), Outcome::NeverRetry);
/// ```
pub fn classify_response_head(status: StatusCode, headers: &HeaderMap) -> Outcome {
    let status = status.as_u16();
    if status < 400 {
        return Outcome::Success;
    }
    classify_http_response(status, retry_after(status, headers), is_exhausted(headers))
}

/// How a breaker, throttle or health window reads an HTTP response: the same as
/// [`classify_response_head`] but blind to the exhausted mark, which is about retrying, not
/// about the downstream's health.
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use stormguard::classify::Outcome;
/// use stormguard_tower::wire::health_outcome;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-retry-exhausted", "true".parse().unwrap());
/// assert_eq!(health_outcome(StatusCode::SERVICE_UNAVAILABLE, &headers), Outcome::Retryable);
/// ```
pub fn health_outcome(status: StatusCode, headers: &HeaderMap) -> Outcome {
    let status = status.as_u16();
    if status < 400 {
        return Outcome::Success;
    }
    classify_http_response(status, retry_after(status, headers), false)
}

fn retry_after(status: u16, headers: &HeaderMap) -> Option<std::time::Duration> {
    match status {
        409 | 429 | 503 => headers
            .get(RETRY_AFTER)
            .and_then(|v| parse_retry_after(v.as_bytes(), SystemTime::now()).ok()),
        _ => None,
    }
}

/// The health view of a call's result, for breakers, throttles and health windows: a
/// response by [`health_outcome`] (blind to the exhausted mark), an error by
/// [`classify_transport_error`] (a transport error is a failure; whether it is in doubt does
/// not matter to health).
///
/// ```
/// use stormguard::classify::{Classifier, Outcome};
/// use stormguard_tower::wire::HealthClassifier;
///
/// let response = http::Response::builder().status(503).body(()).unwrap();
/// assert_eq!(HealthClassifier.classify(&Ok::<_, std::io::Error>(response)), Outcome::Retryable);
/// let busy = http::Response::builder().status(503).header("retry-after", "2").body(()).unwrap();
/// assert!(matches!(HealthClassifier.classify(&Ok::<_, std::io::Error>(busy)), Outcome::Overloaded { .. }));
/// let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
/// assert_eq!(HealthClassifier.classify(&Err::<http::Response<()>, _>(reset)), Outcome::InDoubt);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HealthClassifier;

impl<B, E: 'static> Classifier<http::Response<B>, E> for HealthClassifier {
    fn classify(&self, result: &Result<http::Response<B>, E>) -> Outcome {
        match result {
            Ok(response) => health_outcome(response.status(), response.headers()),
            Err(error) => as_error(error).map_or(Outcome::InDoubt, classify_transport_error),
        }
    }

    fn refusal(&self, result: &Result<http::Response<B>, E>) -> Option<Refusal> {
        match result {
            Ok(response) if super::is_rejection(response.headers()) => {
                Some(rejection_refusal(response.headers()))
            }
            Ok(_) => None,
            Err(error) => as_error(error).and_then(refusal_of),
        }
    }
}

/// An inner service's error as a cause chain, when its type is one whose chain can be walked:
/// a [`BoxError`] (what tower middleware returns), an [`io::Error`] or a [`hyper::Error`].
/// Other error types are judged without looking inside (a transport failure in doubt).
pub fn as_error<E: 'static>(error: &E) -> Option<&(dyn StdError + 'static)> {
    let any: &dyn std::any::Any = error;
    if let Some(boxed) = any.downcast_ref::<BoxError>() {
        return Some(boxed.as_ref());
    }
    if let Some(io) = any.downcast_ref::<io::Error>() {
        return Some(io);
    }
    if let Some(hyper) = any.downcast_ref::<hyper::Error>() {
        return Some(hyper);
    }
    None
}

/// A boxed, thread-safe error: what inner services and bodies fail with.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// The refusal a rejection response (one carrying [`REJECTED_BY`](super::REJECTED_BY))
/// stands for, as far as its headers tell.
pub fn rejection_refusal(headers: &HeaderMap) -> Refusal {
    let by = headers.get(super::REJECTED_BY).map(HeaderValue::as_bytes);
    match by {
        Some(b"throttled") => Refusal::Throttled(Throttled { probability: 1.0 }),
        Some(b"deadline-too-close") => Refusal::DeadlineTooClose(DeadlineTooClose {
            remaining: std::time::Duration::ZERO,
            min_call: std::time::Duration::ZERO,
        }),
        _ => Refusal::BreakerOpen(BreakerOpen {
            retry_after: retry_after(503, headers).unwrap_or_default(),
            reason: stormguard::breaker::Rejection::Open,
        }),
    }
}

/// Marks `headers` as a local refusal's answer, the inverse of [`rejection_refusal`]:
/// [`REJECTED_BY`](super::REJECTED_BY) names who refused (`circuit-open`, `throttled`,
/// `deadline-too-close`), and `Retry-After` (whole seconds, rounded up) says when an open
/// breaker may admit calls again.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use stormguard::admission::Refusal;
/// use stormguard::throttle::Throttled;
/// use stormguard_tower::wire::{mark_rejection, rejection_refusal};
///
/// let mut headers = HeaderMap::new();
/// mark_rejection(&mut headers, &Refusal::Throttled(Throttled { probability: 0.5 }));
/// assert_eq!(headers["x-stormguard-rejected"], "throttled");
/// assert!(matches!(rejection_refusal(&headers), Refusal::Throttled(_)));
/// ```
pub fn mark_rejection(headers: &mut HeaderMap, refusal: &Refusal) {
    let by = match refusal {
        Refusal::Throttled(_) => "throttled",
        Refusal::DeadlineTooClose(_) => "deadline-too-close",
        _ => "circuit-open",
    };
    headers.insert(super::REJECTED_BY, HeaderValue::from_static(by));
    if let Some(after) = refusal.retry_after() {
        let secs = after.as_millis().div_ceil(1000);
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from(u64::try_from(secs).unwrap_or(u64::MAX)),
        );
    }
}

/// The gRPC status of a response: from the headers (a trailers-only response), else from
/// the trailers, else from the HTTP status by gRPC's HTTP-to-gRPC mapping. `complete` says
/// whether the whole body was read: a complete 200 response without any status is
/// malformed (`UNKNOWN`); an incomplete one was committed before its trailers were seen
/// (`None`: treat as success).
pub fn grpc_status<'a>(
    status: StatusCode,
    headers: &'a HeaderMap,
    trailers: Option<&'a HeaderMap>,
    complete: bool,
) -> Option<(GrpcCode, Option<&'a HeaderValue>)> {
    let source = if headers.contains_key(GRPC_STATUS) {
        Some(headers)
    } else {
        trailers.filter(|t| t.contains_key(GRPC_STATUS))
    };
    if let Some(source) = source {
        let code = source
            .get(GRPC_STATUS)
            .and_then(|v| GrpcCode::parse_header(v.as_bytes()).ok())
            .unwrap_or(GrpcCode::Unknown);
        return Some((code, source.get(GRPC_PUSHBACK)));
    }
    if status != StatusCode::OK {
        return Some((grpc_code_for_http(status), None));
    }
    complete.then_some((GrpcCode::Unknown, None))
}

/// Classifies a gRPC response by gRPC A6: the status code against `retryable`, the server's
/// pushback, and (for a retrier, `honour_mark`) the exhausted mark in headers or trailers.
pub fn grpc_outcome(
    status: Option<(GrpcCode, Option<&HeaderValue>)>,
    headers: &HeaderMap,
    trailers: Option<&HeaderMap>,
    retryable: GrpcCodeSet,
    honour_mark: bool,
) -> Outcome {
    let Some((code, pushback)) = status else {
        return Outcome::Success;
    };
    let outcome = classify_grpc(code, retryable, pushback.map(HeaderValue::as_bytes));
    let marked = honour_mark && (is_exhausted(headers) || trailers.is_some_and(is_exhausted));
    if marked && outcome.is_failure() {
        Outcome::NeverRetry
    } else {
        outcome
    }
}

/// gRPC's mapping of an HTTP status to a status code, for responses without `grpc-status`
/// (gRPC's `http-grpc-status-mapping.md`).
pub fn grpc_code_for_http(status: StatusCode) -> GrpcCode {
    match status.as_u16() {
        400 => GrpcCode::Internal,
        401 => GrpcCode::Unauthenticated,
        403 => GrpcCode::PermissionDenied,
        404 => GrpcCode::Unimplemented,
        429 | 502 | 503 | 504 => GrpcCode::Unavailable,
        _ => GrpcCode::Unknown,
    }
}

/// The local refusal an error carries somewhere in its cause chain, if any: a
/// [`Refusal`], or one of the refusals it wraps ([`BreakerOpen`], [`Throttled`],
/// [`DeadlineTooClose`]), as this crate's layers return them.
///
/// ```
/// use std::time::Duration;
/// use stormguard::admission::{DeadlineTooClose, Refusal};
/// use stormguard_tower::wire::refusal_of;
///
/// let boxed: Box<dyn std::error::Error + Send + Sync> =
///     Box::new(DeadlineTooClose { remaining: Duration::ZERO, min_call: Duration::ZERO });
/// assert!(matches!(refusal_of(boxed.as_ref()), Some(Refusal::DeadlineTooClose(_))));
/// assert!(refusal_of(&std::io::Error::other("reset")).is_none());
/// ```
pub fn refusal_of(error: &(dyn StdError + 'static)) -> Option<Refusal> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(refusal) = e.downcast_ref::<Refusal>() {
            return Some(*refusal);
        }
        if let Some(open) = e.downcast_ref::<BreakerOpen>() {
            return Some(Refusal::BreakerOpen(*open));
        }
        if let Some(throttled) = e.downcast_ref::<Throttled>() {
            return Some(Refusal::Throttled(*throttled));
        }
        if let Some(close) = e.downcast_ref::<DeadlineTooClose>() {
            return Some(Refusal::DeadlineTooClose(*close));
        }
        next = e.source();
    }
    None
}

/// A connection that could not be opened: nothing was sent, so any request may go again,
/// whatever the cause (refused, unreachable, a name that does not resolve, a connect that
/// timed out). A transport that dials its own connections wraps its connect step's error in
/// it, because the cause alone does not say when it happened: a timed-out or reset
/// [`io::Error`] may also come after the request left, and is then in doubt.
///
/// ```
/// use std::io;
/// use stormguard::classify::Outcome;
/// use stormguard_tower::wire::{ConnectError, classify_transport_error};
///
/// let timed_out = io::Error::new(io::ErrorKind::TimedOut, "no answer within 5s");
/// assert_eq!(classify_transport_error(&timed_out), Outcome::InDoubt);
/// let connect = ConnectError::new("users:8080", timed_out);
/// assert_eq!(classify_transport_error(&connect), Outcome::Retryable);
/// ```
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {target}: {source}")]
pub struct ConnectError {
    target: String,
    source: io::Error,
}

impl ConnectError {
    /// The connect step's error, for the `target` it dialled (`host:port`).
    pub fn new(target: impl Into<String>, source: io::Error) -> ConnectError {
        ConnectError {
            target: target.into(),
            source,
        }
    }

    /// What was dialled.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The socket's (or the connect timer's) error.
    pub fn io_error(&self) -> &io::Error {
        &self.source
    }
}

/// Classifies a transport error of an inner service by its type, walking the cause chain.
///
/// - An injected fault ([`Abort`], from `stormguard::fault`) classifies itself.
/// - A [`ConnectError`] was never sent: retryable, whatever its cause.
/// - An [`io::Error`] goes to the core's [`classify_io_error`], assuming the request may have
///   been written: a refused or unreachable connection is retryable (nothing was sent), a
///   reset, abort, broken pipe or timeout is in doubt, other kinds are never retried. This is
///   how the errors of hyper-util's legacy client arrive: a connect failure carries the
///   `ConnectionRefused` of its connector, a reset after sending hyper's `ConnectionReset`.
/// - A [`hyper::Error`] that says the request was cancelled before it was sent is retryable;
///   one that says the connection closed before a complete response (incomplete message,
///   closed, aborted body write, timeout) is in doubt; a parse or user error is never
///   retried.
/// - A timeout of an inner tokio timer is in doubt.
/// - With the `reqwest` feature, a reqwest error (bare, or inside a `reqwest_middleware`
///   error) says what it knows first: a connect error (refused, DNS, TLS handshake, connect
///   timeout) was never sent and is retryable; a builder, redirect, decode or status error is
///   never retried; any other is read by its causes as above (a reqwest timeout is in doubt).
///   An error of another middleware of the chain is never retried: retrying what is not
///   understood is how storms start.
/// - An error none of these recognise is in doubt: it may have happened after the request
///   was sent, so only an idempotent or keyed request is retried.
///
/// A local refusal is not a transport error: find it with [`refusal_of`] first.
pub fn classify_transport_error(error: &(dyn StdError + 'static)) -> Outcome {
    let mut next = Some(error);
    while let Some(e) = next {
        #[cfg(feature = "reqwest")]
        if let Some(outcome) = reqwest_outcome(e) {
            return outcome;
        }
        if let Some(abort) = e.downcast_ref::<Abort>() {
            return abort.classify();
        }
        if e.is::<ConnectError>() {
            return Outcome::Retryable;
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            // An `io::Error` hides the error it wraps from `source()`.
            return match io.get_ref().and_then(|inner| inner.downcast_ref::<Abort>()) {
                Some(abort) => abort.classify(),
                None => classify_io_error(io.kind(), true),
            };
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_canceled() {
                return Outcome::Retryable;
            }
            if h.is_parse() || h.is_user() {
                return Outcome::NeverRetry;
            }
            if h.is_incomplete_message() || h.is_body_write_aborted() || h.is_timeout() {
                return Outcome::InDoubt;
            }
        }
        if e.is::<tokio::time::error::Elapsed>() {
            return Outcome::InDoubt;
        }
        next = e.source();
    }
    Outcome::InDoubt
}

/// What a reqwest error alone says about retrying, if anything.
#[cfg(feature = "reqwest")]
fn reqwest_outcome(error: &(dyn StdError + 'static)) -> Option<Outcome> {
    let error = match error.downcast_ref::<reqwest_middleware::Error>() {
        Some(reqwest_middleware::Error::Reqwest(error)) => error,
        Some(reqwest_middleware::Error::Middleware(_)) => return Some(Outcome::NeverRetry),
        None => error.downcast_ref::<reqwest::Error>()?,
    };
    if error.is_builder() || error.is_redirect() || error.is_decode() || error.is_status() {
        Some(Outcome::NeverRetry)
    } else if error.is_connect() {
        Some(Outcome::Retryable)
    } else {
        // Its causes (an I/O error, hyper's) say the rest; a `source()` walk from a
        // `reqwest_middleware::Error` skips the reqwest error itself.
        let mut cause = error.source();
        while let Some(e) = cause {
            if e.is::<io::Error>() || e.is::<hyper::Error>() {
                return Some(classify_transport_error(e));
            }
            cause = e.source();
        }
        Some(Outcome::InDoubt)
    }
}

/// A short label for a transport error, for logs, spans and metrics (`error.type`).
pub fn error_type(error: &(dyn StdError + 'static)) -> &'static str {
    if let Some(refusal) = refusal_of(error) {
        return refusal.label();
    }
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<Abort>() {
            return "injected_fault";
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return match io.kind() {
                io::ErrorKind::ConnectionRefused => "connection_refused",
                io::ErrorKind::ConnectionReset => "connection_reset",
                io::ErrorKind::ConnectionAborted => "connection_aborted",
                io::ErrorKind::BrokenPipe => "broken_pipe",
                io::ErrorKind::TimedOut => "io_timeout",
                _ => "io",
            };
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_canceled() {
                return "canceled";
            }
            if h.is_incomplete_message() {
                return "incomplete_message";
            }
        }
        if e.is::<tokio::time::error::Elapsed>() {
            return "timeout";
        }
        next = e.source();
    }
    "transport"
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_static(k),
                    HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn the_mark_stops_retries_but_not_health() {
        let marked = headers(&[("x-retry-exhausted", "true")]);
        let s503 = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(classify_response_head(s503, &marked), Outcome::NeverRetry);
        assert_eq!(health_outcome(s503, &marked), Outcome::Retryable);
        assert_eq!(
            classify_response_head(StatusCode::OK, &marked),
            Outcome::Success
        );
        let nack = headers(&[("finagle-http-nonretryable-nack", "")]);
        assert_eq!(classify_response_head(s503, &nack), Outcome::NeverRetry);
        let other = headers(&[("x-retry-exhausted", "false")]);
        assert_eq!(classify_response_head(s503, &other), Outcome::Retryable);
    }

    #[test]
    fn retry_after_is_read_for_429_and_503_only() {
        let h = headers(&[("retry-after", "2")]);
        let two = Some(Duration::from_secs(2));
        assert_eq!(
            classify_response_head(StatusCode::SERVICE_UNAVAILABLE, &h),
            Outcome::Overloaded { retry_after: two }
        );
        assert_eq!(
            classify_response_head(StatusCode::TOO_MANY_REQUESTS, &h),
            Outcome::Overloaded { retry_after: two }
        );
        assert_eq!(
            classify_response_head(StatusCode::BAD_GATEWAY, &h),
            Outcome::Retryable
        );
        let bad = headers(&[("retry-after", "soon")]);
        assert_eq!(
            classify_response_head(StatusCode::SERVICE_UNAVAILABLE, &bad),
            Outcome::Retryable
        );
    }

    #[test]
    fn grpc_status_comes_from_headers_then_trailers_then_http() {
        let trailers_only = headers(&[("grpc-status", "14")]);
        let none = HeaderMap::new();
        let s = grpc_status(StatusCode::OK, &trailers_only, None, true);
        assert_eq!(s.map(|(c, _)| c), Some(GrpcCode::Unavailable));
        let trailers = headers(&[("grpc-status", "3")]);
        let s = grpc_status(StatusCode::OK, &none, Some(&trailers), true);
        assert_eq!(s.map(|(c, _)| c), Some(GrpcCode::InvalidArgument));
        let s = grpc_status(StatusCode::SERVICE_UNAVAILABLE, &none, None, true);
        assert_eq!(s.map(|(c, _)| c), Some(GrpcCode::Unavailable));
        let s = grpc_status(StatusCode::OK, &none, None, true);
        assert_eq!(s.map(|(c, _)| c), Some(GrpcCode::Unknown));
        assert!(grpc_status(StatusCode::OK, &none, None, false).is_none());
        let garbage = headers(&[("grpc-status", "fourteen")]);
        let s = grpc_status(StatusCode::OK, &garbage, None, true);
        assert_eq!(s.map(|(c, _)| c), Some(GrpcCode::Unknown));
    }

    #[test]
    fn grpc_pushback_and_mark() {
        let set = GrpcCodeSet::A6_DEFAULT;
        let h = headers(&[("grpc-status", "14"), ("grpc-retry-pushback-ms", "250")]);
        let status = grpc_status(StatusCode::OK, &h, None, true);
        assert_eq!(
            grpc_outcome(status, &h, None, set, true),
            Outcome::Overloaded {
                retry_after: Some(Duration::from_millis(250))
            }
        );
        let h = headers(&[("grpc-status", "14"), ("grpc-retry-pushback-ms", "-1")]);
        let status = grpc_status(StatusCode::OK, &h, None, true);
        assert_eq!(
            grpc_outcome(status, &h, None, set, true),
            Outcome::NeverRetry
        );
        let none = HeaderMap::new();
        let t = headers(&[("grpc-status", "14"), ("x-retry-exhausted", "true")]);
        let status = grpc_status(StatusCode::OK, &none, Some(&t), true);
        assert_eq!(
            grpc_outcome(status, &none, Some(&t), set, true),
            Outcome::NeverRetry
        );
        assert_eq!(
            grpc_outcome(status, &none, Some(&t), set, false),
            Outcome::Retryable
        );
    }

    #[test]
    fn errors_in_the_chain_decide() {
        #[derive(Debug)]
        struct Wrapper(Box<dyn StdError + Send + Sync>);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("client error")
            }
        }
        impl StdError for Wrapper {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(self.0.as_ref())
            }
        }
        let refused = Wrapper(Box::new(io::Error::from(io::ErrorKind::ConnectionRefused)));
        assert_eq!(classify_transport_error(&refused), Outcome::Retryable);
        assert_eq!(error_type(&refused), "connection_refused");
        let reset = Wrapper(Box::new(io::Error::from(io::ErrorKind::ConnectionReset)));
        assert_eq!(classify_transport_error(&reset), Outcome::InDoubt);
        let denied = Wrapper(Box::new(io::Error::from(io::ErrorKind::PermissionDenied)));
        assert_eq!(classify_transport_error(&denied), Outcome::NeverRetry);
        let unknown = std::fmt::Error;
        assert_eq!(classify_transport_error(&unknown), Outcome::InDoubt);
        assert_eq!(error_type(&unknown), "transport");
        let open = Wrapper(Box::new(BreakerOpen {
            retry_after: Duration::from_secs(1),
            reason: stormguard::breaker::Rejection::Open,
        }));
        assert!(matches!(refusal_of(&open), Some(Refusal::BreakerOpen(_))));
        assert_eq!(error_type(&open), "circuit_open");
    }

    proptest! {
        #[test]
        fn grpc_classification_matches_the_code_table(
            status in 100u16..1000,
            code in 0u8..=20,
            pushback in proptest::option::of(-5i64..5000),
        ) {
            let mut h = HeaderMap::new();
            h.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
            if let Some(p) = pushback {
                h.insert(GRPC_PUSHBACK, HeaderValue::from(p));
            }
            let http_status = StatusCode::from_u16(status).expect("in range");
            let s = grpc_status(http_status, &h, None, true);
            let outcome = grpc_outcome(s, &h, None, GrpcCodeSet::A6_DEFAULT, true);
            let expected_code = GrpcCode::from_i32(i32::from(code)).unwrap_or(GrpcCode::Unknown);
            let pushback_bytes = pushback.map(|p| p.to_string());
            let expected = classify_grpc(expected_code, GrpcCodeSet::A6_DEFAULT, pushback_bytes.as_deref().map(str::as_bytes));
            prop_assert_eq!(outcome, expected);
        }
    }
}
