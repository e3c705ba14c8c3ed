//! The proxy's own answers, when no upstream response can be handed back: in the form the
//! caller speaks (a status code for HTTP, a trailers-only response for gRPC).
//!
//! | cause | HTTP | gRPC |
//! | --- | --- | --- |
//! | refused (breaker open, throttled, budget empty) | 503 | `UNAVAILABLE` |
//! | deadline too close to send, or an attempt timed out | 504 | `DEADLINE_EXCEEDED` |
//! | transport failure (refused connection, reset) | 502 | `UNAVAILABLE` |
//! | the request body could not be read | 400 | `INVALID_ARGUMENT` |
//! | the request came back to this proxy ([`crate::via`]) | 508 | `FAILED_PRECONDITION` |
//!
//! A gRPC answer is trailers-only: HTTP 200 with the status in the headers. A gRPC-Web
//! caller gets it with its own content type (`application/grpc-web+proto`,
//! `application/grpc-web-text`, …): gRPC-Web allows the status in the headers, but an
//! `application/grpc` answer is not a gRPC-Web response and its clients reject it.
//!
//! Each carries `X-Retry-Exhausted: true` when the client stack says nobody upstream should
//! retry it ([`Error::is_exhausted`](stormguard_tower::client::Error::is_exhausted)), and
//! [`REASON_HEADER`] naming why, for logs and tests.

use axum::body::Body;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use stormguard::retry::StopReason;
use stormguard_tower::client::Error;
use stormguard_tower::wire::{self, Protocol};

/// The header of the proxy's own answers that says why it answered (a stop reason's label,
/// `transport`, `no-upstream` or `request-body`).
pub const REASON_HEADER: &str = "x-stormguard-proxy";

/// How a caller is answered: its protocol, and a gRPC-Web caller's own content type.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    protocol: Protocol,
    grpc_web_type: Option<HeaderValue>,
}

impl Caller {
    /// The caller of a request with these headers.
    pub(crate) fn of(headers: &HeaderMap) -> Caller {
        let protocol = Protocol::of(headers);
        let grpc_web_type = (protocol == Protocol::GrpcWeb)
            .then(|| headers.get(CONTENT_TYPE).cloned())
            .flatten();
        Caller {
            protocol,
            grpc_web_type,
        }
    }
}

/// The answer to a request that came back to this proxy.
pub(crate) fn looped(caller: &Caller) -> Response<Body> {
    answer(
        StatusCode::LOOP_DETECTED,
        GRPC_FAILED_PRECONDITION,
        "loop",
        "this request names the proxy itself, or passed through it before (Via)",
        caller,
    )
}

/// The answer to a call the client stack could not complete.
pub(crate) fn for_error(error: &Error, caller: &Caller) -> Response<Body> {
    let (status, grpc, reason) = match error {
        Error::Refused { source, .. } => {
            let stop = source.stop_reason();
            if stop == StopReason::DeadlineTooClose {
                (
                    StatusCode::GATEWAY_TIMEOUT,
                    GRPC_DEADLINE_EXCEEDED,
                    stop.label(),
                )
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    GRPC_UNAVAILABLE,
                    stop.label(),
                )
            }
        }
        Error::TimedOut { .. } => (
            StatusCode::GATEWAY_TIMEOUT,
            GRPC_DEADLINE_EXCEEDED,
            "timeout",
        ),
        Error::Transport { source, .. } if names_no_upstream(source.as_ref()) => (
            StatusCode::BAD_REQUEST,
            GRPC_INVALID_ARGUMENT,
            "no-upstream",
        ),
        Error::Transport { .. } | Error::NotReady(_) => {
            (StatusCode::BAD_GATEWAY, GRPC_UNAVAILABLE, "transport")
        }
        Error::RequestBody(_) => (
            StatusCode::BAD_REQUEST,
            GRPC_INVALID_ARGUMENT,
            "request-body",
        ),
    };
    let mut response = answer(status, grpc, reason, &error.to_string(), caller);
    if error.is_exhausted() {
        wire::mark_exhausted(response.headers_mut());
    }
    response
}

/// The answer to a request the transport alone could not forward (the ingress side, where
/// nothing retries).
pub(crate) fn for_transport(
    error: &crate::forward::ForwardError,
    caller: &Caller,
) -> Response<Body> {
    if names_no_upstream(error.as_ref()) {
        return answer(
            StatusCode::BAD_REQUEST,
            GRPC_INVALID_ARGUMENT,
            "no-upstream",
            &error.to_string(),
            caller,
        );
    }
    answer(
        StatusCode::BAD_GATEWAY,
        GRPC_UNAVAILABLE,
        "transport",
        &error.to_string(),
        caller,
    )
}

/// Whether `error` or one of its causes is a request that named no upstream.
fn names_no_upstream(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<crate::forward::NoUpstream>() {
            return true;
        }
        next = e.source();
    }
    false
}

const GRPC_INVALID_ARGUMENT: &str = "3";
const GRPC_DEADLINE_EXCEEDED: &str = "4";
const GRPC_FAILED_PRECONDITION: &str = "9";
const GRPC_UNAVAILABLE: &str = "14";

fn answer(
    status: StatusCode,
    grpc_status: &'static str,
    reason: &'static str,
    message: &str,
    caller: &Caller,
) -> Response<Body> {
    let mut headers = HeaderMap::new();
    headers.insert(REASON_HEADER, HeaderValue::from_static(reason));
    let (status, body) = if caller.protocol.is_grpc() {
        let content_type = match &caller.grpc_web_type {
            Some(web) => web.clone(),
            None => HeaderValue::from_static("application/grpc"),
        };
        headers.insert(CONTENT_TYPE, content_type);
        headers.insert(wire::GRPC_STATUS, HeaderValue::from_static(grpc_status));
        // grpc-message is percent-encoded; the proxy's messages are plain ASCII words.
        let plain: String = message
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { ' ' })
            .collect();
        if let Ok(value) = HeaderValue::from_str(&plain) {
            headers.insert(wire::GRPC_MESSAGE, value);
        }
        (StatusCode::OK, Body::empty())
    } else {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        (status, Body::from(format!("{message}\n")))
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(content_type: &str) -> Caller {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, content_type.parse().expect("value"));
        Caller::of(&headers)
    }

    #[test]
    fn grpc_web_callers_get_their_own_content_type() {
        for web in ["application/grpc-web+proto", "application/grpc-web-text"] {
            let answer = looped(&caller(web));
            assert_eq!(answer.status(), StatusCode::OK, "trailers-only");
            assert_eq!(answer.headers()[CONTENT_TYPE], web);
            assert_eq!(
                answer.headers()[wire::GRPC_STATUS],
                GRPC_FAILED_PRECONDITION
            );
        }
        let grpc = looped(&caller("application/grpc+proto"));
        assert_eq!(grpc.headers()[CONTENT_TYPE], "application/grpc");
        let http = looped(&caller("application/json"));
        assert_eq!(http.status(), StatusCode::LOOP_DETECTED);
    }
}
