//! The answer to a rejected call.

use std::time::Duration;

/// Why a call was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The breaker is open.
    Open,
    /// The breaker is half-open and all its probes are in flight.
    ProbesBusy,
    /// The breaker was isolated by hand.
    Isolated,
}

/// The breaker rejected the call; it was not sent.
///
/// `retry_after` is when the breaker will next admit a call: the rest of the open duration
/// when open; when half-open with all probes busy or isolated, the configured (first) open
/// duration, as a hint — the real answer depends on the probes or on a person.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("circuit breaker {reason:?}: retry after {retry_after:?}")]
pub struct BreakerOpen {
    /// How long until the breaker may admit a call.
    pub retry_after: Duration,
    /// Why the call was rejected.
    pub reason: Rejection,
}
