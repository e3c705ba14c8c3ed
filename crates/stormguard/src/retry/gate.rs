//! What admits each attempt: nothing, or a circuit breaker.
//!
//! A retrier that keeps retrying into a downstream its breaker has given up on is the worst
//! of both: the breaker fails fresh calls fast while the retries of older calls still pile
//! on. With [`Retrier::with_breaker`](super::Retrier::with_breaker) every attempt — the first
//! and each retry — asks the breaker for a permit before it is sent, and records its outcome
//! and elapsed time in the breaker's window after.
//!
//! # How attempts are counted
//!
//! Each attempt is one call in the window, exactly as if the caller had made it without a
//! retrier: a request that fails three times is three failed calls, because the downstream
//! saw three requests. Retries add to the calls as well as to the failures, so a retry storm
//! cannot push the failure *ratio* above what the downstream produces; it only reaches the
//! breaker's minimum throughput sooner. An attempt the breaker rejects was not sent: it is
//! not recorded, and the retrier stops at once with
//! [`StopReason::BreakerOpen`](super::StopReason::BreakerOpen). An attempt abandoned because
//! the caller dropped the call is not recorded either (see
//! [`Permit`](crate::breaker::Permit)); one cut by the per-try timeout is recorded as
//! [`Outcome::InDoubt`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::breaker::{BreakerObserver, BreakerOpen, CircuitBreaker, Permit};
use crate::classify::Outcome;
use crate::clock::Clock;

/// Admits each attempt of a [`Retrier`](super::Retrier), or rejects it.
///
/// Implemented by [`NoGate`] (the default: admits everything and costs nothing) and by
/// `Arc<`[`CircuitBreaker`]`>`.
pub trait AttemptGate: Send + Sync {
    /// What an admitted attempt carries until it ends.
    type Pass<'a>: AttemptPass
    where
        Self: 'a;

    /// Admits one attempt, or says why not.
    fn admit(&self) -> Result<Self::Pass<'_>, BreakerOpen>;
}

/// An admitted attempt: [`finish`](AttemptPass::finish) it with its outcome, or drop it if
/// the attempt was abandoned.
pub trait AttemptPass {
    /// The attempt ended with `outcome`.
    fn finish(self, outcome: Outcome);
}

/// Admits every attempt; the retrier's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoGate;

impl AttemptGate for NoGate {
    type Pass<'a> = ();

    #[inline]
    fn admit(&self) -> Result<(), BreakerOpen> {
        Ok(())
    }
}

impl AttemptPass for () {
    #[inline]
    fn finish(self, _: Outcome) {}
}

impl<O: BreakerObserver> AttemptGate for Arc<CircuitBreaker<O>> {
    type Pass<'a>
        = BreakerPass<'a, O>
    where
        O: 'a;

    #[inline]
    fn admit(&self) -> Result<BreakerPass<'_, O>, BreakerOpen> {
        let permit = self.try_acquire()?;
        let clock = self.window().clock();
        Ok(BreakerPass {
            permit,
            clock,
            started: clock.now(),
        })
    }
}

/// An attempt admitted by a circuit breaker: its permit and when it started.
#[derive(Debug)]
pub struct BreakerPass<'a, O: BreakerObserver> {
    permit: Permit<'a, O>,
    clock: &'a Clock,
    started: Instant,
}

impl<O: BreakerObserver> AttemptPass for BreakerPass<'_, O> {
    #[inline]
    fn finish(self, outcome: Outcome) {
        let elapsed = self
            .clock
            .now()
            .checked_duration_since(self.started)
            .unwrap_or(Duration::ZERO);
        self.permit.record(outcome, elapsed);
    }
}
