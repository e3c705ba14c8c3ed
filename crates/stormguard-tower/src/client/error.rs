//! What the client stack returns when no response came back.

use std::time::Duration;

use stormguard::admission::Refusal;
use stormguard::retry::StopReason;

use crate::wire::BoxError;

/// The client stack's error: no response to hand back.
///
/// A failure *response* (a 503 after the last attempt) is not an error: it is returned as the
/// response, as tower's retry does, marked `X-Retry-Exhausted: true` when the stack gave up
/// on it. Inspect the cause chain with [`std::error::Error::source`], by type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The inner service failed before any request was sent (`poll_ready`).
    #[error("the inner service is not ready")]
    NotReady(#[source] BoxError),
    /// Reading the request body failed; nothing was sent.
    #[error("reading the request body failed")]
    RequestBody(#[source] BoxError),
    /// The last attempt failed with a transport error (or its gRPC response body could not
    /// be read).
    #[error("request failed after {attempts} attempt(s) ({})", stop.label())]
    Transport {
        /// Attempts sent, the first included.
        attempts: u32,
        /// Why the stack stopped.
        stop: StopReason,
        /// The inner service's error.
        source: BoxError,
    },
    /// The last attempt was cut by its per-try timeout or the deadline.
    #[error("attempt {attempts} timed out after {after:?} ({})", stop.label())]
    TimedOut {
        /// Attempts sent, the first included.
        attempts: u32,
        /// Why the stack stopped.
        stop: StopReason,
        /// The time the last attempt was allowed.
        after: Duration,
    },
    /// The call, or one of its retries, was refused before it was sent: an open breaker,
    /// the throttle, too little time left; when `attempts` is 0, nothing was sent at all.
    #[error("call refused after {attempts} attempt(s): {source}")]
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

    /// Why the stack stopped, when it got as far as deciding.
    pub fn stop(&self) -> Option<StopReason> {
        match self {
            Error::NotReady(_) | Error::RequestBody(_) => None,
            Error::Transport { stop, .. } | Error::TimedOut { stop, .. } => Some(*stop),
            Error::Refused { source, .. } => Some(source.stop_reason()),
        }
    }

    /// The refusal, when the call was refused.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Error::Refused { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Whether this failure must not be retried by anyone upstream: the stack retried and
    /// gave up, or a budget, breaker, throttle or the deadline refused (the rule by which it
    /// marks a failure response `X-Retry-Exhausted: true`, see
    /// [`marks_exhausted`](super::marks_exhausted)). A handler that turns this error into a
    /// response should then [`mark_exhausted`](crate::wire::mark_exhausted) it.
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
/// The stack never retries such a request, so this is not expected to surface; it exists so
/// that a broken invariant is an error, not a panic.
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("the request body was over the replay limit and has been sent already")]
pub(crate) struct BodyNotReplayable;
