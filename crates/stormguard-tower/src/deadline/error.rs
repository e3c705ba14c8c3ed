//! Errors of the deadline layers: configuration that cannot work, and a call not sent because
//! too little time was left for it.

use std::time::Duration;

use super::headers::DeadlineHeader;

/// A deadline layer configuration that cannot work, found by `validate` (or by
/// [`DeadlineHeaders::new`](super::DeadlineHeaders::new)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidDeadlineConfig {
    /// The header list is empty: nothing would be read or written.
    #[error("the deadline header list is empty: list at least one header")]
    NoHeaders,
    /// A header is listed twice.
    #[error("the deadline header list names {0} twice")]
    RepeatedHeader(DeadlineHeader),
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
    /// The hop reserve keeps all of any remaining time, so nothing would ever be sent
    /// downstream.
    #[error("the hop reserve keeps all the remaining time: no call would ever be sent")]
    ReserveKeepsEverything,
}

/// A downstream call that was not sent: after the hop reserve, the time left was below the
/// minimum useful call time (or nothing was left at all).
///
/// [`PropagateDeadline`](super::PropagateDeadline) returns it boxed, as tower middleware does;
/// find it by downcasting the error (or, through tonic, the `Status`'s source).
///
/// ```
/// use std::time::Duration;
/// use stormguard_tower::deadline::DeadlineTooClose;
///
/// let err = DeadlineTooClose { remaining: Duration::from_millis(3), min_call: Duration::from_millis(20) };
/// assert_eq!(
///     err.to_string(),
///     "call not sent: 3ms left for downstream after the hop reserve, below the minimum useful call time of 20ms"
/// );
/// let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(err);
/// assert!(boxed.downcast_ref::<DeadlineTooClose>().is_some());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "call not sent: {remaining:?} left for downstream after the hop reserve, below the minimum useful call time of {min_call:?}"
)]
pub struct DeadlineTooClose {
    /// Time that was left for the downstream call.
    pub remaining: Duration,
    /// The configured minimum useful call time.
    pub min_call: Duration,
}
