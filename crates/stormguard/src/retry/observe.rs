//! Hooks that see every attempt, for logs, metrics and traces.

use std::time::Duration;

use super::decide::{AttemptOutcome, RetryReason, StopReason};

/// Receives the retrier's events. Every method has an empty default, and the retrier's
/// default observer is `()`, whose calls compile to nothing: hooks cost nothing when unused.
///
/// The retrier reads no clock for its hooks; an observer that wants timings reads its own
/// clock in [`attempt_started`](RetryObserver::attempt_started) and
/// [`attempt_ended`](RetryObserver::attempt_ended).
///
/// # Example
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use stormguard::retry::{RetryObserver, StopReason};
///
/// #[derive(Default)]
/// struct GiveUps(AtomicU32);
///
/// impl RetryObserver for GiveUps {
///     fn gave_up(&self, _attempts: u32, _reason: StopReason) {
///         self.0.fetch_add(1, Ordering::Relaxed);
///     }
/// }
/// ```
pub trait RetryObserver: Send + Sync {
    /// Attempt number `attempt` (1 for the first) is about to be sent.
    fn attempt_started(&self, attempt: u32) {
        let _ = attempt;
    }

    /// Attempt number `attempt` ended.
    fn attempt_ended(&self, attempt: u32, ended: &AttemptOutcome) {
        let _ = (attempt, ended);
    }

    /// Attempt number `next_attempt` will be sent after `delay`.
    fn retry_scheduled(&self, next_attempt: u32, delay: Duration, reason: RetryReason) {
        let _ = (next_attempt, delay, reason);
    }

    /// The call stopped without success after `attempts` attempts.
    fn gave_up(&self, attempts: u32, reason: StopReason) {
        let _ = (attempts, reason);
    }
}

impl RetryObserver for () {}

impl<O: RetryObserver + ?Sized> RetryObserver for std::sync::Arc<O> {
    fn attempt_started(&self, attempt: u32) {
        (**self).attempt_started(attempt)
    }
    fn attempt_ended(&self, attempt: u32, ended: &AttemptOutcome) {
        (**self).attempt_ended(attempt, ended)
    }
    fn retry_scheduled(&self, next_attempt: u32, delay: Duration, reason: RetryReason) {
        (**self).retry_scheduled(next_attempt, delay, reason)
    }
    fn gave_up(&self, attempts: u32, reason: StopReason) {
        (**self).gave_up(attempts, reason)
    }
}
