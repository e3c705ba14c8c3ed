//! What a retrier returns when it gives up.

use std::fmt;
use std::time::Duration;

use super::decide::StopReason;
use crate::admission::Refusal;

/// How the last attempt failed.
#[derive(Debug)]
pub enum Failure<E> {
    /// The operation returned this error.
    Error(E),
    /// The attempt was cut by its per-attempt timeout, after this long.
    TimedOut(Duration),
    /// The attempt was not sent: a gate refused it (the call stopped with the refusal's
    /// [`stop_reason`](Refusal::stop_reason)).
    Refused(Refusal),
}

impl<E: fmt::Display> fmt::Display for Failure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Error(e) => e.fmt(f),
            Failure::TimedOut(after) => write!(f, "attempt timed out after {after:?}"),
            Failure::Refused(refusal) => write!(f, "attempt not sent: {refusal}"),
        }
    }
}

/// The retrier gave up: why, after how many attempts, and the last failure.
///
/// # Example
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use stormguard::classify::Outcome;
/// use stormguard::retry::{Failure, Retrier, RetryPolicy, StopReason};
///
/// let retrier = Retrier::new(RetryPolicy::new(3)).unwrap();
/// let err = retrier
///     .run(|_| async { Err::<(), _>("404 not found") }, |_: &Result<(), &str>| Outcome::NeverRetry)
///     .await
///     .unwrap_err();
/// assert_eq!(err.reason(), StopReason::NeverRetry);
/// assert_eq!(err.attempts(), 1);
/// assert!(matches!(err.last(), Failure::Error("404 not found")));
/// # }
/// ```
#[derive(Debug)]
pub struct RetryError<E> {
    pub(super) reason: StopReason,
    pub(super) attempts: u32,
    pub(super) last: Failure<E>,
}

impl<E> RetryError<E> {
    /// Why the retrier stopped.
    pub fn reason(&self) -> StopReason {
        self.reason
    }

    /// Attempts sent, the first included (0 when a gate refused the first).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The last attempt's failure.
    pub fn last(&self) -> &Failure<E> {
        &self.last
    }

    /// The last attempt's failure, by value.
    pub fn into_last(self) -> Failure<E> {
        self.last
    }
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gave up after {} attempt{} ({}): {}",
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.reason.label(),
            self.last
        )
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RetryError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.last {
            Failure::Error(e) => Some(e),
            Failure::TimedOut(_) => None,
            Failure::Refused(refusal) => Some(refusal),
        }
    }
}
