//! Whether a call may be sent at all: circuit breakers, the adaptive throttle, and the
//! refusals they (and the deadline) answer with.
//!
//! # Why refusals are not failures
//!
//! A retrier that treats "the breaker is open" like a timeout retries straight back into the
//! open breaker, waits its backoff between refusals, and charges each to the retry budget:
//! exactly the load-shaped behaviour the breaker exists to stop. A call the breaker, the
//! throttle or the deadline refused was never sent; the downstream said nothing about it. So
//! a [`Refusal`] is its own thing: it stops a retry loop at once (the stop reason says which
//! refused), it is not recorded in the budget or in any health window, and a hop that gives up
//! because of one marks its answer exhausted so that nobody upstream retries instead.
//!
//! # Gates
//!
//! [`AttemptGate`] admits each attempt of a retrier or a tower stack, or refuses it:
//! [`NoGate`] admits everything and costs nothing, `Arc<`[`CircuitBreaker`]`>` asks the
//! breaker for a permit and records the attempt's outcome and elapsed time in its window,
//! `Arc<`[`AdaptiveThrottle`]`>` counts the request and draws against the backend's refusal
//! rate, and a pair `(A, B)` asks both (the first one first).
//!
//! # How attempts are counted
//!
//! Each attempt is one call in a breaker's window, exactly as if the caller had made it
//! without a retrier: a request that fails three times is three failed calls, because the
//! downstream saw three requests. Retries add to the calls as well as to the failures, so a
//! retry storm cannot push the failure *ratio* above what the downstream produces; it only
//! reaches the breaker's minimum throughput sooner. An attempt a gate refuses was not sent: it
//! is not recorded. An attempt abandoned because the caller dropped the call is not recorded
//! either (see [`Permit`]); one cut by its per-try timeout is recorded as
//! [`Outcome::InDoubt`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::breaker::{BreakerObserver, BreakerOpen, CircuitBreaker, OwnedPermit, Permit};
use crate::classify::Outcome;
use crate::clock::Clock;
use crate::retry::StopReason;
use crate::throttle::{AdaptiveThrottle, Throttled};

/// A call that was not sent: a gate or the deadline refused it.
///
/// ```
/// use std::time::Duration;
/// use stormguard::admission::{DeadlineTooClose, Refusal};
/// use stormguard::retry::StopReason;
///
/// let refusal = Refusal::from(DeadlineTooClose { remaining: Duration::ZERO, min_call: Duration::ZERO });
/// assert_eq!(refusal.stop_reason(), StopReason::DeadlineTooClose);
/// assert_eq!(refusal.to_string(), "call not sent: the deadline has passed");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The circuit breaker is open (or half-open with every probe in flight).
    #[error(transparent)]
    BreakerOpen(#[from] BreakerOpen),
    /// The adaptive throttle rejected the call locally.
    #[error(transparent)]
    Throttled(#[from] Throttled),
    /// Too little of the deadline was left for the call to be useful.
    #[error(transparent)]
    DeadlineTooClose(#[from] DeadlineTooClose),
}

impl Refusal {
    /// Why a retry loop stops on this refusal.
    pub const fn stop_reason(&self) -> StopReason {
        match self {
            Refusal::BreakerOpen(_) => StopReason::BreakerOpen,
            Refusal::Throttled(_) => StopReason::Throttled,
            Refusal::DeadlineTooClose(_) => StopReason::DeadlineTooClose,
        }
    }

    /// When asking again may be admitted, if the refusing side knows (an open breaker's
    /// remaining open time).
    pub const fn retry_after(&self) -> Option<Duration> {
        match self {
            Refusal::BreakerOpen(open) => Some(open.retry_after),
            Refusal::Throttled(_) | Refusal::DeadlineTooClose(_) => None,
        }
    }

    /// A short label for logs and metrics: `circuit_open`, `throttled`, `deadline_too_close`.
    pub const fn label(&self) -> &'static str {
        match self {
            Refusal::BreakerOpen(_) => "circuit_open",
            Refusal::Throttled(_) => "throttled",
            Refusal::DeadlineTooClose(_) => "deadline_too_close",
        }
    }
}

/// A downstream call that was not sent: after the hop reserve, the time left was below the
/// minimum useful call time, or nothing was left at all.
///
/// ```
/// use std::time::Duration;
/// use stormguard::admission::DeadlineTooClose;
///
/// let err = DeadlineTooClose { remaining: Duration::from_millis(3), min_call: Duration::from_millis(20) };
/// assert_eq!(
///     err.to_string(),
///     "call not sent: 3ms left for downstream after the hop reserve, below the minimum useful call time of 20ms"
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe_too_close(*remaining, *min_call))]
pub struct DeadlineTooClose {
    /// Time that was left for the downstream call.
    pub remaining: Duration,
    /// The configured minimum useful call time.
    pub min_call: Duration,
}

fn describe_too_close(remaining: Duration, min_call: Duration) -> String {
    if remaining.is_zero() {
        "call not sent: the deadline has passed".to_owned()
    } else {
        format!(
            "call not sent: {remaining:?} left for downstream after the hop reserve, below the minimum useful call time of {min_call:?}"
        )
    }
}

/// Admits each attempt, or refuses it.
///
/// Implemented by [`NoGate`] (admits everything and costs nothing), by
/// `Arc<`[`CircuitBreaker`]`>`, by `Arc<`[`AdaptiveThrottle`]`>` and by a pair of gates.
///
/// A pass comes in two kinds, as tokio's semaphore permits do: [`admit`](Self::admit) lends
/// one that borrows the gate (free: what a retrier holding the gate uses), and
/// [`admit_owned`](Self::admit_owned) one that owns what it needs (a reference count), for a
/// future that must not borrow, such as a tower layer's response future.
pub trait AttemptGate: Send + Sync {
    /// What an admitted attempt carries until it ends.
    type Pass<'a>: AttemptPass
    where
        Self: 'a;

    /// What an attempt admitted by [`admit_owned`](Self::admit_owned) carries.
    type OwnedPass: AttemptPass + Send;

    /// Admits one attempt, or says why not.
    fn admit(&self) -> Result<Self::Pass<'_>, Refusal>;

    /// Admits one attempt with a pass that does not borrow the gate, or says why not.
    fn admit_owned(&self) -> Result<Self::OwnedPass, Refusal>;
}

/// An admitted attempt: [`finish`](AttemptPass::finish) it with its outcome, or drop it if
/// the attempt was abandoned (nothing is recorded then).
pub trait AttemptPass {
    /// The attempt ended with `outcome`.
    fn finish(self, outcome: Outcome);
}

/// Admits every attempt; the default gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoGate;

impl AttemptGate for NoGate {
    type Pass<'a> = ();
    type OwnedPass = ();

    #[inline]
    fn admit(&self) -> Result<(), Refusal> {
        Ok(())
    }

    #[inline]
    fn admit_owned(&self) -> Result<(), Refusal> {
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

    type OwnedPass = OwnedBreakerPass<O>;

    #[inline]
    fn admit(&self) -> Result<BreakerPass<'_, O>, Refusal> {
        let permit = self.try_acquire()?;
        let clock = self.window().clock();
        Ok(BreakerPass {
            permit,
            clock,
            started: clock.now(),
        })
    }

    #[inline]
    fn admit_owned(&self) -> Result<OwnedBreakerPass<O>, Refusal> {
        let permit = self.try_acquire_owned()?;
        let started = self.window().clock().now();
        Ok(OwnedBreakerPass { permit, started })
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

impl AttemptGate for Arc<AdaptiveThrottle> {
    type Pass<'a> = ThrottlePass<'a>;
    type OwnedPass = OwnedThrottlePass;

    #[inline]
    fn admit(&self) -> Result<ThrottlePass<'_>, Refusal> {
        self.try_acquire()?;
        Ok(ThrottlePass { throttle: self })
    }

    #[inline]
    fn admit_owned(&self) -> Result<OwnedThrottlePass, Refusal> {
        self.try_acquire()?;
        Ok(OwnedThrottlePass {
            throttle: Arc::clone(self),
        })
    }
}

/// A request the adaptive throttle let through; its outcome tells the throttle whether the
/// backend accepted it.
#[derive(Debug)]
pub struct ThrottlePass<'a> {
    throttle: &'a AdaptiveThrottle,
}

impl AttemptPass for ThrottlePass<'_> {
    #[inline]
    fn finish(self, outcome: Outcome) {
        self.throttle.record(outcome);
    }
}

/// An attempt admitted by a circuit breaker, owning its permit (see
/// [`AttemptGate::admit_owned`]).
#[derive(Debug)]
pub struct OwnedBreakerPass<O: BreakerObserver> {
    permit: OwnedPermit<O>,
    started: Instant,
}

impl<O: BreakerObserver> AttemptPass for OwnedBreakerPass<O> {
    #[inline]
    fn finish(self, outcome: Outcome) {
        let elapsed = self
            .permit
            .breaker()
            .window()
            .clock()
            .now()
            .checked_duration_since(self.started)
            .unwrap_or(Duration::ZERO);
        self.permit.record(outcome, elapsed);
    }
}

/// A request the adaptive throttle let through, owning a reference to the throttle (see
/// [`AttemptGate::admit_owned`]).
#[derive(Debug)]
pub struct OwnedThrottlePass {
    throttle: Arc<AdaptiveThrottle>,
}

impl AttemptPass for OwnedThrottlePass {
    #[inline]
    fn finish(self, outcome: Outcome) {
        self.throttle.record(outcome);
    }
}

impl<A: AttemptGate, B: AttemptGate> AttemptGate for (A, B) {
    type Pass<'a>
        = (A::Pass<'a>, B::Pass<'a>)
    where
        Self: 'a;

    type OwnedPass = (A::OwnedPass, B::OwnedPass);

    #[inline]
    fn admit(&self) -> Result<Self::Pass<'_>, Refusal> {
        let first = self.0.admit()?;
        // A refusal by the second leaves the first's pass unfinished: dropped, not recorded.
        let second = self.1.admit()?;
        Ok((first, second))
    }

    #[inline]
    fn admit_owned(&self) -> Result<Self::OwnedPass, Refusal> {
        let first = self.0.admit_owned()?;
        let second = self.1.admit_owned()?;
        Ok((first, second))
    }
}

impl<A: AttemptPass, B: AttemptPass> AttemptPass for (A, B) {
    #[inline]
    fn finish(self, outcome: Outcome) {
        self.0.finish(outcome);
        self.1.finish(outcome);
    }
}

impl<G: AttemptGate> AttemptGate for Option<G> {
    type Pass<'a>
        = Option<G::Pass<'a>>
    where
        Self: 'a;

    type OwnedPass = Option<G::OwnedPass>;

    #[inline]
    fn admit(&self) -> Result<Self::Pass<'_>, Refusal> {
        match self {
            Some(gate) => gate.admit().map(Some),
            None => Ok(None),
        }
    }

    #[inline]
    fn admit_owned(&self) -> Result<Self::OwnedPass, Refusal> {
        match self {
            Some(gate) => gate.admit_owned().map(Some),
            None => Ok(None),
        }
    }
}

impl<P: AttemptPass> AttemptPass for Option<P> {
    #[inline]
    fn finish(self, outcome: Outcome) {
        if let Some(pass) = self {
            pass.finish(outcome);
        }
    }
}

impl<G: AttemptGate + ?Sized> AttemptGate for &G {
    type Pass<'a>
        = G::Pass<'a>
    where
        Self: 'a;

    type OwnedPass = G::OwnedPass;

    #[inline]
    fn admit(&self) -> Result<Self::Pass<'_>, Refusal> {
        (**self).admit()
    }

    #[inline]
    fn admit_owned(&self) -> Result<Self::OwnedPass, Refusal> {
        (**self).admit_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::BreakerConfig;
    use crate::clock::ManualClock;
    use crate::health::HealthConfig;
    use crate::throttle::ThrottleConfig;

    #[test]
    fn a_pair_asks_both_and_records_in_both() {
        let clock = ManualClock::new();
        let config = BreakerConfig::new(HealthConfig::count(4)).with_minimum_throughput(4);
        let breaker = Arc::new(CircuitBreaker::new(config, clock.clock()).expect("valid"));
        let throttle = Arc::new(
            AdaptiveThrottle::new(ThrottleConfig::sre_default(), clock.clock())
                .expect("valid")
                .with_seed(1),
        );
        let gate = (Arc::clone(&breaker), Arc::clone(&throttle));
        for _ in 0..4 {
            gate.admit().expect("closed").finish(Outcome::Retryable);
        }
        assert_eq!(breaker.window().snapshot().calls, 4);
        assert_eq!(throttle.counts().requests, 4);
        assert_eq!(throttle.counts().accepts, 0);
        let refused = gate.admit().expect_err("breaker open");
        assert_eq!(refused.stop_reason(), StopReason::BreakerOpen);
        assert!(refused.retry_after().is_some());
        assert_eq!(refused.label(), "circuit_open");
    }

    #[test]
    fn owned_passes_record_like_borrowed_ones() {
        let clock = ManualClock::new();
        let config = BreakerConfig::new(HealthConfig::count(2)).with_minimum_throughput(2);
        let breaker = Arc::new(CircuitBreaker::new(config, clock.clock()).expect("valid"));
        let throttle = Arc::new(
            AdaptiveThrottle::new(ThrottleConfig::sre_default(), clock.clock()).expect("valid"),
        );
        let gate = Some((Arc::clone(&throttle), Arc::clone(&breaker)));
        let pass = gate.admit_owned().expect("closed");
        clock.advance(Duration::from_millis(30));
        pass.finish(Outcome::Success);
        // Dropped without finishing: abandoned, recorded nowhere.
        drop(gate.admit_owned().expect("closed"));
        assert_eq!(breaker.window().snapshot().calls, 1);
        let p50 = breaker.window().latency_percentile(0.5).expect("one call");
        assert!(p50 >= Duration::from_millis(30), "{p50:?}");
        assert_eq!(throttle.counts().accepts, 1);
    }

    #[test]
    fn the_too_close_message_says_when_nothing_was_left() {
        let some = DeadlineTooClose {
            remaining: Duration::from_millis(3),
            min_call: Duration::from_millis(20),
        };
        assert!(some.to_string().contains("3ms left"));
        let none = DeadlineTooClose {
            remaining: Duration::ZERO,
            min_call: Duration::ZERO,
        };
        assert_eq!(none.to_string(), "call not sent: the deadline has passed");
    }
}
