//! Hooks that see every hedged attempt, for logs, metrics and tests.

use crate::classify::Outcome;

/// Why a hedged call stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HedgeStop {
    /// An attempt succeeded; the others were cancelled.
    Succeeded,
    /// An attempt ended with a fatal result (classified [`Outcome::NeverRetry`]): A6 commits
    /// to it and cancels the others.
    Fatal,
    /// Every attempt sent failed non-fatally and no more could be sent.
    AllFailed,
    /// The deadline passed; every attempt in flight was cancelled.
    DeadlineExceeded,
    /// The caller dropped the call (reported to the observer only).
    Cancelled,
}

impl HedgeStop {
    /// A short label for logs and metrics (`"succeeded"`, `"fatal"`, `"all_failed"`,
    /// `"deadline_exceeded"`, `"cancelled"`).
    pub const fn label(&self) -> &'static str {
        match self {
            HedgeStop::Succeeded => "succeeded",
            HedgeStop::Fatal => "fatal",
            HedgeStop::AllFailed => "all_failed",
            HedgeStop::DeadlineExceeded => "deadline_exceeded",
            HedgeStop::Cancelled => "cancelled",
        }
    }
}

/// Why no more hedges are sent although the policy would allow more attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HedgingStopped {
    /// The retry budget refused a hedge.
    Budget,
    /// The deadline leaves less than the policy's minimum call time.
    DeadlineTooClose,
    /// The server's pushback said not to retry.
    Pushback,
}

impl HedgingStopped {
    /// A short label for logs and metrics (`"budget"`, `"deadline_too_close"`, `"pushback"`).
    pub const fn label(&self) -> &'static str {
        match self {
            HedgingStopped::Budget => "budget",
            HedgingStopped::DeadlineTooClose => "deadline_too_close",
            HedgingStopped::Pushback => "pushback",
        }
    }
}

/// Receives a hedger's events. Every method has an empty default, and the hedger's default
/// observer is `()`, whose calls compile to nothing.
///
/// Attempt numbers start at 1 (the original request); 2 and up are hedges.
///
/// # Example
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use stormguard::hedge::HedgeObserver;
///
/// /// Counts hedges that were sent and then cancelled: the extra load hedging cost.
/// #[derive(Default)]
/// struct Wasted(AtomicU32);
///
/// impl HedgeObserver for Wasted {
///     fn attempt_cancelled(&self, _attempt: u32) {
///         self.0.fetch_add(1, Ordering::Relaxed);
///     }
/// }
/// ```
pub trait HedgeObserver: Send + Sync {
    /// Attempt `attempt` was sent.
    fn attempt_sent(&self, attempt: u32) {
        let _ = attempt;
    }

    /// Attempt `attempt` ended with `outcome`.
    fn attempt_ended(&self, attempt: u32, outcome: &Outcome) {
        let _ = (attempt, outcome);
    }

    /// Attempt `attempt` was still in flight when the call ended, and was dropped.
    fn attempt_cancelled(&self, attempt: u32) {
        let _ = attempt;
    }

    /// No hedge after the `sent` attempts already sent, for `why`.
    fn hedging_stopped(&self, sent: u32, why: HedgingStopped) {
        let _ = (sent, why);
    }

    /// The call ended after `sent` attempts; `winner` is the attempt whose result was
    /// returned (`None` at the deadline or on cancellation).
    fn finished(&self, sent: u32, winner: Option<u32>, stop: HedgeStop) {
        let _ = (sent, winner, stop);
    }
}

impl HedgeObserver for () {}

impl<O: HedgeObserver + ?Sized> HedgeObserver for std::sync::Arc<O> {
    fn attempt_sent(&self, attempt: u32) {
        (**self).attempt_sent(attempt)
    }
    fn attempt_ended(&self, attempt: u32, outcome: &Outcome) {
        (**self).attempt_ended(attempt, outcome)
    }
    fn attempt_cancelled(&self, attempt: u32) {
        (**self).attempt_cancelled(attempt)
    }
    fn hedging_stopped(&self, sent: u32, why: HedgingStopped) {
        (**self).hedging_stopped(sent, why)
    }
    fn finished(&self, sent: u32, winner: Option<u32>, stop: HedgeStop) {
        (**self).finished(sent, winner, stop)
    }
}
