//! A deadline layer configuration that cannot work.
//!
//! The other errors of the deadline layers belong to the core, because every layer and the
//! retrier must recognise them by type: a call not sent for lack of time is
//! [`stormguard::admission::DeadlineTooClose`] (a refusal: no retrier retries it, no breaker
//! counts it), and a header list that cannot be used is
//! [`stormguard::deadline::InvalidHeaderList`].

use std::time::Duration;

/// A deadline layer configuration that cannot work, found by `validate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidDeadlineConfig {
    /// The server maximum is zero, so every request would be refused as expired.
    #[error("the server's maximum deadline is zero: every request would be refused")]
    ZeroMax,
    /// The server default is zero, so every request without a deadline header would be
    /// refused as expired.
    #[error(
        "the server's default deadline is zero: every request without a deadline header would be refused"
    )]
    ZeroDefault,
    /// The server default is longer than the server maximum, which always caps it.
    #[error("the server's default deadline ({default:?}) exceeds its maximum ({max:?})")]
    DefaultAboveMax {
        /// The default deadline.
        default: Duration,
        /// The maximum deadline.
        max: Duration,
    },
    /// The server maximum is below the least time a request must have left to be run, so
    /// every request would be refused as expired.
    #[error(
        "the server's maximum deadline ({max:?}) is below its minimum time left ({min_remaining:?}): every request would be refused"
    )]
    MaxBelowMinRemaining {
        /// The maximum deadline.
        max: Duration,
        /// The minimum time left.
        min_remaining: Duration,
    },
    /// The server default is below the least time a request must have left to be run, so
    /// every request without a deadline header would be refused as expired.
    #[error(
        "the server's default deadline ({default:?}) is below its minimum time left ({min_remaining:?}): every request without a deadline header would be refused"
    )]
    DefaultBelowMinRemaining {
        /// The default deadline.
        default: Duration,
        /// The minimum time left.
        min_remaining: Duration,
    },
    /// The hop reserve keeps all of any remaining time, so nothing would ever be sent
    /// downstream.
    #[error("the hop reserve keeps all the remaining time: no call would ever be sent")]
    ReserveKeepsEverything,
}
