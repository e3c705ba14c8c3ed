//! Permits: one admitted call each, recorded or abandoned.

use std::sync::Arc;
use std::time::Duration;

use super::events::BreakerObserver;
use super::state::CircuitBreaker;
use crate::classify::Outcome;

/// What a permit remembers: whether it is a probe, and of which half-open period.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ticket {
    pub(super) probe: bool,
    pub(super) epoch: u64,
}

/// Permission to make one call; record its outcome with [`Permit::record`].
///
/// Dropping a permit without recording *abandons* the call: nothing is recorded, and a probe
/// slot is returned (see the [module documentation](super#permits)).
#[derive(Debug)]
#[must_use = "record the call's outcome with Permit::record"]
pub struct Permit<'a, O: BreakerObserver = ()> {
    pub(super) breaker: &'a CircuitBreaker<O>,
    pub(super) ticket: Ticket,
    pub(super) done: bool,
}

impl<O: BreakerObserver> Permit<'_, O> {
    /// Records the call's outcome and how long it took.
    #[inline]
    pub fn record(mut self, outcome: Outcome, elapsed: Duration) {
        self.done = true;
        self.breaker.record(self.ticket, outcome, elapsed);
    }

    /// Whether this call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.ticket.probe
    }
}

impl<O: BreakerObserver> Drop for Permit<'_, O> {
    #[inline]
    fn drop(&mut self) {
        if !self.done {
            self.breaker.abandon(self.ticket);
        }
    }
}

/// A [`Permit`] that owns a reference to its breaker: from
/// [`CircuitBreaker::try_acquire_owned`]. Same rules: record the outcome, or drop it to
/// abandon the call.
#[derive(Debug)]
#[must_use = "record the call's outcome with OwnedPermit::record"]
pub struct OwnedPermit<O: BreakerObserver = ()> {
    pub(super) breaker: Arc<CircuitBreaker<O>>,
    pub(super) ticket: Ticket,
    pub(super) done: bool,
}

impl<O: BreakerObserver> OwnedPermit<O> {
    /// Records the call's outcome and how long it took.
    #[inline]
    pub fn record(mut self, outcome: Outcome, elapsed: Duration) {
        self.done = true;
        self.breaker.record(self.ticket, outcome, elapsed);
    }

    /// Whether this call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.ticket.probe
    }

    /// The breaker this permit belongs to.
    pub fn breaker(&self) -> &Arc<CircuitBreaker<O>> {
        &self.breaker
    }
}

impl<O: BreakerObserver> Drop for OwnedPermit<O> {
    #[inline]
    fn drop(&mut self) {
        if !self.done {
            self.breaker.abandon(self.ticket);
        }
    }
}
