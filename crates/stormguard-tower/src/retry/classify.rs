//! What one attempt's HTTP or gRPC response, or transport error, means for retrying.
//!
//! Everything here reads status codes, header bytes and error types and hands the decision to
//! the core's classifiers ([`classify_http_response`], [`classify_grpc`],
//! [`classify_io_error`]); this module only finds the inputs on the wire. Malformed headers
//! never make a failure more retryable than it would be without them.

use std::error::Error as StdError;
use std::io;

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use stormguard::classify::{
    GrpcCode, GrpcCodeSet, Outcome, RETRY_EXHAUSTED, classify_grpc, classify_io_error,
};
use stormguard::retry::IdempotencyKey;

/// The header a hop adds when it retried and gave up: `X-Retry-Exhausted: true`.
pub use stormguard::classify::RETRY_EXHAUSTED as RETRY_EXHAUSTED_HEADER;

/// Finagle's "do not retry this" response header (a non-retryable nack): a response that
/// carries it is treated like one marked [`RETRY_EXHAUSTED_HEADER`].
pub const FINAGLE_NONRETRYABLE_NACK: &str = "finagle-http-nonretryable-nack";

/// The attempt number (1 for the first attempt) sent on every attempt.
pub const ATTEMPT_HEADER: &str = "x-stormguard-attempt";

/// gRPC A6: on a retry, the number of attempts sent before this one.
pub const GRPC_PREVIOUS_ATTEMPTS: &str = "grpc-previous-rpc-attempts";

/// The request header that carries an idempotency key (IETF httpapi draft).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

// Header names as constants, so that a lookup parses nothing.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
const IDEMPOTENCY_KEY_NAME: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY);
const RETRY_EXHAUSTED_NAME: HeaderName = HeaderName::from_static(RETRY_EXHAUSTED);
const FINAGLE_NACK_NAME: HeaderName = HeaderName::from_static(FINAGLE_NONRETRYABLE_NACK);

/// Whether a header value says `true` (ASCII case-insensitive, surrounding spaces and tabs
/// ignored): the value of [`RETRY_EXHAUSTED_HEADER`] that marks a response.
///
/// ```
/// use stormguard_tower::retry::is_true;
/// assert!(is_true(b" TRUE "));
/// assert!(!is_true(b"yes"));
/// ```
pub fn is_true(value: &[u8]) -> bool {
    trim_ows(value).eq_ignore_ascii_case(b"true")
}

/// Whether `headers` say that their sender already retried, or asked not to be retried:
/// `X-Retry-Exhausted: true` or a Finagle non-retryable nack.
///
/// ```
/// use http::HeaderMap;
/// use stormguard_tower::retry::{is_exhausted, mark_exhausted};
///
/// let mut headers = HeaderMap::new();
/// assert!(!is_exhausted(&headers));
/// mark_exhausted(&mut headers);
/// assert!(is_exhausted(&headers));
/// ```
pub fn is_exhausted(headers: &HeaderMap) -> bool {
    headers
        .get_all(RETRY_EXHAUSTED_NAME)
        .iter()
        .any(|v| is_true(v.as_bytes()))
        || headers.contains_key(FINAGLE_NACK_NAME)
}

/// Adds `X-Retry-Exhausted: true` to `headers`: a handler that forwards a downstream failure
/// (or turns a [`Error`](super::Error) whose [`is_exhausted`](super::Error::is_exhausted) is
/// true into a response) calls this so no layer upstream retries it again.
pub fn mark_exhausted(headers: &mut HeaderMap) {
    headers.insert(RETRY_EXHAUSTED_NAME, HeaderValue::from_static("true"));
}

/// Whether `method` is idempotent by RFC 9110 §9.2.2 (GET, HEAD, OPTIONS, TRACE, PUT, DELETE).
pub fn is_idempotent_method(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Whether a request is gRPC: its `content-type` is `application/grpc`, optionally followed
/// by `+format` or parameters (`application/grpc+proto`); gRPC-Web (`application/grpc-web`)
/// is not.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.as_bytes())
        .is_some_and(|ct| {
            ct.strip_prefix(b"application/grpc")
                .is_some_and(|rest| matches!(rest.first(), None | Some(b'+' | b';')))
        })
}

/// Parses an `Idempotency-Key` header value into the key it carries.
///
/// The draft makes the value a structured-field string (`"abc"`, with `\"` and `\\`
/// escapes); many clients send the bare key instead (`abc`), so a value that does not start
/// with a quote is taken as the key itself. `None` when the value is neither, or the key is
/// not a valid [`IdempotencyKey`] (empty, over 255 characters, not printable ASCII): such a
/// request is then retried as an unkeyed one (only by its method), and the server is left
/// to refuse the key.
///
/// ```
/// use stormguard_tower::retry::parse_idempotency_key;
/// assert_eq!(parse_idempotency_key(br#""order-1""#).unwrap().as_str(), "order-1");
/// assert_eq!(parse_idempotency_key(b"order-1").unwrap().as_str(), "order-1");
/// assert!(parse_idempotency_key(br#""unterminated"#).is_none());
/// ```
pub fn parse_idempotency_key(value: &[u8]) -> Option<IdempotencyKey> {
    let value = trim_ows(value);
    let Some(quoted) = value.strip_prefix(b"\"") else {
        return std::str::from_utf8(value)
            .ok()
            .and_then(|s| IdempotencyKey::new(s).ok());
    };
    // The usual key has no escapes: take it as it is, without copying.
    if let Some(end) = quoted.iter().position(|&b| b == b'"' || b == b'\\') {
        if quoted[end] == b'"' && end + 1 == quoted.len() {
            return std::str::from_utf8(&quoted[..end])
                .ok()
                .and_then(|s| IdempotencyKey::new(s).ok());
        }
    }
    let mut key = String::with_capacity(quoted.len());
    let mut bytes = quoted.iter();
    loop {
        match bytes.next()? {
            b'"' => break,
            b'\\' => match bytes.next()? {
                &c @ (b'"' | b'\\') => key.push(char::from(c)),
                _ => return None,
            },
            &c if (0x20..=0x7e).contains(&c) => key.push(char::from(c)),
            _ => return None,
        }
    }
    if bytes.next().is_some() {
        return None;
    }
    IdempotencyKey::new(&key).ok()
}

/// The idempotency key of a request, if its header carries a valid one.
pub(crate) fn request_key(headers: &HeaderMap) -> Option<IdempotencyKey> {
    headers
        .get(IDEMPOTENCY_KEY_NAME)
        .and_then(|v| parse_idempotency_key(v.as_bytes()))
}

/// Classifies a plain HTTP response: status, `Retry-After`, and the exhausted mark.
pub(crate) use crate::http_status::classify_response_head as http_response;

/// The gRPC status of a response: from the headers (a trailers-only response), else from
/// the trailers, else from the HTTP status by gRPC's HTTP-to-gRPC mapping. `complete` says
/// whether the whole body was read: a complete 200 response without any status is
/// malformed (`UNKNOWN`); an incomplete one was committed before its trailers were seen
/// (`None`: treat as success).
pub(crate) fn grpc_status<'a>(
    status: StatusCode,
    headers: &'a HeaderMap,
    trailers: Option<&'a HeaderMap>,
    complete: bool,
) -> Option<(GrpcCode, Option<&'a HeaderValue>)> {
    let source = if headers.contains_key(&GRPC_STATUS) {
        Some(headers)
    } else {
        trailers.filter(|t| t.contains_key(&GRPC_STATUS))
    };
    if let Some(source) = source {
        let code = source
            .get(&GRPC_STATUS)
            .and_then(|v| GrpcCode::parse_header(v.as_bytes()).ok())
            .unwrap_or(GrpcCode::Unknown);
        return Some((code, source.get(&GRPC_PUSHBACK)));
    }
    if status != StatusCode::OK {
        return Some((grpc_code_for_http(status), None));
    }
    complete.then_some((GrpcCode::Unknown, None))
}

/// Classifies a gRPC response by gRPC A6: the status code against `retryable`, the server's
/// pushback, and the exhausted mark in headers or trailers.
pub(crate) fn grpc_response(
    status: Option<(GrpcCode, Option<&HeaderValue>)>,
    headers: &HeaderMap,
    trailers: Option<&HeaderMap>,
    retryable: GrpcCodeSet,
) -> Outcome {
    let Some((code, pushback)) = status else {
        return Outcome::Success;
    };
    let outcome = classify_grpc(code, retryable, pushback.map(HeaderValue::as_bytes));
    let marked = is_exhausted(headers) || trailers.is_some_and(is_exhausted);
    if marked && outcome.is_failure() {
        Outcome::NeverRetry
    } else {
        outcome
    }
}

/// gRPC's mapping of an HTTP status to a status code, for responses without `grpc-status`
/// (gRPC's `http-grpc-status-mapping.md`).
pub(crate) fn grpc_code_for_http(status: StatusCode) -> GrpcCode {
    match status.as_u16() {
        400 => GrpcCode::Internal,
        401 => GrpcCode::Unauthenticated,
        403 => GrpcCode::PermissionDenied,
        404 => GrpcCode::Unimplemented,
        429 | 502 | 503 | 504 => GrpcCode::Unavailable,
        _ => GrpcCode::Unknown,
    }
}

/// Classifies a transport error of the inner service by its type, walking the cause chain.
///
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
/// - An error none of these recognise is in doubt: it may have happened after the request
///   was sent, so only an idempotent or keyed request is retried.
///
/// Pass your own function to
/// [`RetryLayerBuilder::with_error_classifier`](super::RetryLayerBuilder::with_error_classifier)
/// to decide otherwise.
pub fn classify_transport_error(error: &(dyn StdError + 'static)) -> Outcome {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return classify_io_error(io.kind(), true);
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

/// A short label for a transport error, for logs and spans (`error.type`).
#[cfg(any(feature = "tracing", feature = "json-log"))]
pub(crate) fn error_type(error: &(dyn StdError + 'static)) -> &'static str {
    let mut next = Some(error);
    while let Some(e) = next {
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
        next = e.source();
    }
    "transport"
}

fn trim_ows(value: &[u8]) -> &[u8] {
    let start = value
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |i| i + 1);
    &value[start..end]
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
    fn exhausted_mark_and_nack_stop_retries() {
        let marked = headers(&[("x-retry-exhausted", "true")]);
        assert_eq!(
            http_response(StatusCode::SERVICE_UNAVAILABLE, &marked),
            Outcome::NeverRetry
        );
        assert_eq!(http_response(StatusCode::OK, &marked), Outcome::Success);
        let nack = headers(&[("finagle-http-nonretryable-nack", "")]);
        assert_eq!(
            http_response(StatusCode::SERVICE_UNAVAILABLE, &nack),
            Outcome::NeverRetry
        );
        let other = headers(&[("x-retry-exhausted", "false")]);
        assert_eq!(
            http_response(StatusCode::SERVICE_UNAVAILABLE, &other),
            Outcome::Retryable
        );
    }

    #[test]
    fn retry_after_is_read_for_429_and_503_only() {
        let h = headers(&[("retry-after", "2")]);
        let two = Some(Duration::from_secs(2));
        assert_eq!(
            http_response(StatusCode::SERVICE_UNAVAILABLE, &h),
            Outcome::Overloaded { retry_after: two }
        );
        assert_eq!(
            http_response(StatusCode::TOO_MANY_REQUESTS, &h),
            Outcome::Overloaded { retry_after: two }
        );
        assert_eq!(
            http_response(StatusCode::BAD_GATEWAY, &h),
            Outcome::Retryable
        );
        let bad = headers(&[("retry-after", "soon")]);
        assert_eq!(
            http_response(StatusCode::SERVICE_UNAVAILABLE, &bad),
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
        // Complete and without a status: malformed. Incomplete: committed.
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
            grpc_response(status, &h, None, set),
            Outcome::Overloaded {
                retry_after: Some(Duration::from_millis(250))
            }
        );
        let h = headers(&[("grpc-status", "14"), ("grpc-retry-pushback-ms", "-1")]);
        let status = grpc_status(StatusCode::OK, &h, None, true);
        assert_eq!(grpc_response(status, &h, None, set), Outcome::NeverRetry);
        let none = HeaderMap::new();
        let t = headers(&[("grpc-status", "14"), ("x-retry-exhausted", "true")]);
        let status = grpc_status(StatusCode::OK, &none, Some(&t), true);
        assert_eq!(
            grpc_response(status, &none, Some(&t), set),
            Outcome::NeverRetry
        );
    }

    #[test]
    fn content_type_detects_grpc() {
        for (ct, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("application/grpc;charset=utf-8", true),
            ("application/grpc-web", false),
            ("application/json", false),
        ] {
            let h = headers(&[("content-type", ct)]);
            assert_eq!(is_grpc(&h), grpc, "{ct}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn io_errors_in_the_chain_decide() {
        #[derive(Debug)]
        struct Wrapper(io::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("client error")
            }
        }
        impl StdError for Wrapper {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let refused = Wrapper(io::ErrorKind::ConnectionRefused.into());
        assert_eq!(classify_transport_error(&refused), Outcome::Retryable);
        #[cfg(any(feature = "tracing", feature = "json-log"))]
        assert_eq!(error_type(&refused), "connection_refused");
        let reset = Wrapper(io::ErrorKind::ConnectionReset.into());
        assert_eq!(classify_transport_error(&reset), Outcome::InDoubt);
        let denied = Wrapper(io::ErrorKind::PermissionDenied.into());
        assert_eq!(classify_transport_error(&denied), Outcome::NeverRetry);
        let unknown = std::fmt::Error;
        assert_eq!(classify_transport_error(&unknown), Outcome::InDoubt);
        #[cfg(any(feature = "tracing", feature = "json-log"))]
        assert_eq!(error_type(&unknown), "transport");
    }

    proptest! {
        #[test]
        fn key_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_idempotency_key(&bytes);
        }

        #[test]
        fn keys_round_trip_through_the_header_form(s in "[ -~]{1,255}") {
            let key = IdempotencyKey::new(&s).expect("printable ASCII");
            let parsed = parse_idempotency_key(key.to_header_value().as_bytes());
            prop_assert_eq!(parsed.as_ref().map(IdempotencyKey::as_str), Some(s.as_str()));
        }

        #[test]
        fn only_true_marks(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
            let marked = is_true(&bytes);
            prop_assert_eq!(marked, trim_ows(&bytes).eq_ignore_ascii_case(b"true"));
        }

        #[test]
        fn grpc_classification_never_panics(
            status in 100u16..1000,
            code in proptest::collection::vec(any::<u8>(), 0..4),
            pushback in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let mut h = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_bytes(&code) {
                h.insert(GRPC_STATUS, v);
            }
            if let Ok(v) = HeaderValue::from_bytes(&pushback) {
                h.insert(GRPC_PUSHBACK, v);
            }
            let status = StatusCode::from_u16(status).expect("in range");
            let s = grpc_status(status, &h, None, true);
            let _ = grpc_response(s, &h, None, GrpcCodeSet::A6_DEFAULT);
            let _ = http_response(status, &h);
        }
    }
}
