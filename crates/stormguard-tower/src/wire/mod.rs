//! What HTTP and gRPC say on the wire, read and written in one place.
//!
//! Every layer of this crate, the reqwest middleware and the idempotency server read the same
//! facts off requests and responses: whether a call is gRPC, whether it may be sent twice,
//! which idempotency key it carries, what deadline it announces, whether a response says "do
//! not retry me", what a status or a transport error means. Each fact is decided here once, so
//! a client and a server of this project cannot disagree about it, and no module imports a
//! header fact from another layer's internals.
//!
//! | fact | read | written |
//! | --- | --- | --- |
//! | protocol | [`Protocol::of`] | |
//! | may it be sent twice | [`is_retry_safe`], [`is_idempotent_method`] | |
//! | idempotency key (IETF draft, sf-string) | [`idempotency_key`] | [`IdempotencyKey::to_header_value`](stormguard::retry::IdempotencyKey::to_header_value) |
//! | deadline (four headers) | [`read_deadline`] | [`write_deadline`] |
//! | "I already retried" | [`is_exhausted`] | [`mark_exhausted`] |
//! | attempt number | | [`set_attempt`] |
//! | what a response means | [`classify_response_head`], [`health_outcome`], [`grpc_outcome`] | |
//! | what an error means | [`classify_transport_error`], [`refusal_of`] | [`ConnectError`] |
//! | "refused here, not sent" | [`is_rejection`], [`rejection_refusal`] | [`mark_rejection`] |

mod classify;
mod deadline;
mod key;

pub use classify::{
    BoxError, ConnectError, HealthClassifier, as_error, classify_response_head,
    classify_transport_error, error_type, grpc_code_for_http, grpc_outcome, grpc_status,
    health_outcome, mark_rejection, refusal_of, rejection_refusal,
};
pub(crate) use deadline::header_name;
pub use deadline::{has_deadline_header, read_deadline, write_deadline};
pub use key::{
    IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, KeyError, has_idempotency_key, idempotency_key,
};

use http::header::{CONTENT_TYPE, HeaderName};
use http::{HeaderMap, HeaderValue, Method};

/// The response header a hop adds when it retried and gave up, or was refused a retry:
/// `X-Retry-Exhausted: true`. A response that carries it is never retried upstream.
pub const RETRY_EXHAUSTED: HeaderName = HeaderName::from_static("x-retry-exhausted");

/// Finagle's "do not retry this" response header (a non-retryable nack): a response that
/// carries it is treated like one marked [`RETRY_EXHAUSTED`].
pub const FINAGLE_NONRETRYABLE_NACK: HeaderName =
    HeaderName::from_static("finagle-http-nonretryable-nack");

/// The attempt number sent on every attempt: `1` for the first, `2` for the first retry, …
pub const ATTEMPT: HeaderName = HeaderName::from_static("x-stormguard-attempt");

/// gRPC A6: on a retry, the number of attempts sent before this one.
pub const GRPC_PREVIOUS_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");

/// gRPC's status header (in trailers, or in the headers of a trailers-only response).
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// gRPC's status message header.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// gRPC A6 server pushback: `grpc-retry-pushback-ms`.
pub const GRPC_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The response header of a request this project refused locally instead of sending
/// (`circuit-open`, `throttled`, `deadline-too-close`, `shed`): a refusal, never a failure
/// of the downstream, so no retrier retries it and no breaker counts it.
pub const REJECTED_BY: HeaderName = HeaderName::from_static("x-stormguard-rejected");

/// The request id header copied into logs and spans.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// How a request or response speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Plain HTTP.
    Http,
    /// gRPC over HTTP/2: `content-type: application/grpc`, `application/grpc+proto`,
    /// `application/grpc;…`. The status is in the trailers, or in the headers of a
    /// trailers-only response.
    Grpc,
    /// gRPC-Web (`application/grpc-web`, `application/grpc-web-text`, with `+format` or
    /// parameters): a status in the headers is read as gRPC's, but the trailers travel inside
    /// the body, where this crate does not look, so a gRPC-Web response without a status in
    /// its headers is judged by its HTTP status.
    GrpcWeb,
}

impl Protocol {
    /// The protocol of a request or response, by its `content-type` (ASCII case-insensitive).
    ///
    /// ```
    /// use http::HeaderMap;
    /// use stormguard_tower::wire::Protocol;
    ///
    /// let mut h = HeaderMap::new();
    /// assert_eq!(Protocol::of(&h), Protocol::Http);
    /// h.insert("content-type", "application/grpc+proto".parse().unwrap());
    /// assert_eq!(Protocol::of(&h), Protocol::Grpc);
    /// h.insert("content-type", "application/grpc-web+proto".parse().unwrap());
    /// assert_eq!(Protocol::of(&h), Protocol::GrpcWeb);
    /// h.insert("content-type", "application/grpcx".parse().unwrap());
    /// assert_eq!(Protocol::of(&h), Protocol::Http);
    /// ```
    pub fn of(headers: &HeaderMap) -> Protocol {
        let Some(ct) = headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes) else {
            return Protocol::Http;
        };
        const GRPC: &[u8] = b"application/grpc";
        let Some(rest) = ct
            .get(..GRPC.len())
            .filter(|p| p.eq_ignore_ascii_case(GRPC))
            .and_then(|_| ct.get(GRPC.len()..))
        else {
            return Protocol::Http;
        };
        let ends = |rest: &[u8]| matches!(rest.first(), None | Some(b'+' | b';' | b' '));
        if ends(rest) {
            return Protocol::Grpc;
        }
        for web in [&b"-web-text"[..], b"-web"] {
            if let Some(after) = rest
                .get(..web.len())
                .filter(|p| p.eq_ignore_ascii_case(web))
                .and_then(|_| rest.get(web.len()..))
            {
                if ends(after) {
                    return Protocol::GrpcWeb;
                }
            }
        }
        Protocol::Http
    }

    /// Whether this is gRPC or gRPC-Web.
    pub const fn is_grpc(self) -> bool {
        matches!(self, Protocol::Grpc | Protocol::GrpcWeb)
    }
}

/// Whether `method` is idempotent by RFC 9110 §9.2.2 (GET, HEAD, OPTIONS, TRACE, PUT, DELETE).
pub fn is_idempotent_method(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The one rule for whether a request may be sent again after an in-doubt failure (a timeout
/// or reset after it was sent), or after a failure response that may follow a side effect:
///
/// - it carries a valid idempotency key (`keyed`; the same key goes on every attempt, and the
///   server replays instead of repeating), or
/// - its endpoint's policy declares the operation idempotent, or
/// - it is plain HTTP with an idempotent method (gRPC methods are all `POST`: the method says
///   nothing, so a gRPC call needs a key or a policy).
///
/// ```
/// use http::Method;
/// use stormguard_tower::wire::{Protocol, is_retry_safe};
///
/// assert!(is_retry_safe(&Method::GET, Protocol::Http, false, false));
/// assert!(!is_retry_safe(&Method::POST, Protocol::Http, false, false));
/// assert!(is_retry_safe(&Method::POST, Protocol::Http, true, false));
/// assert!(!is_retry_safe(&Method::POST, Protocol::Grpc, false, false));
/// assert!(is_retry_safe(&Method::POST, Protocol::Grpc, false, true));
/// ```
pub fn is_retry_safe(method: &Method, protocol: Protocol, keyed: bool, idempotent: bool) -> bool {
    keyed || idempotent || (protocol == Protocol::Http && is_idempotent_method(method))
}

/// Whether a header value says `true` (ASCII case-insensitive, surrounding spaces and tabs
/// ignored): the value of [`RETRY_EXHAUSTED`] that marks a response.
///
/// ```
/// use stormguard_tower::wire::is_true;
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
/// use stormguard_tower::wire::{is_exhausted, mark_exhausted};
///
/// let mut headers = HeaderMap::new();
/// assert!(!is_exhausted(&headers));
/// mark_exhausted(&mut headers);
/// assert!(is_exhausted(&headers));
/// ```
pub fn is_exhausted(headers: &HeaderMap) -> bool {
    headers
        .get_all(RETRY_EXHAUSTED)
        .iter()
        .any(|v| is_true(v.as_bytes()))
        || headers.contains_key(FINAGLE_NONRETRYABLE_NACK)
}

/// Adds `X-Retry-Exhausted: true` to `headers`: a handler that forwards a downstream failure
/// (or turns an error whose `is_exhausted()` is true into a response) calls this so no
/// layer upstream retries it again.
pub fn mark_exhausted(headers: &mut HeaderMap) {
    headers.insert(RETRY_EXHAUSTED, HeaderValue::from_static("true"));
}

/// Whether a response was written by a local refusal of this project (an open breaker, the
/// throttle, a load shedder) rather than by the downstream: it carries [`REJECTED_BY`].
pub fn is_rejection(headers: &HeaderMap) -> bool {
    carries(headers, &REJECTED_BY)
}

/// Heads with at most this many names are searched by comparing names (see [`carries`]);
/// larger ones by the map's hashed look-up.
pub(crate) const SCANNED_NAMES: usize = 16;

/// Whether `headers` hold a header named `name`. In a small head (at most [`SCANNED_NAMES`]
/// names) it is found by comparing the names present rather than by hashing `name` and
/// probing: most names are standard ones that differ from a custom name at the first
/// comparison, and the headers this crate looks for on every call are mostly absent. On the
/// proxy's path (a head of a few headers) this took a look-up from about 210 instructions to
/// a few dozen.
pub(crate) fn carries(headers: &HeaderMap, name: &HeaderName) -> bool {
    find(headers, name).is_some()
}

/// The first value of `name` in `headers`: compared name by name in a small head (see
/// [`carries`]), looked up by hash in a larger one.
pub(crate) fn find<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h HeaderValue> {
    if headers.keys_len() > SCANNED_NAMES {
        return headers.get(name);
    }
    headers
        .iter()
        .find_map(|(present, value)| (present == name).then_some(value))
}

/// Numbers attempt `number` of a request (1 for the first): [`ATTEMPT`], and on gRPC retries
/// [`GRPC_PREVIOUS_ATTEMPTS`] (gRPC A6). Nothing here allocates for attempts 1 to 9.
pub fn set_attempt(headers: &mut HeaderMap, number: u32, protocol: Protocol) {
    headers.insert(ATTEMPT, count_value(number));
    if number > 1 && protocol.is_grpc() {
        headers.insert(GRPC_PREVIOUS_ATTEMPTS, count_value(number - 1));
    }
}

/// A small count as a header value, without allocating for 0 to 9.
fn count_value(n: u32) -> HeaderValue {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match usize::try_from(n).ok().and_then(|i| DIGITS.get(i)) {
        Some(digit) => HeaderValue::from_static(digit),
        None => HeaderValue::from(n),
    }
}

/// `value` without the optional whitespace (spaces and tabs) around it.
pub(crate) fn trim_ows(value: &[u8]) -> &[u8] {
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

    /// Standard and custom names, the deadline headers among them.
    const NAMES: [HeaderName; 10] = [
        CONTENT_TYPE,
        http::header::HOST,
        http::header::ACCEPT,
        REJECTED_BY,
        REQUEST_ID,
        ATTEMPT,
        HeaderName::from_static("grpc-timeout"),
        HeaderName::from_static("x-request-deadline"),
        HeaderName::from_static("x-envoy-expected-rq-timeout-ms"),
        HeaderName::from_static("connect-timeout-ms"),
    ];

    #[test]
    fn content_types() {
        for (ct, protocol) in [
            ("application/grpc", Protocol::Grpc),
            ("Application/GRPC", Protocol::Grpc),
            ("application/grpc+proto", Protocol::Grpc),
            ("application/grpc;charset=utf-8", Protocol::Grpc),
            ("application/grpc-web", Protocol::GrpcWeb),
            ("application/grpc-web+proto", Protocol::GrpcWeb),
            ("application/grpc-web-text", Protocol::GrpcWeb),
            ("application/grpc-webx", Protocol::Http),
            ("application/grpcfoo", Protocol::Http),
            ("application/json", Protocol::Http),
        ] {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
            assert_eq!(Protocol::of(&h), protocol, "{ct}");
        }
    }

    #[test]
    fn attempts_are_numbered_for_grpc_retries_too() {
        let mut h = HeaderMap::new();
        set_attempt(&mut h, 1, Protocol::Grpc);
        assert_eq!(h[ATTEMPT], "1");
        assert!(!h.contains_key(GRPC_PREVIOUS_ATTEMPTS));
        set_attempt(&mut h, 12, Protocol::Grpc);
        assert_eq!(h[ATTEMPT], "12");
        assert_eq!(h[GRPC_PREVIOUS_ATTEMPTS], "11");
    }

    proptest! {
        #[test]
        fn only_true_marks(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
            let marked = is_true(&bytes);
            let expected = String::from_utf8(bytes.clone())
                .map(|s| s.trim_matches(|c| c == ' ' || c == '\t').eq_ignore_ascii_case("true"))
                .unwrap_or(false);
            prop_assert_eq!(marked, expected);
        }

        /// The scan answers as the hashed look-up does, for standard and custom names,
        /// repeated ones included, in maps of any size.
        #[test]
        fn carries_agrees_with_contains_key(
            present in proptest::collection::vec(
                (0usize..NAMES.len(), any::<bool>(), 0u8..3),
                0..40,
            ),
            extra in 0usize..30,
            wanted in 0usize..NAMES.len(),
        ) {
            // Names as hyper parses them (mixed case, from bytes) and as constants; values
            // told apart so `find` must return the first; `extra` other names push the map
            // past the scanned size.
            let mut headers = HeaderMap::new();
            for (i, parsed, v) in present {
                let name = if parsed {
                    HeaderName::from_bytes(NAMES[i].as_str().to_ascii_uppercase().as_bytes())
                        .expect("a known name in capitals is a name")
                } else {
                    NAMES[i].clone()
                };
                headers.append(name, HeaderValue::from(u16::from(v)));
            }
            for i in 0..extra {
                let other = HeaderName::from_bytes(format!("x-other-{i}").as_bytes())
                    .expect("x-other-N is a name");
                headers.insert(other, HeaderValue::from_static("o"));
            }
            let name = &NAMES[wanted];
            prop_assert_eq!(carries(&headers, name), headers.contains_key(name));
            prop_assert_eq!(find(&headers, name), headers.get(name));
            let deadline = headers
                .keys()
                .any(|n| n.as_str().contains("timeout") || n.as_str().contains("deadline"));
            prop_assert_eq!(super::deadline::has_deadline_header(&headers), deadline);
        }

        #[test]
        fn count_values_are_the_decimal_number(n in any::<u32>()) {
            let value = count_value(n);
            let text = n.to_string();
            prop_assert_eq!(value.to_str().ok(), Some(text.as_str()));
        }
    }
}
