//! Classifying HTTP responses for the breaker and throttle layers.
//!
//! The layers need one [`Outcome`] per call to record in the breaker's window or the
//! throttle's counts. [`HttpStatus`] reads it off an `http::Response` the way the core's
//! [`classify_http_response`] does: the status, the `Retry-After` header (so a 503 with one is
//! [`Outcome::Overloaded`]) and `X-Retry-Exhausted`. Any other service can bring its own
//! classifier: every `Fn(&Result<T, E>) -> Outcome` is one.

use std::time::SystemTime;

use http::header::RETRY_AFTER;
use stormguard::classify::{
    Classifier, Outcome, RETRY_EXHAUSTED, classify_http_response, parse_retry_after,
};

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
            Ok(response) => {
                let headers = response.headers();
                let retry_after = headers
                    .get(RETRY_AFTER)
                    .and_then(|v| parse_retry_after(v.as_bytes(), SystemTime::now()).ok());
                let already_retried = headers
                    .get(RETRY_EXHAUSTED)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                classify_http_response(response.status().as_u16(), retry_after, already_retried)
            }
            Err(_) => Outcome::InDoubt,
        }
    }
}
