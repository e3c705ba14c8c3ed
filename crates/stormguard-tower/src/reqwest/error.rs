//! Errors the middleware itself returns (inside `reqwest_middleware::Error::Middleware`).

use std::time::Duration;

use stormguard::retry::StopReason;

/// The last attempt was cut by its per-attempt timeout (`min(per-try timeout, time left)`).
///
/// Returned as `reqwest_middleware::Error::Middleware`; find it with
/// `error.downcast_ref::<AttemptTimedOut>()` on the inner `anyhow::Error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("attempt {attempts} timed out after {after:?}; stopped: {}", stop.label())]
pub struct AttemptTimedOut {
    /// The timeout that cut the last attempt.
    pub after: Duration,
    /// Attempts sent, the first included.
    pub attempts: u32,
    /// Why no further attempt was sent.
    pub stop: StopReason,
}

/// A request whose body is a stream was to be sent a second time. The middleware never
/// retries such a request, so this is not returned in practice: it keeps the impossible case
/// an error instead of a panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the request body is a stream and cannot be sent again")]
pub(crate) struct BodyNotReplayable;
