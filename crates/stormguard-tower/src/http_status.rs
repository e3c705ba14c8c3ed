//! Classifying HTTP responses for the breaker and throttle layers.
//!
//! The layers need one [`Outcome`] per call to record in the breaker's window or the
//! throttle's counts. [`HttpStatus`] reads it off an `http::Response` the way the core's
//! [`classify_http_response`] does: the status, the `Retry-After` header (so a 503 with one is
//! [`Outcome::Overloaded`]) and `X-Retry-Exhausted` ([`classify_response_head`], which the
//! retry, hedge and reqwest classifiers share). Any other service can bring its own
//! classifier: every `Fn(&Result<T, E>) -> Outcome` is one.

use std::time::SystemTime;

use http::header::RETRY_AFTER;
use http::{HeaderMap, StatusCode};
use stormguard::classify::{Classifier, Outcome, classify_http_response, parse_retry_after};

use crate::retry::is_exhausted;

/// Classifies an HTTP response by its status and headers, as every layer here reads one:
/// the core's [`classify_http_response`] over the status, the `Retry-After` header (read only
/// for 429 and 503, the statuses it changes; a malformed one counts as absent) and the
/// exhausted mark (`X-Retry-Exhausted: true` or a Finagle non-retryable nack, see
/// [`is_exhausted`]).
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use stormguard::classify::Outcome;
/// use stormguard_tower::http_status::classify_response_head;
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
    let retry_after = match status {
        429 | 503 => headers
            .get(RETRY_AFTER)
            .and_then(|v| parse_retry_after(v.as_bytes(), SystemTime::now()).ok()),
        _ => None,
    };
    classify_http_response(status, retry_after, is_exhausted(headers))
}

/// Classifies `http::Response`s by status and headers; an `Err` from the inner service (a
/// transport error, a timeout) is [`Outcome::InDoubt`]: the request may have been sent, and
/// either way the downstream did not answer.
///
/// ```
/// use stormguard::classify::{Classifier, Outcome};
/// use stormguard_tower::http_status::HttpStatus;
///
/// let response = http::Response::builder().status(503).body(()).unwrap();
/// assert_eq!(HttpStatus.classify(&Ok::<_, ()>(response)), Outcome::Retryable);
/// let busy = http::Response::builder().status(503).header("retry-after", "2").body(()).unwrap();
/// assert!(matches!(HttpStatus.classify(&Ok::<_, ()>(busy)), Outcome::Overloaded { .. }));
/// assert_eq!(HttpStatus.classify(&Err::<http::Response<()>, _>("reset")), Outcome::InDoubt);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HttpStatus;

impl<B, E> Classifier<http::Response<B>, E> for HttpStatus {
    fn classify(&self, result: &Result<http::Response<B>, E>) -> Outcome {
        match result {
            Ok(response) => classify_response_head(response.status(), response.headers()),
            Err(_) => Outcome::InDoubt,
        }
    }
}
