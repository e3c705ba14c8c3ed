//! What the breaker reports: state changes and rejections, to a [`BreakerObserver`].

use std::sync::Arc;
use std::time::Duration;

use super::error::BreakerOpen;
use super::state::BreakerState;
use crate::health::HealthCounts;

/// Why the state changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The window's failure ratio crossed its threshold.
    FailureRatio,
    /// The window's slow-call ratio crossed its threshold.
    SlowCallRatio,
    /// The open duration passed and a call arrived.
    OpenElapsed,
    /// A half-open probe failed or was slow.
    ProbeFailed,
    /// All half-open probes succeeded.
    ProbesSucceeded,
    /// [`CircuitBreaker::isolate`](super::CircuitBreaker::isolate).
    Isolated,
    /// [`CircuitBreaker::reset`](super::CircuitBreaker::reset).
    Reset,
}

/// A state change event.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StateChange {
    /// The state before.
    pub from: BreakerState,
    /// The state after.
    pub to: BreakerState,
    /// Why.
    pub cause: Cause,
    /// When `to` is [`BreakerState::Open`]: for how long.
    pub open_for: Option<Duration>,
    /// The window's totals that opened the breaker (for [`Cause::FailureRatio`] and
    /// [`Cause::SlowCallRatio`]).
    pub counts: Option<HealthCounts>,
}

/// Receives breaker events; every method defaults to doing nothing.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use stormguard::breaker::{BreakerObserver, BreakerState, StateChange};
///
/// #[derive(Default)]
/// struct CountOpens(AtomicU32);
/// impl BreakerObserver for CountOpens {
///     fn state_changed(&self, change: &StateChange) {
///         if change.to == BreakerState::Open {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait BreakerObserver: Send + Sync {
    /// The state changed.
    fn state_changed(&self, change: &StateChange) {
        let _ = change;
    }

    /// A call was rejected.
    fn call_rejected(&self, rejected: &BreakerOpen) {
        let _ = rejected;
    }
}

impl BreakerObserver for () {}

impl<O: BreakerObserver + ?Sized> BreakerObserver for Arc<O> {
    fn state_changed(&self, change: &StateChange) {
        (**self).state_changed(change)
    }
    fn call_rejected(&self, rejected: &BreakerOpen) {
        (**self).call_rejected(rejected)
    }
}
