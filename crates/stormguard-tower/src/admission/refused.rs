//! What a caller gets when the gate refuses: the typed refusal as an error, or a `503`.

use stormguard::admission::Refusal;

use crate::client::marks_exhausted;
use crate::wire;

/// Turns a refusal into a response, or leaves it an error (`None`).
pub trait RefusalAnswer<Res> {
    /// The response to answer with, or `None` to fail with the refusal.
    fn answer(&self, refusal: &Refusal) -> Option<Res>;
}

/// Refusals are errors: the core's [`Refusal`], boxed (the default). Find it with
/// [`wire::refusal_of`] or by downcasting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorOnRefusal;

impl<Res> RefusalAnswer<Res> for ErrorOnRefusal {
    fn answer(&self, _: &Refusal) -> Option<Res> {
        None
    }
}

/// Refusals are `503 Service Unavailable` responses with an empty (default) body, for a
/// proxy that passes them upstream as they are: marked as a refusal ([`wire::REJECTED_BY`],
/// see [`wire::mark_rejection`]), with `Retry-After` when the breaker knows when it will
/// admit calls again, and `X-Retry-Exhausted: true` so that no retrier upstream sends it
/// again.
///
/// ```
/// use std::time::Duration;
/// use stormguard::admission::Refusal;
/// use stormguard::breaker::{BreakerOpen, Rejection};
/// use stormguard_tower::admission::{Http503, RefusalAnswer};
///
/// let open = Refusal::BreakerOpen(BreakerOpen { retry_after: Duration::from_millis(1500), reason: Rejection::Open });
/// let response: http::Response<String> = Http503.answer(&open).unwrap();
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["retry-after"], "2");
/// assert_eq!(response.headers()["x-stormguard-rejected"], "circuit-open");
/// assert_eq!(response.headers()["x-retry-exhausted"], "true");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Http503;

impl<B: Default> RefusalAnswer<http::Response<B>> for Http503 {
    fn answer(&self, refusal: &Refusal) -> Option<http::Response<B>> {
        let mut response = http::Response::new(B::default());
        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        let headers = response.headers_mut();
        wire::mark_rejection(headers, refusal);
        if marks_exhausted(refusal.stop_reason(), 0) {
            wire::mark_exhausted(headers);
        }
        Some(response)
    }
}
