//! What the [`Retry`](super::Retry) service returns when no response came back.

use std::time::Duration;

use stormguard::admission::Refusal;
use stormguard::retry::StopReason;

use super::BoxError;

/// The [`Retry`](super::Retry) service's error: no response to hand back.
///
/// A failure *response* (a 503 after the last attempt) is not an error: it is returned as
/// the response, as tower's retry does. Inspect the cause chain with
/// [`std::error::Error::source`], by type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The inner service failed before any request was sent (`poll_ready`).
    #[error("the inner service is not ready")]
    NotReady(#[source] BoxError),
    /// Reading the request body (to replay it) failed; nothing was sent.
    #[error("reading the request body failed")]
    RequestBody(#[source] BoxError),
    /// The last attempt failed with a transport error (or its gRPC response body could not
    /// be read).
    #[error("request failed after {attempts} attempt(s) ({})", stop.label())]
    Transport {
        /// Attempts sent, the first included.
        attempts: u32,
        /// Why the layer stopped retrying.
        stop: StopReason,
        /// The inner service's error.
        source: BoxError,
    },
    /// The last attempt was cut by its per-try timeout (or the deadline's remaining time).
    #[error("attempt {attempts} timed out after {after:?} ({})", stop.label())]
    TimedOut {
        /// Attempts sent, the first included.
        attempts: u32,
        /// Why the layer stopped retrying.
        stop: StopReason,
        /// The time the last attempt was allowed.
        after: Duration,
    },
    /// An attempt was refused before it was sent (an open breaker, the throttle, the
    /// deadline); when `attempts` is 0, nothing was sent at all.
    #[error("call refused after {attempts} attempt(s)")]
    Refused {
        /// Attempts sent before the refusal.
        attempts: u32,
        /// The refusal.
        source: Refusal,
    },
}

impl Error {
    /// Attempts sent, the first included (0 when nothing was sent).
    pub fn attempts(&self) -> u32 {
        match self {
            Error::NotReady(_) | Error::RequestBody(_) => 0,
            Error::Transport { attempts, .. }
            | Error::TimedOut { attempts, .. }
            | Error::Refused { attempts, .. } => *attempts,
        }
    }

    /// Why the layer stopped, when it sent anything.
    pub fn stop(&self) -> Option<StopReason> {
        match self {
            Error::NotReady(_) | Error::RequestBody(_) => None,
            Error::Transport { stop, .. } | Error::TimedOut { stop, .. } => Some(*stop),
            Error::Refused { source, .. } => Some(source.stop_reason()),
        }
    }

    /// Whether the layer retried and gave up (or was refused a retry by its budget or
    /// deadline): the rule by which it marks a failure response `X-Retry-Exhausted: true`
    /// (see the [module docs](super#when-a-response-is-marked)). A handler that turns this
    /// error into a response should then [`mark_exhausted`](super::mark_exhausted) it, so no
    /// layer upstream retries again.
    pub fn is_exhausted(&self) -> bool {
        self.stop()
            .is_some_and(|stop| super::marks_exhausted(stop, self.attempts()))
    }

    /// Whether the last attempt timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::TimedOut { .. })
    }
}

/// A request body over the replay limit was already sent; it cannot be sent again.
///
/// The layer never retries such a request, so this is not expected to surface; it exists
/// so that a broken invariant is an error, not a panic.
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("the request body was over the replay limit and has been sent already")]
pub(crate) struct BodyNotReplayable;
