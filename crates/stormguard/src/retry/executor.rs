//! The async retrier: [`RetryRun`] driven by tokio's timer.

use std::borrow::Borrow;
use std::future::Future;
use std::time::Duration;

use super::decide::{AttemptOutcome, Decision, RetryRun, StopReason};
use super::error::{Failure, RetryError};
use super::key::IdempotencyKey;
use super::observe::RetryObserver;
use super::policy::{InvalidPolicy, RetryPolicy};
use super::random::{LazyRng, RandomSource, SeededRandom};
use crate::admission::{AttemptGate, AttemptPass, NoGate, Refusal};
use crate::breaker::{BreakerObserver, CircuitBreaker};
use crate::budget::{RetryBudget, Unlimited};
use crate::classify::{Classifier, Outcome};
use crate::deadline::{self, Deadline};

/// Runs an operation under a [`RetryPolicy`], a shared [`RetryBudget`], the deadline and,
/// optionally, a shared [`CircuitBreaker`].
///
/// It stops at the first of: success, a failure that must not be retried, attempts exhausted,
/// budget refused, a deadline that cannot fit the wait plus a minimum call, an open breaker
/// ([`Retrier::with_breaker`]), or the caller dropping the future (which drops the attempt in
/// flight: that is how it is cancelled).
///
/// The deadline is the call's own ([`Call::with_deadline`]) or else the task's current one
/// ([`deadline::current`]), whichever is earlier. It is read only after a failure, or before
/// each attempt when a per-try timeout is set: a call that succeeds at once reads no clock,
/// arms no timer and allocates nothing.
///
/// # Example
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use stormguard::budget::TokenBucket;
/// use stormguard::classify::{Outcome, classify_http_status};
/// use stormguard::retry::{Retrier, RetryPolicy};
///
/// let budget = Arc::new(TokenBucket::grpc(10, 0.1).unwrap());
/// let retrier = Retrier::new(RetryPolicy::new(3)).unwrap().with_budget(budget);
/// let status = retrier
///     .run(
///         |attempt| async move { Ok::<u16, ()>(if attempt.number < 3 { 503 } else { 200 }) },
///         |r: &Result<u16, ()>| r.map_or(Outcome::NeverRetry, |s| classify_http_status(s, None)),
///     )
///     .await;
/// assert_eq!(status.unwrap(), 200);
/// # }
/// ```
#[derive(Debug)]
pub struct Retrier<B = Unlimited, O = (), R = SeededRandom, G = NoGate> {
    policy: RetryPolicy,
    budget: B,
    observer: O,
    random: R,
    gate: G,
}

/// The options of [`Retrier::run`]: a static, so the hot path reads fields that were not just
/// written (a freshly built `Call` costs a store-forwarding stall of about 10 ns).
static DEFAULT_CALL: Call = Call::new();

/// Per-call options: idempotency and deadline.
#[derive(Clone, Debug, Default)]
pub struct Call {
    idempotent: Option<bool>,
    key: Option<IdempotencyKey>,
    deadline: Option<Deadline>,
}

impl Call {
    /// Options that follow the policy's defaults.
    pub const fn new() -> Self {
        Call {
            idempotent: None,
            key: None,
            deadline: None,
        }
    }

    /// Overrides whether this call is idempotent.
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = Some(idempotent);
        self
    }

    /// Carries `key` on every attempt; a keyed call may be retried after an in-doubt failure.
    pub fn with_key(mut self, key: IdempotencyKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Bounds this call by `deadline` (the task's current deadline still applies if earlier).
    pub fn with_deadline(mut self, deadline: Deadline) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Whether this call may be repeated after an in-doubt failure: it carries a key, or it
    /// is idempotent (by its own setting, else `policy_default`).
    pub fn is_retry_safe(&self, policy_default: bool) -> bool {
        self.key.is_some() || self.idempotent.unwrap_or(policy_default)
    }

    /// The call's idempotency key.
    pub(crate) fn key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref()
    }

    /// Whether the call has a deadline of its own ([`Call::with_deadline`]).
    pub(crate) fn has_own_deadline(&self) -> bool {
        self.deadline.is_some()
    }

    /// The time left: the earlier of this call's deadline and the task's current one.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        let current = deadline::with_current(|d| d.map(Deadline::remaining));
        match (self.deadline.as_ref().map(Deadline::remaining), current) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// What the operation is handed for each attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub number: u32,
    /// The call's idempotency key, the same on every attempt.
    pub key: Option<IdempotencyKey>,
    /// The time this attempt is allowed, as of its start, when a per-try timeout or a deadline
    /// of the call's own is set: the per-try timeout cut to what is left of the call's and
    /// the task's deadline. The retrier cancels the attempt after it, and the operation hands
    /// it on (as `grpc-timeout`, …). `None` otherwise: the task's deadline alone is enforced
    /// by its owner and read by whoever needs it ([`deadline::current`]).
    pub timeout: Option<Duration>,
}

/// Everything about a finished call: the last result, attempts sent and why it stopped.
#[derive(Debug)]
pub struct Report<T, E> {
    /// The last attempt's result. It is `Ok` when the call succeeded, and also when the last
    /// attempt returned a value that the classifier called a failure (say an HTTP 503
    /// response): the response is handed back, as tower's retry does.
    pub result: Result<T, Failure<E>>,
    /// Attempts sent, the first included.
    pub attempts: u32,
    /// Why the call stopped.
    pub stop: StopReason,
}

impl Retrier {
    /// A retrier by `policy`, checked here: a policy that breaks a rule never runs. No budget,
    /// no observer and entropy-seeded jitter until the `with_*` methods add them.
    ///
    /// # Errors
    ///
    /// The [`InvalidPolicy`] that [`RetryPolicy::validate`] finds.
    pub fn new(policy: RetryPolicy) -> Result<Self, InvalidPolicy> {
        policy.validate()?;
        Ok(Retrier {
            policy,
            budget: Unlimited,
            observer: (),
            random: SeededRandom::from_entropy(),
            gate: NoGate,
        })
    }
}

impl<B: RetryBudget, O: RetryObserver, R: RandomSource, G: AttemptGate> Retrier<B, O, R, G> {
    /// Shares `budget` (usually an `Arc` held by every caller of the downstream).
    pub fn with_budget<B2: RetryBudget>(self, budget: B2) -> Retrier<B2, O, R, G> {
        Retrier {
            policy: self.policy,
            budget,
            observer: self.observer,
            random: self.random,
            gate: self.gate,
        }
    }

    /// Reports every attempt to `observer`.
    pub fn with_observer<O2: RetryObserver>(self, observer: O2) -> Retrier<B, O2, R, G> {
        Retrier {
            policy: self.policy,
            budget: self.budget,
            observer,
            random: self.random,
            gate: self.gate,
        }
    }

    /// Draws jitter from `random` (for example [`SeededRandom::new`] in tests).
    pub fn with_random<R2: RandomSource>(self, random: R2) -> Retrier<B, O, R2, G> {
        Retrier {
            policy: self.policy,
            budget: self.budget,
            observer: self.observer,
            random,
            gate: self.gate,
        }
    }

    /// Sends every attempt through `breaker`, shared with every other caller of the
    /// downstream: each attempt, the first included, needs a permit, and records its outcome
    /// and elapsed time (on the breaker's clock) in the breaker's window. When the breaker
    /// rejects an attempt the call stops at once with [`StopReason::BreakerOpen`] and
    /// [`Failure::Refused`]; [`RetryError::attempts`] counts only the attempts sent. See
    /// [`admission`](crate::admission) for how attempts are counted.
    ///
    /// A retry is checked after its backoff wait (the breaker may have closed meanwhile); a
    /// retry rejected then has already been paid for by the budget, like one the caller
    /// cancels during the wait.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use stormguard::breaker::{BreakerConfig, CircuitBreaker};
    /// use stormguard::classify::Outcome;
    /// use stormguard::clock::Clock;
    /// use stormguard::health::HealthConfig;
    /// use stormguard::retry::{Failure, Retrier, RetryPolicy, StopReason};
    ///
    /// let config = BreakerConfig::new(HealthConfig::count(4)).with_minimum_throughput(4);
    /// let breaker = Arc::new(CircuitBreaker::new(config, Clock::tokio()).unwrap());
    /// let retrier = Retrier::new(RetryPolicy::new(10)).unwrap().with_breaker(Arc::clone(&breaker));
    /// let always_503 = |_: &Result<(), ()>| Outcome::Retryable;
    ///
    /// // Four failed attempts open the breaker; the fifth is never sent.
    /// let err = retrier.run(|_| async { Ok(()) }, always_503).await.unwrap_err();
    /// assert_eq!((err.reason(), err.attempts()), (StopReason::BreakerOpen, 4));
    /// // The next call is rejected before its first attempt.
    /// let err = retrier.run(|_| async { Ok(()) }, always_503).await.unwrap_err();
    /// assert_eq!(err.attempts(), 0);
    /// assert!(matches!(err.last(), Failure::Refused(_)));
    /// # }
    /// ```
    pub fn with_breaker<P: BreakerObserver>(
        self,
        breaker: std::sync::Arc<CircuitBreaker<P>>,
    ) -> Retrier<B, O, R, std::sync::Arc<CircuitBreaker<P>>> {
        self.with_gate(breaker)
    }

    /// Sends every attempt through `gate`: a breaker, an adaptive throttle, a pair of them
    /// (see [`admission`](crate::admission)). A refused attempt is not sent and stops the
    /// call with the refusal's [`stop_reason`](Refusal::stop_reason).
    pub fn with_gate<G2: AttemptGate>(self, gate: G2) -> Retrier<B, O, R, G2> {
        Retrier {
            policy: self.policy,
            budget: self.budget,
            observer: self.observer,
            random: self.random,
            gate,
        }
    }

    /// The gate (a circuit breaker, or [`NoGate`]) every attempt goes through.
    pub fn gate(&self) -> &G {
        &self.gate
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The budget.
    pub fn budget(&self) -> &B {
        &self.budget
    }

    /// Runs `op` with the policy's defaults and returns its value, or why it gave up.
    ///
    /// `classifier` turns each attempt's result into an [`Outcome`](crate::classify::Outcome);
    /// a closure `|r: &Result<T, E>| -> Outcome` or [`ByErrorClass`](crate::classify::ByErrorClass)
    /// will do. When the last attempt returned `Ok` with a value classified as a failure, that
    /// value is returned as `Ok` (use [`Retrier::run_report`] to see why it stopped).
    pub fn run<T, E, F, Fut, C>(
        &self,
        op: F,
        classifier: C,
    ) -> impl Future<Output = Result<T, RetryError<E>>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classifier<T, E>,
    {
        self.drive(&DEFAULT_CALL, op, classifier, &self.observer, into_result)
    }

    /// [`Retrier::run`] with per-call options.
    pub fn run_with<T, E, F, Fut, C>(
        &self,
        call: Call,
        op: F,
        classifier: C,
    ) -> impl Future<Output = Result<T, RetryError<E>>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classifier<T, E>,
    {
        self.drive(call, op, classifier, &self.observer, into_result)
    }

    /// Runs `op` and reports the last result, the attempts sent and why it stopped.
    pub fn run_report<T, E, F, Fut, C>(
        &self,
        call: Call,
        op: F,
        classifier: C,
    ) -> impl Future<Output = Report<T, E>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classifier<T, E>,
    {
        self.run_report_with(call, op, classifier, &self.observer)
    }

    /// [`Retrier::run_report`] with an observer for this call only (instead of the
    /// retrier's), for hooks that need the call's own context: a request id, a span.
    pub fn run_report_with<T, E, F, Fut, C, P>(
        &self,
        call: Call,
        op: F,
        classifier: C,
        observer: &P,
    ) -> impl Future<Output = Report<T, E>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classifier<T, E>,
        P: RetryObserver,
    {
        self.drive(call, op, classifier, observer, |result, attempts, stop| {
            Report {
                result,
                attempts,
                stop,
            }
        })
    }

    /// The retry loop; `finish` shapes what the caller gets, so the success path builds
    /// nothing it does not return. The public entry points hand back this future itself (an
    /// `async fn` around it would keep a second copy of the operation and its arguments), and
    /// `call` is the caller's own or a shared default.
    async fn drive<T, E, F, Fut, C, P, Out>(
        &self,
        call: impl Borrow<Call>,
        mut op: F,
        classifier: C,
        observer: &P,
        finish: impl FnOnce(Result<T, Failure<E>>, u32, StopReason) -> Out,
    ) -> Out
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classifier<T, E>,
        P: RetryObserver,
    {
        let call = call.borrow();
        let retry_safe = call.is_retry_safe(self.policy.idempotent());
        let request = crate::budget::RequestGuard::new(&self.budget);
        // The first attempt, when nothing but the operation bounds it, runs before any retry
        // state exists: a call that succeeds at once builds no run, no generator and no timer,
        // and keeps nothing across its one await but what the attempt needs.
        let mut first = None;
        if self.policy.per_try_timeout().is_none() && !call.has_own_deadline() {
            let pass = match self.gate.admit() {
                Ok(pass) => pass,
                Err(refusal) => {
                    let sent = refused(observer, refusal, 1);
                    return finish(Err(Failure::Refused(refusal)), sent, refusal.stop_reason());
                }
            };
            let mut cancelled = CancelReporter::new(observer);
            cancelled.attempts = 1;
            observer.attempt_started(1);
            let attempt = Attempt {
                number: 1,
                key: call.key.clone(),
                timeout: None,
            };
            let result = op(attempt).await;
            let outcome = classifier.classify(&result);
            if outcome.is_success() {
                cancelled.armed = false;
                pass.finish(outcome);
                observer.attempt_ended(1, &AttemptOutcome::from(outcome));
                request.first_attempt_succeeded();
                return finish(result.map_err(Failure::Error), 1, StopReason::Succeeded);
            }
            match settle(&classifier, pass, result, outcome) {
                Settled::Ended(result, ended) => first = Some((result, ended, cancelled)),
                Settled::Refused(result, refusal) => {
                    cancelled.armed = false;
                    let sent = refused(observer, refusal, 1);
                    return finish(result, sent, refusal.stop_reason());
                }
            }
        }
        let mut run = RetryRun::after_first_attempt(&self.policy, request, retry_safe);
        let mut rng = LazyRng::new(&self.random);
        let (mut carried, mut cancelled) = match first {
            Some((result, ended, cancelled)) => (Some((result, ended)), cancelled),
            None => (None, CancelReporter::new(observer)),
        };
        loop {
            let number = run.attempts();
            let (result, ended) = if let Some(done) = carried.take() {
                done
            } else {
                let pass = match self.gate.admit() {
                    Ok(pass) => pass,
                    Err(refusal) => {
                        cancelled.armed = false;
                        let sent = refused(observer, refusal, number);
                        return finish(Err(Failure::Refused(refusal)), sent, refusal.stop_reason());
                    }
                };
                cancelled.attempts = number;
                observer.attempt_started(number);
                // The time this attempt is allowed: the per-try timeout, cut to what is left
                // of the call's or the task's deadline, enforced by a timer. Without a per-try
                // timeout or a deadline of the call's own, nothing is read here (the task's
                // deadline is its owner's to enforce).
                let timeout = match (self.policy.per_try_timeout(), call.has_own_deadline()) {
                    (None, false) => None,
                    (per_try, _) => match (per_try, call.remaining()) {
                        (Some(p), Some(l)) => Some(p.min(l)),
                        (p, l) => p.or(l),
                    },
                };
                let attempt = Attempt {
                    number,
                    key: call.key.clone(),
                    timeout,
                };
                let attempted = match timeout {
                    None => Ok(op(attempt).await),
                    Some(limit) => tokio::time::timeout(limit, op(attempt))
                        .await
                        .map_err(|_| limit),
                };
                match attempted {
                    Ok(result) => {
                        let outcome = classifier.classify(&result);
                        match settle(&classifier, pass, result, outcome) {
                            Settled::Ended(result, ended) => (result, ended),
                            Settled::Refused(result, refusal) => {
                                cancelled.armed = false;
                                let sent = refused(observer, refusal, number);
                                return finish(result, sent, refusal.stop_reason());
                            }
                        }
                    }
                    Err(limit) => {
                        pass.finish(AttemptOutcome::TIMED_OUT.outcome);
                        (Err(Failure::TimedOut(limit)), AttemptOutcome::TIMED_OUT)
                    }
                }
            };
            observer.attempt_ended(number, &ended);
            if ended.outcome.is_success() {
                run.succeeded();
                cancelled.armed = false;
                return finish(result, number, StopReason::Succeeded);
            }
            // A retry the gate would refuse now (a breaker this attempt just opened) is not
            // paid for: ask the gate before the budget.
            if run.would_retry(&ended) {
                if let Err(refusal) = self.gate.admit() {
                    run.retry_refused();
                    cancelled.armed = false;
                    let stop = refusal.stop_reason();
                    observer.gave_up(number, stop);
                    return finish(Err(Failure::Refused(refusal)), number, stop);
                }
            }
            match run.finish_attempt(ended, || call.remaining(), &mut rng) {
                Decision::Stop(stop) => {
                    cancelled.armed = false;
                    if stop != StopReason::Succeeded {
                        observer.gave_up(number, stop);
                    }
                    return finish(result, number, stop);
                }
                Decision::Retry {
                    attempt,
                    delay,
                    reason,
                } => {
                    observer.retry_scheduled(attempt, delay, reason);
                    drop(result);
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        }
    }
}

/// How an attempt that returned a result ended, for the retry loop.
enum Settled<T, E> {
    /// Sent and answered: the result and its outcome, recorded in the gate.
    Ended(Result<T, Failure<E>>, AttemptOutcome),
    /// A failure that is a refusal from further down: never sent, so nothing is recorded
    /// in the gate and nothing charged.
    Refused(Result<T, Failure<E>>, Refusal),
}

/// Records a returned attempt whose result the classifier called `outcome`: a refusal from
/// further down is let go unrecorded; anything else is recorded in the gate as the
/// classifier's [`health`](Classifier::health) of it.
fn settle<T, E, C: Classifier<T, E>>(
    classifier: &C,
    pass: impl AttemptPass,
    result: Result<T, E>,
    outcome: Outcome,
) -> Settled<T, E> {
    if outcome.is_failure() {
        if let Some(refusal) = classifier.refusal(&result) {
            drop(pass);
            return Settled::Refused(result.map_err(Failure::Error), refusal);
        }
    }
    pass.finish(classifier.health(&result));
    Settled::Ended(
        result.map_err(Failure::Error),
        AttemptOutcome::from(outcome),
    )
}

/// Attempt `number` was refused before it was sent: tell the observer, and say how many were
/// sent.
#[cold]
#[inline(never)]
fn refused<P: RetryObserver>(observer: &P, refusal: Refusal, number: u32) -> u32 {
    let sent = number - 1;
    observer.gave_up(sent, refusal.stop_reason());
    sent
}

fn into_result<T, E>(
    result: Result<T, Failure<E>>,
    attempts: u32,
    reason: StopReason,
) -> Result<T, RetryError<E>> {
    result.map_err(|last| RetryError {
        reason,
        attempts,
        last,
    })
}

/// Tells the observer that the call was cancelled if the future is dropped mid-way.
struct CancelReporter<'a, O: RetryObserver> {
    observer: &'a O,
    attempts: u32,
    armed: bool,
}

impl<'a, O: RetryObserver> CancelReporter<'a, O> {
    fn new(observer: &'a O) -> Self {
        CancelReporter {
            observer,
            attempts: 0,
            armed: true,
        }
    }
}

impl<O: RetryObserver> Drop for CancelReporter<'_, O> {
    fn drop(&mut self) {
        if self.armed {
            self.observer.gave_up(self.attempts, StopReason::Cancelled);
        }
    }
}
