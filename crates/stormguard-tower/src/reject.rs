//! What a caller gets when the breaker or the throttle stops a request: a typed error, or —
//! for HTTP users who would rather handle one kind of failure — a `503 Service Unavailable`
//! response.
//!
//! Rejecting with an error (the default, [`ErrorOnReject`]) keeps the reason inspectable by
//! type: `BreakerError::Open` carries the breaker's [`BreakerOpen`] (how long until it may
//! admit a call), `ThrottleError::Throttled` the throttle's [`Throttled`]. [`Http503`] turns
//! either into a response instead, so a proxy can pass it upstream as is: it carries
//! `Retry-After` (whole seconds, rounded up) when the breaker knows when it will admit calls
//! again, and [`REJECTED_BY`] naming who rejected it.

use http::HeaderValue;
use http::header::RETRY_AFTER;
use stormguard::breaker::BreakerOpen;
use stormguard::throttle::Throttled;

/// The response header an [`Http503`] rejection carries: `circuit-open` or `throttled`.
pub const REJECTED_BY: &str = "x-stormguard-rejected";

/// Why a request was not sent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rejected {
    /// The circuit breaker is open (or half-open with every probe in flight).
    Breaker(BreakerOpen),
    /// The adaptive throttle rejected it locally.
    Throttle(Throttled),
}

/// Turns a rejection into a response, or leaves it an error (`None`).
pub trait RejectWith<Res> {
    /// The response to answer with, or `None` to fail with the layer's error.
    fn reject(&self, rejected: Rejected) -> Option<Res>;
}

/// Rejections are errors (the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorOnReject;

impl<Res> RejectWith<Res> for ErrorOnReject {
    fn reject(&self, _: Rejected) -> Option<Res> {
        None
    }
}

/// Rejections are `503 Service Unavailable` responses with an empty (default) body.
///
/// ```
/// use std::time::Duration;
/// use stormguard::breaker::{BreakerOpen, Rejection};
/// use stormguard_tower::reject::{Http503, Rejected, RejectWith};
///
/// let open = BreakerOpen { retry_after: Duration::from_millis(1500), reason: Rejection::Open };
/// let response: http::Response<String> = Http503.reject(Rejected::Breaker(open)).unwrap();
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["retry-after"], "2");
/// assert_eq!(response.headers()["x-stormguard-rejected"], "circuit-open");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Http503;

impl<B: Default> RejectWith<http::Response<B>> for Http503 {
    fn reject(&self, rejected: Rejected) -> Option<http::Response<B>> {
        let mut response = http::Response::new(B::default());
        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        let headers = response.headers_mut();
        match rejected {
            Rejected::Breaker(open) => {
                let millis = open.retry_after.as_millis();
                let secs = millis.div_ceil(1000);
                headers.insert(RETRY_AFTER, HeaderValue::from(secs as u64));
                headers.insert(REJECTED_BY, HeaderValue::from_static("circuit-open"));
            }
            Rejected::Throttle(_) => {
                headers.insert(REJECTED_BY, HeaderValue::from_static("throttled"));
            }
        }
        Some(response)
    }
}
