//! The retry decision as plain code: no timers, no clock, no runtime.
//!
//! [`RetryRun`] is the whole policy for one logical request. The async [`Retrier`](super::Retrier)
//! and the simulator both drive it — the executor with real sleeps, the simulator on a virtual
//! clock — so what the simulator shows is what production does.

use std::time::Duration;

use rand::RngCore;

use super::policy::RetryPolicy;
use crate::budget::{RequestGuard, RetryBudget, Withdrawal};
use crate::classify::Outcome;

/// Why a logical request stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// An attempt succeeded.
    Succeeded,
    /// The failure is deterministic (a 400, a 404, …): retrying cannot help.
    NeverRetry,
    /// The failure left the outcome in doubt and the operation is neither idempotent nor keyed.
    NotIdempotent,
    /// `max_attempts` were sent.
    AttemptsExhausted,
    /// The retry budget refused another attempt.
    BudgetExhausted,
    /// The time left before the deadline cannot fit the backoff wait plus a minimum call.
    DeadlineTooClose,
    /// The caller dropped the call.
    Cancelled,
    /// The circuit breaker rejected an attempt (the first, or a retry) before it was sent.
    BreakerOpen,
    /// The adaptive throttle rejected an attempt locally before it was sent.
    Throttled,
}

impl StopReason {
    /// A short label for logs and metrics (`"attempts_exhausted"`, …).
    pub const fn label(&self) -> &'static str {
        match self {
            StopReason::Succeeded => "succeeded",
            StopReason::NeverRetry => "never_retry",
            StopReason::NotIdempotent => "not_idempotent",
            StopReason::AttemptsExhausted => "attempts_exhausted",
            StopReason::BudgetExhausted => "budget_exhausted",
            StopReason::DeadlineTooClose => "deadline_too_close",
            StopReason::Cancelled => "cancelled",
            StopReason::BreakerOpen => "breaker_open",
            StopReason::Throttled => "throttled",
        }
    }
}

/// Why a retry is being sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryReason {
    /// A retryable failure (a 503, a refused connection, gRPC UNAVAILABLE, …).
    Failed,
    /// The downstream asked for a pause (429, Retry-After, gRPC pushback).
    Overloaded,
    /// The previous attempt's outcome is unknown; safe to repeat because the call is
    /// idempotent or keyed.
    InDoubt,
    /// The previous attempt hit its per-try timeout.
    TimedOut,
}

impl RetryReason {
    /// A short label for logs and metrics.
    pub const fn label(&self) -> &'static str {
        match self {
            RetryReason::Failed => "failed",
            RetryReason::Overloaded => "overloaded",
            RetryReason::InDoubt => "in_doubt",
            RetryReason::TimedOut => "timed_out",
        }
    }
}

/// How one attempt ended, as the decision needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptOutcome {
    /// The classified result.
    pub outcome: Outcome,
    /// Whether the attempt was cut by its per-try timeout (the outcome is then
    /// [`Outcome::InDoubt`], and the AWS quota charges a timeout retry).
    pub timed_out: bool,
}

impl From<Outcome> for AttemptOutcome {
    fn from(outcome: Outcome) -> Self {
        AttemptOutcome {
            outcome,
            timed_out: false,
        }
    }
}

impl AttemptOutcome {
    /// An attempt cut by its per-try timeout.
    pub const TIMED_OUT: AttemptOutcome = AttemptOutcome {
        outcome: Outcome::InDoubt,
        timed_out: true,
    };
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Wait `delay`, then send attempt number `attempt`.
    Retry {
        /// The attempt to send next (2 for the first retry).
        attempt: u32,
        /// How long to wait first.
        delay: Duration,
        /// Why.
        reason: RetryReason,
    },
    /// Stop.
    Stop(StopReason),
}

/// The retry policy applied to one logical request.
///
/// Create it when the first attempt is about to be sent; call
/// [`finish_attempt`](RetryRun::finish_attempt) when each attempt ends. It talks to the budget
/// (request started and finished, failures, successes, withdrawals and their release) so the
/// caller cannot get the protocol wrong, and releases everything on drop.
///
/// # Example
///
/// Example ① of the seeds without a runtime or jitter: 250 ms deadline, every call takes
/// 60 ms and fails.
///
/// ```
/// use std::time::Duration;
/// use rand::{SeedableRng, rngs::SmallRng};
/// use stormguard::backoff::{Backoff, Jitter};
/// use stormguard::budget::TokenBucket;
/// use stormguard::classify::Outcome;
/// use stormguard::retry::{Decision, RetryPolicy, RetryRun, StopReason};
///
/// let ms = Duration::from_millis;
/// let policy = RetryPolicy::new(5)
///     .with_backoff(Backoff::exponential(ms(20)).with_cap(ms(200)).with_jitter(Jitter::None))
///     .with_min_call(ms(60));
/// policy.validate()?;
/// let budget = TokenBucket::spend_per_retry(10, 0.1)?;
/// let mut rng = SmallRng::seed_from_u64(1);
/// let mut run = RetryRun::start(&policy, &budget, false);
/// let mut now = Duration::ZERO;
/// let stop = loop {
///     now += ms(60); // the attempt
///     match run.finish_attempt(Outcome::Retryable.into(), || Some(ms(250) - now), &mut rng) {
///         Decision::Retry { delay, .. } => now += delay,
///         Decision::Stop(reason) => break reason,
///     }
/// };
/// // 60 + 20 + 60 + 40 + 60 = 240 ms: 10 ms left cannot fit an 80 ms wait and a 60 ms call.
/// assert_eq!(stop, StopReason::DeadlineTooClose);
/// assert_eq!(run.attempts(), 3);
/// assert_eq!(budget.tokens(), 8.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RetryRun<'a, B: RetryBudget + ?Sized> {
    policy: &'a RetryPolicy,
    budget: &'a B,
    retry_safe: bool,
    attempts: u32,
    previous_delay: Option<Duration>,
    /// The withdrawal that paid for the attempt in flight, if it is a retry.
    paid_by: Option<Withdrawal>,
    /// Whether that withdrawal is still to be released with `retry_finished`.
    holding_retry: bool,
}

impl<'a, B: RetryBudget + ?Sized> RetryRun<'a, B> {
    /// Starts a logical request whose first attempt is about to be sent. `retry_safe` says
    /// whether an in-doubt failure may be retried (the operation is idempotent or keyed).
    ///
    /// This runs once per call, so it does not check `policy` again: an executor checks its
    /// policy once, when it is made (`Retrier::new` does; so do the
    /// simulator's scenarios), and hands every run the checked one.
    #[inline]
    pub fn start(policy: &'a RetryPolicy, budget: &'a B, retry_safe: bool) -> Self {
        RetryRun::after_first_attempt(policy, RequestGuard::new(budget), retry_safe)
    }

    /// [`RetryRun::start`] for a request whose first attempt was sent under `request` alone:
    /// an executor may build a run only when that attempt did not succeed, so that a call
    /// that succeeds at once never builds one (the tokio retrier and the simulator do).
    ///
    /// Such a first attempt that succeeds is recorded with
    /// [`RequestGuard::first_attempt_succeeded`] before `request` is dropped: what
    /// [`finish_attempt`](RetryRun::finish_attempt) records for it, so the budget hears the
    /// same either way. Hand over the guard of a first attempt that did not succeed, then
    /// call `finish_attempt` with how it ended.
    ///
    /// ```
    /// use rand::{SeedableRng, rngs::SmallRng};
    /// use stormguard::budget::{RequestGuard, TokenBucket};
    /// use stormguard::classify::Outcome;
    /// use stormguard::retry::{Decision, RetryPolicy, RetryRun};
    ///
    /// let policy = RetryPolicy::new(3);
    /// let budget = TokenBucket::spend_per_retry(10, 0.1)?;
    /// let request = RequestGuard::new(&budget);
    /// // ... the first attempt failed:
    /// let mut run = RetryRun::after_first_attempt(&policy, request, true);
    /// let decision = run.finish_attempt(Outcome::Retryable.into(), || None, &mut SmallRng::seed_from_u64(1));
    /// assert!(matches!(decision, Decision::Retry { attempt: 2, .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn after_first_attempt(
        policy: &'a RetryPolicy,
        request: RequestGuard<'a, B>,
        retry_safe: bool,
    ) -> Self {
        // The run takes over telling the budget that the request ended (in its own drop).
        let budget = request.into_budget();
        RetryRun {
            policy,
            budget,
            retry_safe,
            attempts: 1,
            previous_delay: None,
            paid_by: None,
            holding_retry: false,
        }
    }

    /// Attempts sent so far, the one in flight included.
    #[inline]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Records how the attempt in flight ended and decides what comes next.
    ///
    /// `remaining` is asked for the time left before the deadline (`None`: no deadline) only
    /// when a retry is being considered, so the success path reads no clock. `rng` draws the
    /// jitter.
    ///
    /// Checks, in order: success; a deterministic failure; a deadline that has passed; an
    /// in-doubt failure of an operation that is not retry-safe; attempts exhausted; the deadline (remaining <
    /// wait + minimum call, where the wait is the backoff delay or the server's pushback,
    /// whichever is longer); and last the budget, so that no token is spent on a retry that
    /// would not be sent.
    #[inline]
    pub fn finish_attempt<R: RngCore + ?Sized>(
        &mut self,
        ended: AttemptOutcome,
        remaining: impl FnOnce() -> Option<Duration>,
        rng: &mut R,
    ) -> Decision {
        let reason = match ended.outcome {
            Outcome::Success => {
                self.succeeded();
                return Decision::Stop(StopReason::Succeeded);
            }
            Outcome::NeverRetry => return Decision::Stop(StopReason::NeverRetry),
            Outcome::Retryable => RetryReason::Failed,
            Outcome::Overloaded { .. } => RetryReason::Overloaded,
            Outcome::InDoubt if ended.timed_out => RetryReason::TimedOut,
            Outcome::InDoubt => RetryReason::InDoubt,
        };
        self.release_retry();
        self.budget.record_failure();
        self.decide_retry(ended, reason, remaining, rng)
    }

    /// Records that the attempt in flight succeeded: the same as
    /// [`finish_attempt`](RetryRun::finish_attempt) with [`Outcome::Success`], which always
    /// stops with [`StopReason::Succeeded`], for callers that know the outcome already.
    #[inline]
    pub fn succeeded(&mut self) {
        self.release_retry();
        self.budget.record_success(self.paid_by);
    }

    #[cold]
    fn decide_retry<R: RngCore + ?Sized>(
        &mut self,
        ended: AttemptOutcome,
        reason: RetryReason,
        remaining: impl FnOnce() -> Option<Duration>,
        rng: &mut R,
    ) -> Decision {
        let remaining = remaining();
        if remaining.is_some_and(|left| left.is_zero()) {
            // Nobody is waiting any more: nothing else matters.
            return Decision::Stop(StopReason::DeadlineTooClose);
        }
        if matches!(ended.outcome, Outcome::InDoubt) && !self.retry_safe {
            return Decision::Stop(StopReason::NotIdempotent);
        }
        if self.attempts >= self.policy.max_attempts() {
            return Decision::Stop(StopReason::AttemptsExhausted);
        }
        let mut delay = self
            .policy
            .backoff()
            .delay(self.attempts, self.previous_delay, rng);
        if let Outcome::Overloaded {
            retry_after: Some(pushback),
        } = ended.outcome
        {
            delay = delay.max(pushback);
        }
        if let Some(remaining) = remaining {
            if remaining < delay.saturating_add(self.policy.min_call()) {
                return Decision::Stop(StopReason::DeadlineTooClose);
            }
        }
        let kind = if ended.timed_out {
            Withdrawal::TimeoutRetry
        } else {
            Withdrawal::Retry
        };
        if self.budget.withdraw(kind).is_err() {
            return Decision::Stop(StopReason::BudgetExhausted);
        }
        self.paid_by = Some(kind);
        self.holding_retry = true;
        self.previous_delay = Some(delay);
        self.attempts += 1;
        Decision::Retry {
            attempt: self.attempts,
            delay,
            reason,
        }
    }

    /// Whether an attempt that ended so would be considered for a retry at all: a failure
    /// that is not deterministic, of an operation that may be sent again after it, with
    /// attempts left. Time and budget are not asked (see
    /// [`finish_attempt`](RetryRun::finish_attempt)).
    #[inline]
    pub fn would_retry(&self, ended: &AttemptOutcome) -> bool {
        match ended.outcome {
            Outcome::Success | Outcome::NeverRetry => false,
            Outcome::InDoubt if !self.retry_safe => false,
            _ => self.attempts < self.policy.max_attempts(),
        }
    }

    /// Records that the attempt in flight failed and that its retry was refused before it
    /// was paid for (an open breaker, a throttle): the failure counts, nothing is withdrawn.
    #[cold]
    pub fn retry_refused(&mut self) {
        self.release_retry();
        self.budget.record_failure();
    }

    fn release_retry(&mut self) {
        if self.holding_retry {
            self.holding_retry = false;
            self.budget.retry_finished();
        }
    }
}

impl<B: RetryBudget + ?Sized> Drop for RetryRun<'_, B> {
    #[inline]
    fn drop(&mut self) {
        self.release_retry();
        self.budget.request_finished();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::{Backoff, Jitter};
    use crate::budget::{ConcurrencyBudget, TokenBucket, Unlimited};
    use rand::RngCore;

    /// Every draw is zero: full jitter waits nothing.
    struct Zero;

    impl RngCore for Zero {
        fn next_u32(&mut self) -> u32 {
            0
        }
        fn next_u64(&mut self) -> u64 {
            0
        }
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            dest.fill(0);
        }
    }

    const MS: Duration = Duration::from_millis(1);

    fn no_jitter(max_attempts: u32) -> RetryPolicy {
        RetryPolicy::new(max_attempts)
            .with_backoff(Backoff::exponential(10 * MS).with_jitter(Jitter::None))
    }

    fn zero() -> Zero {
        Zero
    }

    #[test]
    fn success_stops_and_refunds() {
        let policy = no_jitter(3);
        let bucket = TokenBucket::grpc(10, 0.5).expect("valid");
        bucket.record_failure();
        let mut run = RetryRun::start(&policy, &bucket, false);
        let d = run.finish_attempt(Outcome::Success.into(), || unreachable!(), &mut zero());
        assert_eq!(d, Decision::Stop(StopReason::Succeeded));
        assert_eq!(bucket.tokens(), 9.5);
    }

    #[test]
    fn never_retry_is_not_recorded_as_a_failure() {
        let policy = no_jitter(3);
        let bucket = TokenBucket::grpc(10, 0.5).expect("valid");
        let mut run = RetryRun::start(&policy, &bucket, true);
        let d = run.finish_attempt(Outcome::NeverRetry.into(), || None, &mut zero());
        assert_eq!(d, Decision::Stop(StopReason::NeverRetry));
        assert_eq!(bucket.tokens(), 10.0);
    }

    #[test]
    fn in_doubt_needs_idempotency() {
        let policy = no_jitter(3);
        let mut run = RetryRun::start(&policy, &Unlimited, false);
        assert_eq!(
            run.finish_attempt(AttemptOutcome::TIMED_OUT, || None, &mut zero()),
            Decision::Stop(StopReason::NotIdempotent)
        );
        let mut run = RetryRun::start(&policy, &Unlimited, true);
        assert_eq!(
            run.finish_attempt(AttemptOutcome::TIMED_OUT, || None, &mut zero()),
            Decision::Retry {
                attempt: 2,
                delay: 10 * MS,
                reason: RetryReason::TimedOut
            }
        );
    }

    #[test]
    fn attempts_are_bounded_and_delays_grow() {
        let policy = no_jitter(4);
        let mut run = RetryRun::start(&policy, &Unlimited, false);
        let mut delays = vec![];
        loop {
            match run.finish_attempt(Outcome::Retryable.into(), || None, &mut zero()) {
                Decision::Retry { delay, .. } => delays.push(delay),
                Decision::Stop(reason) => {
                    assert_eq!(reason, StopReason::AttemptsExhausted);
                    break;
                }
            }
        }
        assert_eq!(delays, vec![10 * MS, 20 * MS, 40 * MS]);
        assert_eq!(run.attempts(), 4);
    }

    #[test]
    fn pushback_longer_than_backoff_wins() {
        let policy = no_jitter(3);
        let mut run = RetryRun::start(&policy, &Unlimited, false);
        let overloaded = Outcome::Overloaded {
            retry_after: Some(Duration::from_secs(2)),
        };
        assert_eq!(
            run.finish_attempt(overloaded.into(), || None, &mut zero()),
            Decision::Retry {
                attempt: 2,
                delay: Duration::from_secs(2),
                reason: RetryReason::Overloaded
            }
        );
        // A pushback that does not fit the deadline stops the call.
        let mut run = RetryRun::start(&policy, &Unlimited, false);
        assert_eq!(
            run.finish_attempt(
                overloaded.into(),
                || Some(Duration::from_secs(1)),
                &mut zero()
            ),
            Decision::Stop(StopReason::DeadlineTooClose)
        );
    }

    #[test]
    fn deadline_is_checked_before_the_budget_is_charged() {
        let policy = no_jitter(5).with_min_call(60 * MS);
        let bucket = TokenBucket::spend_per_retry(10, 0.1).expect("valid");
        let mut run = RetryRun::start(&policy, &bucket, false);
        let d = run.finish_attempt(Outcome::Retryable.into(), || Some(69 * MS), &mut zero());
        assert_eq!(d, Decision::Stop(StopReason::DeadlineTooClose));
        assert_eq!(bucket.tokens(), 10.0);
    }

    #[test]
    fn budget_refusal_stops_and_timeouts_pay_double_on_aws() {
        let policy = no_jitter(1000);
        let bucket = TokenBucket::aws_standard();
        let mut run = RetryRun::start(&policy, &bucket, true);
        let mut retries = 0;
        while let Decision::Retry { .. } =
            run.finish_attempt(AttemptOutcome::TIMED_OUT, || None, &mut zero())
        {
            retries += 1;
        }
        assert_eq!(retries, 50);
    }

    #[test]
    fn concurrency_permits_are_released_after_each_retry_and_on_drop() {
        let policy = no_jitter(10);
        let budget = ConcurrencyBudget::new(0.0, 1).expect("valid");
        let mut run = RetryRun::start(&policy, &budget, false);
        assert_eq!(budget.active_requests(), 1);
        for _ in 0..3 {
            assert!(matches!(
                run.finish_attempt(Outcome::Retryable.into(), || None, &mut zero()),
                Decision::Retry { .. }
            ));
            assert_eq!(budget.active_retries(), 1);
        }
        drop(run);
        assert_eq!(budget.active_retries(), 0);
        assert_eq!(budget.active_requests(), 0);
    }

    #[test]
    fn successful_retry_tells_the_budget_what_paid_for_it() {
        let policy = no_jitter(3);
        let bucket = TokenBucket::aws_standard();
        let mut run = RetryRun::start(&policy, &bucket, false);
        run.finish_attempt(Outcome::Retryable.into(), || None, &mut zero());
        assert_eq!(bucket.tokens(), 495.0);
        run.finish_attempt(Outcome::Success.into(), || None, &mut zero());
        assert_eq!(bucket.tokens(), 500.0);
    }
}
