//! The async hedger: gRPC A6 hedging on tokio's timer.

use std::fmt;
use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep, sleep_until};

use super::classify::HedgeClassifier;
use super::observe::{HedgeObserver, HedgeStop, HedgingStopped};
use super::policy::{HedgePolicy, InvalidHedge, MAX_ATTEMPTS};
use crate::budget::{RequestGuard, RetryBudget, RetryGuard, Unlimited, Withdrawal};
use crate::classify::{Outcome, Pushback};
use crate::retry::Attempt;

/// Per-call options: idempotency and deadline, the same [`Call`](crate::retry::Call) a
/// retried call takes.
///
/// A call is hedged only when it is idempotent (this call says so, or the policy's default
/// does) or carries an idempotency key; otherwise it gets a single attempt, because two
/// copies of a payment may both take effect.
pub type HedgeCall = crate::retry::Call;

/// How a hedged call failed.
#[derive(Debug)]
pub enum HedgeFailure<E> {
    /// The attempt whose result was returned failed with this error.
    Error(E),
    /// The deadline passed before any attempt succeeded.
    DeadlineExceeded,
}

impl<E: fmt::Display> fmt::Display for HedgeFailure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HedgeFailure::Error(e) => e.fmt(f),
            HedgeFailure::DeadlineExceeded => f.write_str("deadline exceeded"),
        }
    }
}

/// Everything about a finished hedged call.
#[derive(Debug)]
pub struct HedgeReport<T, E> {
    /// The returned attempt's result. It is `Ok` on success, and also when that attempt
    /// returned a value the classifier called a failure (say an HTTP 503 response): the value
    /// is handed back, as tower's retry does.
    pub result: Result<T, HedgeFailure<E>>,
    /// Attempts sent, the original included.
    pub sent: u32,
    /// The attempt whose result was returned (`None` at the deadline).
    pub winner: Option<u32>,
    /// Why the call stopped.
    pub stop: HedgeStop,
}

/// A hedged call failed: why, after how many attempts, and the failure returned.
#[derive(Debug)]
pub struct HedgeError<E> {
    stop: HedgeStop,
    sent: u32,
    last: HedgeFailure<E>,
}

impl<E> HedgeError<E> {
    /// Why the call stopped.
    pub fn stop(&self) -> HedgeStop {
        self.stop
    }

    /// Attempts sent, the original included.
    pub fn sent(&self) -> u32 {
        self.sent
    }

    /// The failure returned.
    pub fn last(&self) -> &HedgeFailure<E> {
        &self.last
    }

    /// The failure returned, by value.
    pub fn into_last(self) -> HedgeFailure<E> {
        self.last
    }
}

impl<E: fmt::Display> fmt::Display for HedgeError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "hedged call failed after {} attempt{} ({}): {}",
            self.sent,
            if self.sent == 1 { "" } else { "s" },
            self.stop.label(),
            self.last
        )
    }
}

impl<E: std::error::Error + 'static> std::error::Error for HedgeError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.last {
            HedgeFailure::Error(e) => Some(e),
            HedgeFailure::DeadlineExceeded => None,
        }
    }
}

/// Sends hedged attempts by gRPC A6's rules, paid for by a shared [`RetryBudget`].
///
/// The original attempt goes out at once; every `delay` without an answer another one
/// follows, up to the policy's attempts ([`MAX_ATTEMPTS`] at most). Then:
///
/// | an attempt ends with | the hedger |
/// | --- | --- |
/// | success | returns it; cancels (drops) the others |
/// | a fatal result ([`Outcome::NeverRetry`]) | returns it; cancels the others |
/// | a non-fatal failure (retryable, in doubt) | sends the next hedge **now**; later ones follow every `delay` |
/// | pushback with a delay (or [`Outcome::Overloaded`] with `retry_after`) | sends the next hedge after that delay |
/// | pushback "do not retry" | sends no more hedges; lets those in flight finish |
/// | [`Outcome::Overloaded`] without a delay | keeps the schedule (no early hedge into an overloaded server) |
///
/// When every attempt failed non-fatally and no more may be sent, the last one to fail is
/// returned. Every hedge is a [`Withdrawal::Hedge`] from the budget; when it refuses, no more
/// hedges are sent. The deadline — the call's own or the task's
/// [current](crate::deadline::current) one, whichever is earlier — bounds everything: when it passes
/// every attempt is cancelled and the call fails with [`HedgeFailure::DeadlineExceeded`];
/// no hedge is sent when it leaves less than the policy's minimum call time.
///
/// Cancelling an attempt means dropping its future. A call that is neither idempotent nor
/// keyed gets exactly one attempt (still bounded by the deadline).
///
/// The delay is resolved once per hedged call. Timers run on tokio's clock, so the hedger
/// needs a tokio runtime with time enabled.
///
/// # Example
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use stormguard::classify::ByErrorClass;
/// use stormguard::hedge::{HedgeDelay, HedgePolicy, Hedger};
///
/// let ms = Duration::from_millis;
/// let policy = HedgePolicy::new(2, HedgeDelay::Fixed(ms(20)))
///     .with_idempotent(true);
/// let hedger = Hedger::new(policy).unwrap();
/// let start = tokio::time::Instant::now();
/// // The original attempt is stuck for a second; the hedge answers in 10 ms.
/// let answer = hedger
///     .run(
///         |attempt| async move {
///             let wait = if attempt.number == 1 { ms(1000) } else { ms(10) };
///             tokio::time::sleep(wait).await;
///             Ok::<u32, std::io::Error>(attempt.number)
///         },
///         ByErrorClass,
///     )
///     .await
///     .unwrap();
/// assert_eq!(answer, 2);
/// assert_eq!(start.elapsed(), ms(30));
/// # }
/// ```
#[derive(Debug)]
pub struct Hedger<B = Unlimited, O = ()> {
    policy: HedgePolicy,
    budget: B,
    observer: O,
}

impl Hedger {
    /// A hedger by `policy`, checked here: a policy that breaks a rule never runs. No budget
    /// and no observer until the `with_*` methods add them.
    ///
    /// # Errors
    ///
    /// The [`InvalidHedge`] that [`HedgePolicy::validate`] finds.
    pub fn new(policy: HedgePolicy) -> Result<Self, InvalidHedge> {
        policy.validate()?;
        Ok(Hedger {
            policy,
            budget: Unlimited,
            observer: (),
        })
    }
}

impl<B: RetryBudget, O: HedgeObserver> Hedger<B, O> {
    /// Pays for hedges from `budget` (usually an `Arc` shared with the retrier and every
    /// other caller of the downstream).
    pub fn with_budget<B2: RetryBudget>(self, budget: B2) -> Hedger<B2, O> {
        Hedger {
            policy: self.policy,
            budget,
            observer: self.observer,
        }
    }

    /// Reports every attempt to `observer`.
    pub fn with_observer<O2: HedgeObserver>(self, observer: O2) -> Hedger<B, O2> {
        Hedger {
            policy: self.policy,
            budget: self.budget,
            observer,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &HedgePolicy {
        &self.policy
    }

    /// The budget.
    pub fn budget(&self) -> &B {
        &self.budget
    }

    /// Runs `op` with the policy's defaults and returns the winning value, or why the call
    /// failed. `op` is called once per attempt; `classifier` is any
    /// [`Classifier`](crate::classify::Classifier) or a [`HedgeClassifier`].
    pub async fn run<T, E, F, Fut, C>(&self, op: F, classifier: C) -> Result<T, HedgeError<E>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: HedgeClassifier<T, E>,
    {
        self.run_with(HedgeCall::new(), op, classifier).await
    }

    /// [`Hedger::run`] with per-call options.
    pub async fn run_with<T, E, F, Fut, C>(
        &self,
        call: HedgeCall,
        op: F,
        classifier: C,
    ) -> Result<T, HedgeError<E>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: HedgeClassifier<T, E>,
    {
        let report = self.run_report(call, op, classifier).await;
        report.result.map_err(|last| HedgeError {
            stop: report.stop,
            sent: report.sent,
            last,
        })
    }

    /// Runs `op` and reports the returned result, the attempts sent, the winner and why it
    /// stopped.
    pub async fn run_report<T, E, F, Fut, C>(
        &self,
        call: HedgeCall,
        op: F,
        classifier: C,
    ) -> HedgeReport<T, E>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: HedgeClassifier<T, E>,
    {
        self.run_report_with(call, op, classifier, &self.observer)
            .await
    }

    /// [`Hedger::run_report`] with an observer for this call only (instead of the hedger's),
    /// for hooks that need the call's own context.
    pub async fn run_report_with<T, E, F, Fut, C, P>(
        &self,
        call: HedgeCall,
        mut op: F,
        classifier: C,
        observer: &P,
    ) -> HedgeReport<T, E>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: HedgeClassifier<T, E>,
        P: HedgeObserver,
    {
        let _request = RequestGuard::new(&self.budget);
        let start = Instant::now();
        let deadline_at = call.remaining().and_then(|left| start.checked_add(left));
        let max = if call.is_retry_safe(self.policy.idempotent()) {
            self.policy.max_attempts()
        } else {
            1
        };
        let delay = if max > 1 {
            self.policy.delay().resolve()
        } else {
            Duration::ZERO
        };
        let attempt = |number: u32| Attempt {
            number,
            key: call.key().cloned(),
            timeout: deadline_at.map(|at| at.saturating_duration_since(Instant::now())),
        };

        let mut flight = InFlight::new(observer);
        flight.send(op(attempt(1)), None);
        let mut hedge_timer: Pin<&mut Option<Sleep>> = pin!(None);
        let mut deadline_timer = pin!(deadline_at.map(sleep_until));
        let mut next_hedge = None;
        if max > 1 {
            next_hedge = schedule(hedge_timer.as_mut(), start.checked_add(delay));
        }
        let mut last: Option<(u32, Result<T, E>)> = None;

        loop {
            let event = poll_fn(|cx| {
                if let Poll::Ready((number, paid, result)) = flight.poll_any(cx) {
                    return Poll::Ready(Event::Ended(number, paid, result));
                }
                if let Some(timer) = deadline_timer.as_mut().as_pin_mut() {
                    if timer.poll(cx).is_ready() {
                        return Poll::Ready(Event::Deadline);
                    }
                }
                if let Some(at) = next_hedge {
                    let due = Instant::now() >= at
                        || hedge_timer
                            .as_mut()
                            .as_pin_mut()
                            .is_some_and(|timer| timer.poll(cx).is_ready());
                    if due {
                        return Poll::Ready(Event::HedgeDue);
                    }
                }
                Poll::Pending
            })
            .await;

            match event {
                Event::Deadline => {
                    return flight.end(
                        Err(HedgeFailure::DeadlineExceeded),
                        None,
                        HedgeStop::DeadlineExceeded,
                    );
                }
                Event::HedgeDue => {
                    next_hedge = None;
                    let now = Instant::now();
                    let too_close = deadline_at.is_some_and(|at| {
                        let left = at.saturating_duration_since(now);
                        left.is_zero() || left < self.policy.min_call()
                    });
                    let paid = if too_close {
                        Err(HedgingStopped::DeadlineTooClose)
                    } else {
                        RetryGuard::withdraw(&self.budget, Withdrawal::Hedge)
                            .map_err(|_| HedgingStopped::Budget)
                    };
                    match paid {
                        Err(why) => observer.hedging_stopped(flight.sent, why),
                        Ok(guard) => {
                            let number = flight.sent + 1;
                            flight.send(op(attempt(number)), Some(guard));
                            if number < max {
                                next_hedge = schedule(hedge_timer.as_mut(), now.checked_add(delay));
                            }
                        }
                    }
                }
                Event::Ended(number, paid, result) => {
                    let outcome = classifier.outcome(&result);
                    let pushback = classifier.pushback(&result);
                    observer.attempt_ended(number, &outcome);
                    if outcome.is_success() {
                        self.budget.record_success(paid);
                        return flight.end(
                            result.map_err(HedgeFailure::Error),
                            Some(number),
                            HedgeStop::Succeeded,
                        );
                    }
                    let wait = match (pushback, outcome) {
                        (Some(Pushback::DoNotRetry), _) => {
                            self.budget.record_failure();
                            if next_hedge.take().is_some() {
                                observer.hedging_stopped(flight.sent, HedgingStopped::Pushback);
                            }
                            None
                        }
                        (_, Outcome::NeverRetry) => {
                            return flight.end(
                                result.map_err(HedgeFailure::Error),
                                Some(number),
                                HedgeStop::Fatal,
                            );
                        }
                        (Some(Pushback::RetryAfter(wait)), _)
                        | (
                            None,
                            Outcome::Overloaded {
                                retry_after: Some(wait),
                            },
                        ) => {
                            self.budget.record_failure();
                            Some(wait)
                        }
                        (None, Outcome::Overloaded { retry_after: None }) => {
                            self.budget.record_failure();
                            None
                        }
                        (None, _) => {
                            self.budget.record_failure();
                            Some(Duration::ZERO)
                        }
                    };
                    if let (Some(wait), Some(_)) = (wait, next_hedge) {
                        next_hedge =
                            schedule(hedge_timer.as_mut(), Instant::now().checked_add(wait));
                    }
                    last = Some((number, result));
                }
            }

            if flight.is_empty() && next_hedge.is_none() {
                // Only `Ended` empties the flight, and it leaves `last` set when it does not
                // return, so a call with nothing in flight always has a result to return.
                if let Some((number, result)) = last.take() {
                    return flight.end(
                        result.map_err(HedgeFailure::Error),
                        Some(number),
                        HedgeStop::AllFailed,
                    );
                }
            }
        }
    }
}

/// What woke the hedger.
enum Event<R> {
    /// An attempt ended: its number, the withdrawal that paid for it, its result.
    Ended(u32, Option<Withdrawal>, R),
    /// The next hedge is due.
    HedgeDue,
    /// The deadline passed.
    Deadline,
}

/// Arms `timer` for `at` and returns it as the next hedge time (`None`: never, when the time
/// does not fit in an [`Instant`]).
fn schedule(mut timer: Pin<&mut Option<Sleep>>, at: Option<Instant>) -> Option<Instant> {
    let at = at?;
    match timer.as_mut().as_pin_mut() {
        Some(sleep) => sleep.reset(at),
        None => timer.set(Some(sleep_until(at))),
    }
    Some(at)
}

/// One attempt in flight: its future and the withdrawal that paid for it (released on drop).
struct Slot<'a, Fut, B: RetryBudget + ?Sized> {
    number: u32,
    future: Pin<Box<Fut>>,
    paid: Option<RetryGuard<'a, B>>,
}

/// The attempts in flight. Dropping it cancels them (and, unless the call has ended, tells
/// the observer the caller cancelled).
struct InFlight<'a, Fut, B: RetryBudget + ?Sized, O: HedgeObserver> {
    slots: [Option<Slot<'a, Fut, B>>; MAX_ATTEMPTS as usize],
    observer: &'a O,
    sent: u32,
    ended: bool,
}

impl<'a, Fut: Future, B: RetryBudget + ?Sized, O: HedgeObserver> InFlight<'a, Fut, B, O> {
    fn new(observer: &'a O) -> Self {
        InFlight {
            slots: std::array::from_fn(|_| None),
            observer,
            sent: 0,
            ended: false,
        }
    }

    fn send(&mut self, future: Fut, paid: Option<RetryGuard<'a, B>>) {
        if let Some(free) = self.slots.iter_mut().find(|slot| slot.is_none()) {
            self.sent += 1;
            self.observer.attempt_sent(self.sent);
            *free = Some(Slot {
                number: self.sent,
                future: Box::pin(future),
                paid,
            });
        }
    }

    fn is_empty(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }

    /// The first attempt that has ended, taken out of the flight (which releases its
    /// withdrawal).
    fn poll_any(&mut self, cx: &mut Context<'_>) -> Poll<(u32, Option<Withdrawal>, Fut::Output)> {
        for entry in &mut self.slots {
            let Some(slot) = entry else { continue };
            if let Poll::Ready(output) = slot.future.as_mut().poll(cx) {
                let paid = slot.paid.as_ref().map(RetryGuard::kind);
                let number = slot.number;
                *entry = None;
                return Poll::Ready((number, paid, output));
            }
        }
        Poll::Pending
    }

    fn cancel_all(&mut self) {
        for entry in &mut self.slots {
            if let Some(slot) = entry.take() {
                let number = slot.number;
                drop(slot);
                self.observer.attempt_cancelled(number);
            }
        }
    }

    /// Ends the call: cancels what is still in flight and reports the end.
    fn end<T, E>(
        &mut self,
        result: Result<T, HedgeFailure<E>>,
        winner: Option<u32>,
        stop: HedgeStop,
    ) -> HedgeReport<T, E> {
        self.cancel_all();
        self.ended = true;
        self.observer.finished(self.sent, winner, stop);
        HedgeReport {
            result,
            sent: self.sent,
            winner,
            stop,
        }
    }
}

impl<Fut, B: RetryBudget + ?Sized, O: HedgeObserver> Drop for InFlight<'_, Fut, B, O> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        for entry in &mut self.slots {
            if let Some(slot) = entry.take() {
                let number = slot.number;
                drop(slot);
                self.observer.attempt_cancelled(number);
            }
        }
        self.observer
            .finished(self.sent, None, HedgeStop::Cancelled);
    }
}
