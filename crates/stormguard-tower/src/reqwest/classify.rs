//! What a reqwest response or error means for retrying.
//!
//! reqwest reports every transport failure as one error type; what matters for a retry is
//! whether the request can have reached the server. A connect error means nothing was sent
//! (retryable, even for a `POST`); a timeout, a reset or a connection closed mid-response
//! means the server may have acted on it (in doubt: retried only when idempotent or keyed).

use std::error::Error as _;
use std::io;

use ::reqwest::Response;
use stormguard::classify::{Outcome, classify_io_error};

use crate::wire::classify_response_head;

/// Classifies a response by its status, `Retry-After` and `X-Retry-Exhausted` headers (or a
/// Finagle non-retryable nack).
///
/// As every layer of this crate reads a response ([`classify_response_head`], over the core's
/// [`classify_http_response`](stormguard::classify::classify_http_response)): 429 and 503 with a `Retry-After` are
/// [`Outcome::Overloaded`] and wait at least that long (a malformed `Retry-After` counts as
/// absent), and a failed response marked `X-Retry-Exhausted: true` (case-insensitive) is
/// [`Outcome::NeverRetry`]: the hop that sent it already retried.
///
/// ```
/// use stormguard::classify::Outcome;
/// use stormguard_tower::reqwest::classify_response;
///
/// let response = |status: u16, headers: &[(&str, &str)]| {
///     let mut builder = http::Response::builder().status(status);
///     for (name, value) in headers {
///         builder = builder.header(*name, *value);
///     }
///     reqwest::Response::from(builder.body("").unwrap())
/// };
/// assert_eq!(classify_response(&response(503, &[])), Outcome::Retryable);
/// assert_eq!(classify_response(&response(503, &[("x-retry-exhausted", "true")])), Outcome::NeverRetry);
/// assert_eq!(
///     classify_response(&response(429, &[("retry-after", "2")])),
///     Outcome::Overloaded { retry_after: Some(std::time::Duration::from_secs(2)) },
/// );
/// ```
pub fn classify_response(response: &Response) -> Outcome {
    classify_response_head(response.status(), response.headers())
}

/// Classifies an error returned by the rest of the middleware chain.
///
/// - A reqwest connect error (refused, unreachable, DNS, TLS handshake, connect timeout):
///   nothing was sent, [`Outcome::Retryable`].
/// - A reqwest error caused by an I/O error: the core's [`classify_io_error`] with the
///   request taken as sent (a reset or a timeout is [`Outcome::InDoubt`]).
/// - Any other timeout, request or body error (the connection closed before the response
///   was complete, …): [`Outcome::InDoubt`].
/// - A builder, redirect or decoding error, or an error from another middleware:
///   [`Outcome::NeverRetry`] — retrying what is not understood is how storms start.
pub fn classify_error(error: &reqwest_middleware::Error) -> Outcome {
    match error {
        reqwest_middleware::Error::Reqwest(error) => classify_reqwest_error(error),
        reqwest_middleware::Error::Middleware(_) => Outcome::NeverRetry,
    }
}

fn classify_reqwest_error(error: &::reqwest::Error) -> Outcome {
    if error.is_builder() || error.is_redirect() || error.is_decode() || error.is_status() {
        return Outcome::NeverRetry;
    }
    if error.is_connect() {
        return Outcome::Retryable;
    }
    if let Some(kind) = io_error_kind(error) {
        return classify_io_error(kind, true);
    }
    if error.is_timeout() || error.is_request() || error.is_body() {
        return Outcome::InDoubt;
    }
    Outcome::NeverRetry
}

/// The kind of the first I/O error in `error`'s cause chain.
fn io_error_kind(error: &::reqwest::Error) -> Option<io::ErrorKind> {
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        source = cause.source();
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http::{HeaderMap, StatusCode};
    use std::time::Duration;

    fn classify_parts(status: u16, headers: &HeaderMap) -> Outcome {
        classify_response_head(StatusCode::from_u16(status).unwrap(), headers)
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| {
                (
                    http::HeaderName::from_static(n),
                    http::HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn statuses_follow_the_core() {
        let none = HeaderMap::new();
        assert_eq!(classify_parts(200, &none), Outcome::Success);
        assert_eq!(classify_parts(400, &none), Outcome::NeverRetry);
        assert_eq!(classify_parts(503, &none), Outcome::Retryable);
        assert_eq!(
            classify_parts(503, &headers(&[("retry-after", "7")])),
            Outcome::Overloaded {
                retry_after: Some(Duration::from_secs(7))
            }
        );
    }

    #[test]
    fn malformed_retry_after_counts_as_absent() {
        assert_eq!(
            classify_parts(503, &headers(&[("retry-after", "-1")])),
            Outcome::Retryable
        );
        assert_eq!(
            classify_parts(429, &headers(&[("retry-after", "soon")])),
            Outcome::Overloaded { retry_after: None }
        );
    }

    #[test]
    fn exhausted_mark_stops_failures_only() {
        let marked = headers(&[("x-retry-exhausted", "TRUE")]);
        assert_eq!(classify_parts(503, &marked), Outcome::NeverRetry);
        assert_eq!(classify_parts(200, &marked), Outcome::Success);
        let other = headers(&[("x-retry-exhausted", "false")]);
        assert_eq!(classify_parts(502, &other), Outcome::Retryable);
    }

    #[tokio::test]
    async fn builder_errors_are_never_retried() {
        let err = ::reqwest::Client::new()
            .get("not a url")
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            classify_error(&reqwest_middleware::Error::Reqwest(err)),
            Outcome::NeverRetry
        );
    }
}
