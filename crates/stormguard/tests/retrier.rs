//! The async `Retrier` end to end under tokio's paused clock: stop reasons, budgets, per-try
//! timeouts, deadlines, pushback, cancellation, observer events and seeded jitter.
//!
//! Every wait is virtual; elapsed times are read from `tokio::time::Instant`.

use std::future::pending;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use stormguard::backoff::{Backoff, Jitter};
use stormguard::budget::{ConcurrencyBudget, TokenBucket};
use stormguard::classify::{Outcome, classify_http_status};
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline};
use stormguard::retry::{
    Attempt, AttemptOutcome, Call, Failure, IdempotencyKey, InvalidKey, Retrier, RetryObserver,
    RetryPolicy, RetryReason, SeededRandom, StopReason,
};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

/// One observer callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Started(u32),
    Ended(u32, AttemptOutcome),
    Scheduled(u32, Duration, RetryReason),
    GaveUp(u32, StopReason),
}

/// Records every observer callback in order.
#[derive(Default)]
struct Recorder(Mutex<Vec<Event>>);

impl Recorder {
    fn push(&self, event: Event) {
        self.0.lock().expect("not poisoned").push(event);
    }

    fn events(&self) -> Vec<Event> {
        self.0.lock().expect("not poisoned").clone()
    }

    fn delays(&self) -> Vec<Duration> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Scheduled(_, delay, _) => Some(delay),
                _ => None,
            })
            .collect()
    }

    fn give_ups(&self) -> Vec<(u32, StopReason)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::GaveUp(n, reason) => Some((n, reason)),
                _ => None,
            })
            .collect()
    }
}

impl RetryObserver for Recorder {
    fn attempt_started(&self, attempt: u32) {
        self.push(Event::Started(attempt));
    }
    fn attempt_ended(&self, attempt: u32, ended: &AttemptOutcome) {
        self.push(Event::Ended(attempt, *ended));
    }
    fn retry_scheduled(&self, next_attempt: u32, delay: Duration, reason: RetryReason) {
        self.push(Event::Scheduled(next_attempt, delay, reason));
    }
    fn gave_up(&self, attempts: u32, reason: StopReason) {
        self.push(Event::GaveUp(attempts, reason));
    }
}

/// Sets its flag when dropped: proves a future holding it was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A policy with a fixed 10 ms wait and no jitter.
fn fixed(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::new(max_attempts).with_backoff(Backoff::fixed(10 * MS))
}

fn http(r: &Result<u16, ()>) -> Outcome {
    r.map_or(Outcome::NeverRetry, |s| classify_http_status(s, None))
}

#[tokio::test(start_paused = true)]
async fn never_retry_stops_after_one_attempt_and_keeps_the_error() {
    let log = Arc::new(Recorder::default());
    let retrier = Retrier::new(fixed(5))
        .expect("a valid policy")
        .with_observer(Arc::clone(&log));
    let calls = AtomicU32::new(0);
    let start = Instant::now();

    let err = retrier
        .run(
            |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>("404 not found") }
            },
            |_: &Result<(), &str>| Outcome::NeverRetry,
        )
        .await
        .expect_err("a 404 is never retried");

    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(err.reason(), StopReason::NeverRetry);
    assert_eq!(err.attempts(), 1);
    assert!(matches!(err.last(), Failure::Error("404 not found")));
    assert_eq!(start.elapsed(), Duration::ZERO, "no backoff wait");
    assert_eq!(log.give_ups(), vec![(1, StopReason::NeverRetry)]);
}

#[tokio::test(start_paused = true)]
async fn retryable_failures_stop_when_attempts_are_exhausted() {
    let retrier = Retrier::new(fixed(4)).expect("a valid policy");
    let calls = AtomicU32::new(0);
    let start = Instant::now();

    let err = retrier
        .run(
            |attempt| {
                assert_eq!(attempt.number, calls.fetch_add(1, Ordering::SeqCst) + 1);
                async { Err::<(), _>("503") }
            },
            |_: &Result<(), &str>| Outcome::Retryable,
        )
        .await
        .expect_err("every attempt fails");

    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(err.reason(), StopReason::AttemptsExhausted);
    assert_eq!(err.attempts(), 4);
    assert!(matches!(err.last(), Failure::Error("503")));
    assert_eq!(start.elapsed(), 30 * MS, "three fixed 10 ms waits");
}

#[tokio::test(start_paused = true)]
async fn grpc_bucket_refuses_the_retry_once_tokens_are_not_above_half() {
    // maxTokens 2: the first failure leaves 1 token, which is not > 2/2, so no retry at all.
    let bucket = Arc::new(TokenBucket::grpc(2, 0.1).expect("valid budget"));
    let retrier = Retrier::new(fixed(10))
        .expect("a valid policy")
        .with_budget(Arc::clone(&bucket));
    let calls = AtomicU32::new(0);
    let op = |_: Attempt| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { Err::<(), _>("unavailable") }
    };
    let err = retrier
        .run(op, |_: &Result<(), &str>| Outcome::Retryable)
        .await
        .expect_err("always fails");
    assert_eq!(err.reason(), StopReason::BudgetExhausted);
    assert_eq!(err.attempts(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(bucket.tokens(), 1.0);

    // The shared bucket still allows a first attempt, whose failure empties it.
    let err = retrier
        .run(op, |_: &Result<(), &str>| Outcome::Retryable)
        .await
        .expect_err("always fails");
    assert_eq!(err.reason(), StopReason::BudgetExhausted);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(bucket.tokens(), 0.0);
}

#[tokio::test(start_paused = true)]
async fn grpc_bucket_of_ten_allows_four_retries_from_full() {
    // 10 → 9, 8, 7, 6 (each > 5: retry) → 5 (not > 5: refused): 5 calls.
    let bucket = Arc::new(TokenBucket::grpc(10, 0.1).expect("valid budget"));
    let retrier = Retrier::new(fixed(10))
        .expect("a valid policy")
        .with_budget(Arc::clone(&bucket));
    let calls = AtomicU32::new(0);
    let err = retrier
        .run(
            |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>("unavailable") }
            },
            |_: &Result<(), &str>| Outcome::Retryable,
        )
        .await
        .expect_err("always fails");
    assert_eq!(err.reason(), StopReason::BudgetExhausted);
    assert_eq!(err.attempts(), 5);
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(bucket.tokens(), 5.0);
}

/// Runs an op that sleeps 1 s under a 100 ms per-try timeout; returns the attempts it saw.
async fn slow_op_with_per_try_timeout(
    policy: RetryPolicy,
    call: Call,
) -> (Result<(), stormguard::retry::RetryError<()>>, Vec<Attempt>) {
    let retrier = Retrier::new(policy.with_per_try_timeout(100 * MS)).expect("a valid policy");
    let seen = Mutex::new(Vec::new());
    let result = retrier
        .run_with(
            call,
            |attempt| {
                seen.lock().expect("not poisoned").push(attempt);
                async {
                    tokio::time::sleep(SEC).await;
                    Ok::<(), ()>(())
                }
            },
            |_: &Result<(), ()>| Outcome::Success,
        )
        .await;
    (result, seen.into_inner().expect("not poisoned"))
}

#[tokio::test(start_paused = true)]
async fn timed_out_attempt_is_not_retried_without_idempotency() {
    let start = Instant::now();
    let (result, seen) = slow_op_with_per_try_timeout(fixed(3), Call::new()).await;
    let err = result.expect_err("the attempt timed out");
    assert_eq!(err.reason(), StopReason::NotIdempotent);
    assert_eq!(err.attempts(), 1);
    assert!(
        matches!(err.last(), Failure::TimedOut(d) if *d == 100 * MS),
        "{:?}",
        err.last()
    );
    assert_eq!(seen.len(), 1);
    assert_eq!(start.elapsed(), 100 * MS);
}

#[tokio::test(start_paused = true)]
async fn keyed_call_is_retried_after_timeouts_with_the_same_key() -> Result<(), InvalidKey> {
    let key = IdempotencyKey::new("k-1")?;
    let (result, seen) = slow_op_with_per_try_timeout(fixed(3), Call::new().with_key(key)).await;
    let err = result.expect_err("every attempt timed out");
    assert_eq!(err.reason(), StopReason::AttemptsExhausted);
    assert_eq!(err.attempts(), 3);
    assert!(matches!(err.last(), Failure::TimedOut(d) if *d == 100 * MS));
    assert_eq!(seen.len(), 3);
    let first = seen[0].key.as_ref().expect("keyed");
    assert_eq!(first.as_str(), "k-1");
    for (i, attempt) in seen.iter().enumerate() {
        assert_eq!(attempt.number as usize, i + 1);
        assert_eq!(attempt.timeout, Some(100 * MS));
        let key = attempt.key.as_ref().expect("every attempt carries the key");
        assert_eq!(key, first);
        assert!(
            std::ptr::eq(key.as_str(), first.as_str()),
            "the same key, not a copy"
        );
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn idempotent_call_is_retried_after_timeouts() {
    let (result, seen) = slow_op_with_per_try_timeout(fixed(3), Call::new().idempotent(true)).await;
    let err = result.expect_err("every attempt timed out");
    assert_eq!(err.reason(), StopReason::AttemptsExhausted);
    assert_eq!(err.attempts(), 3);
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter()
            .all(|a| a.key.is_none() && a.timeout == Some(100 * MS))
    );

    // The policy's default applies when the call does not override it, and the call wins.
    let idempotent = fixed(3).with_idempotent(true);
    let (result, seen) = slow_op_with_per_try_timeout(idempotent, Call::new()).await;
    assert_eq!(
        result.map_err(|e| e.reason()),
        Err(StopReason::AttemptsExhausted)
    );
    assert_eq!(seen.len(), 3);
    let (result, seen) =
        slow_op_with_per_try_timeout(idempotent, Call::new().idempotent(false)).await;
    assert_eq!(
        result.map_err(|e| e.reason()),
        Err(StopReason::NotIdempotent)
    );
    assert_eq!(seen.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn per_try_timeout_is_capped_by_the_call_deadline() {
    let retrier = Retrier::new(fixed(3).with_per_try_timeout(SEC)).expect("a valid policy");
    let seen = Mutex::new(Vec::new());
    let start = Instant::now();
    let call = Call::new().with_deadline(Deadline::after(250 * MS, Clock::tokio()));
    let err = retrier
        .run_with(
            call,
            |attempt| {
                seen.lock().expect("not poisoned").push(attempt.timeout);
                async {
                    tokio::time::sleep(SEC).await;
                    Ok::<(), ()>(())
                }
            },
            |_: &Result<(), ()>| Outcome::Success,
        )
        .await
        .expect_err("cut by the deadline");
    assert_eq!(*seen.lock().expect("not poisoned"), vec![Some(250 * MS)]);
    assert!(matches!(err.last(), Failure::TimedOut(d) if *d == 250 * MS));
    // The deadline has passed: that, not idempotency, is why nothing more is sent.
    assert_eq!(err.reason(), StopReason::DeadlineTooClose);
    assert_eq!(start.elapsed(), 250 * MS);
}

#[tokio::test(start_paused = true)]
async fn later_attempts_get_only_what_is_left_of_the_deadline() {
    // 1 s deadline, 300 ms per try, 100 ms waits: attempts at 0, 400 and 800 ms; the third
    // gets the 200 ms left, and then nothing is left for a fourth.
    let policy = RetryPolicy::new(10)
        .with_backoff(Backoff::fixed(100 * MS))
        .with_per_try_timeout(300 * MS)
        .with_idempotent(true);
    let retrier = Retrier::new(policy).expect("a valid policy");
    let seen = Mutex::new(Vec::new());
    let start = Instant::now();
    let err = retrier
        .run_with(
            Call::new().with_deadline(Deadline::after(SEC, Clock::tokio())),
            |attempt| {
                seen.lock()
                    .expect("not poisoned")
                    .push((start.elapsed(), attempt.timeout));
                pending::<Result<(), ()>>()
            },
            |_: &Result<(), ()>| Outcome::Success,
        )
        .await
        .expect_err("never completes");
    assert_eq!(
        *seen.lock().expect("not poisoned"),
        vec![
            (Duration::ZERO, Some(300 * MS)),
            (400 * MS, Some(300 * MS)),
            (800 * MS, Some(200 * MS)),
        ]
    );
    assert_eq!(err.reason(), StopReason::DeadlineTooClose);
    assert!(matches!(err.last(), Failure::TimedOut(d) if *d == 200 * MS));
    assert_eq!(start.elapsed(), SEC);
}

/// Every attempt takes 60 ms and fails; 20 ms waits; a retry needs 20 + 60 ms left.
/// Under a 250 ms deadline: attempts at 0, 80 and 160 ms, then 30 ms left stops it.
async fn sixty_ms_failures(retrier: &Retrier, call: Call) -> (StopReason, u32, Duration) {
    let start = Instant::now();
    let err = retrier
        .run_with(
            call,
            |_| async {
                tokio::time::sleep(60 * MS).await;
                Err::<(), _>("unavailable")
            },
            |_: &Result<(), &str>| Outcome::Retryable,
        )
        .await
        .expect_err("always fails");
    (err.reason(), err.attempts(), start.elapsed())
}

fn deadline_after(d: Duration) -> Deadline {
    Deadline::after(d, Clock::tokio())
}

#[tokio::test(start_paused = true)]
async fn task_scoped_deadline_stops_the_retrier_and_the_earlier_deadline_wins() {
    let policy = RetryPolicy::new(5)
        .with_backoff(Backoff::fixed(20 * MS))
        .with_min_call(60 * MS);
    let retrier = Retrier::new(policy).expect("a valid policy");
    let too_close = (StopReason::DeadlineTooClose, 3, 220 * MS);

    // Without a deadline all five attempts run.
    assert_eq!(
        sixty_ms_failures(&retrier, Call::new()).await,
        (StopReason::AttemptsExhausted, 5, 380 * MS)
    );
    // The task's deadline alone.
    let scoped = deadline::scope(
        deadline_after(250 * MS),
        sixty_ms_failures(&retrier, Call::new()),
    )
    .await;
    assert_eq!(scoped, too_close);
    // A later call deadline does not extend the task's.
    let call = Call::new().with_deadline(deadline_after(10 * SEC));
    let scoped = deadline::scope(deadline_after(250 * MS), sixty_ms_failures(&retrier, call)).await;
    assert_eq!(scoped, too_close);
    // Nor does a later nested scope.
    let nested = deadline::scope(
        deadline_after(250 * MS),
        deadline::scope(
            deadline_after(10 * SEC),
            sixty_ms_failures(&retrier, Call::new()),
        ),
    )
    .await;
    assert_eq!(nested, too_close);
    // An earlier call deadline inside a later scope wins too.
    let call = Call::new().with_deadline(deadline_after(250 * MS));
    let scoped = deadline::scope(deadline_after(10 * SEC), sixty_ms_failures(&retrier, call)).await;
    assert_eq!(scoped, too_close);
}

#[tokio::test(start_paused = true)]
async fn expired_deadline_stops_retrying_even_with_zero_wait_and_min_call() {
    // The call's own 100 ms deadline cuts the first (150 ms) attempt: nobody is waiting any
    // more, whatever the policy would allow.
    let retrier = Retrier::new(RetryPolicy::new(5).with_backoff(Backoff::fixed(Duration::ZERO)))
        .expect("a valid policy");
    let calls = AtomicU32::new(0);
    let start = Instant::now();
    let err = retrier
        .run_with(
            Call::new().with_deadline(deadline_after(100 * MS)),
            |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(150 * MS).await;
                    Err::<(), _>("unavailable")
                }
            },
            |_: &Result<(), &str>| Outcome::Retryable,
        )
        .await
        .expect_err("always fails");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "attempts sent after the deadline"
    );
    assert_eq!(err.reason(), StopReason::DeadlineTooClose);
    assert_eq!(start.elapsed(), 100 * MS);
}

#[tokio::test(start_paused = true)]
async fn retry_after_longer_than_the_backoff_delays_the_next_attempt() {
    let log = Arc::new(Recorder::default());
    let retrier = Retrier::new(RetryPolicy::new(3).with_backoff(Backoff::exponential(10 * MS)))
        .expect("a valid policy")
        .with_random(SeededRandom::new(7))
        .with_observer(Arc::clone(&log));
    let starts = Mutex::new(Vec::new());
    let start = Instant::now();
    let status = retrier
        .run(
            |attempt| {
                starts.lock().expect("not poisoned").push(start.elapsed());
                async move { Ok::<u16, ()>(if attempt.number == 1 { 429 } else { 200 }) }
            },
            |r: &Result<u16, ()>| {
                r.map_or(Outcome::NeverRetry, |s| {
                    classify_http_status(s, Some(2 * SEC))
                })
            },
        )
        .await
        .expect("the second attempt succeeds");
    assert_eq!(status, 200);
    let starts = starts.into_inner().expect("not poisoned");
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0], Duration::ZERO);
    let second = starts[1].as_millis();
    assert!(
        (2000..=2001).contains(&second),
        "second attempt at {second} ms"
    );
    assert!(
        log.events()
            .contains(&Event::Scheduled(2, 2 * SEC, RetryReason::Overloaded))
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_during_its_first_attempt_reports_the_cancellation() {
    // The first attempt runs before any retry state exists; a call dropped there is still
    // reported, and the budget still sees the request end.
    let budget = Arc::new(ConcurrencyBudget::new(20.0, 3).expect("valid budget"));
    let log = Arc::new(Recorder::default());
    let retrier = Retrier::new(fixed(5))
        .expect("a valid policy")
        .with_budget(Arc::clone(&budget))
        .with_observer(Arc::clone(&log));
    let at_once = retrier.run(
        |_| async { Ok::<(), &str>(()) },
        |_: &Result<(), &str>| Outcome::Success,
    );
    at_once.await.expect("succeeds at once");
    assert_eq!(
        budget.active_requests(),
        0,
        "a call that succeeded at once has ended"
    );
    let run = retrier.run(
        |_| pending::<Result<(), &str>>(),
        |_: &Result<(), &str>| Outcome::Retryable,
    );
    tokio::time::timeout(5 * SEC, run)
        .await
        .expect_err("the first attempt never ends");
    assert_eq!(log.give_ups(), vec![(1, StopReason::Cancelled)]);
    assert_eq!(budget.active_requests(), 0);
    assert_eq!(budget.active_retries(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_cancels_the_attempt_in_flight_and_releases_the_budget() {
    let budget = Arc::new(ConcurrencyBudget::new(20.0, 3).expect("valid budget"));
    let log = Arc::new(Recorder::default());
    let retrier = Retrier::new(fixed(5))
        .expect("a valid policy")
        .with_budget(Arc::clone(&budget))
        .with_observer(Arc::clone(&log));
    let dropped = Arc::new(AtomicBool::new(false));
    let during_second = Mutex::new(None);

    let run = retrier.run(
        |attempt| {
            let guard = (attempt.number == 2).then(|| {
                *during_second.lock().expect("not poisoned") =
                    Some((budget.active_requests(), budget.active_retries()));
                DropFlag(Arc::clone(&dropped))
            });
            async move {
                let _guard = guard;
                if attempt.number == 1 {
                    Err("unavailable")
                } else {
                    pending::<Result<(), &str>>().await
                }
            }
        },
        |_: &Result<(), &str>| Outcome::Retryable,
    );
    tokio::time::timeout(5 * SEC, run)
        .await
        .expect_err("the second attempt never ends");

    assert_eq!(
        *during_second.lock().expect("not poisoned"),
        Some((1, 1)),
        "attempt 2 ran as a paid retry"
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the in-flight future was dropped"
    );
    assert_eq!(log.give_ups(), vec![(2, StopReason::Cancelled)]);
    assert_eq!(budget.active_requests(), 0);
    assert_eq!(budget.active_retries(), 0);
}

#[tokio::test(start_paused = true)]
async fn observer_sees_each_attempt_and_retry_in_order_and_no_give_up_on_success() {
    let log = Arc::new(Recorder::default());
    let retrier = Retrier::new(fixed(5))
        .expect("a valid policy")
        .with_observer(Arc::clone(&log));
    let status = retrier
        .run(
            |attempt| async move { Ok::<u16, ()>(if attempt.number < 3 { 503 } else { 200 }) },
            http,
        )
        .await
        .expect("the third attempt succeeds");
    assert_eq!(status, 200);
    let retryable = AttemptOutcome::from(Outcome::Retryable);
    assert_eq!(
        log.events(),
        vec![
            Event::Started(1),
            Event::Ended(1, retryable),
            Event::Scheduled(2, 10 * MS, RetryReason::Failed),
            Event::Started(2),
            Event::Ended(2, retryable),
            Event::Scheduled(3, 10 * MS, RetryReason::Failed),
            Event::Started(3),
            Event::Ended(3, AttemptOutcome::from(Outcome::Success)),
        ]
    );
}

/// Runs three always-failing calls with 4 attempts and full jitter; returns the delays drawn.
async fn jittered_delays(seed: u64) -> Vec<Duration> {
    let log = Arc::new(Recorder::default());
    let policy =
        RetryPolicy::new(4).with_backoff(Backoff::exponential(100 * MS).with_jitter(Jitter::Full));
    let retrier = Retrier::new(policy)
        .expect("a valid policy")
        .with_random(SeededRandom::new(seed))
        .with_observer(Arc::clone(&log));
    for _ in 0..3 {
        let stop = retrier
            .run(|_| async { Ok::<u16, ()>(503) }, http)
            .await
            .expect("the last 503 is handed back");
        assert_eq!(stop, 503);
    }
    log.delays()
}

#[tokio::test(start_paused = true)]
async fn same_seed_gives_the_same_jitter_and_another_seed_does_not() {
    let a = jittered_delays(42).await;
    let b = jittered_delays(42).await;
    let c = jittered_delays(43).await;
    assert_eq!(a.len(), 9);
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Full jitter stays below each ceiling (100, 200, 400 ms)...
    for (i, delay) in a.iter().enumerate() {
        let ceiling = 100 * MS * (1 << (i % 3));
        assert!(*delay < ceiling, "delay {i}: {delay:?} >= {ceiling:?}");
    }
    // ...and successive calls draw differently, so callers do not retry in lockstep.
    assert_ne!(a[0..3], a[3..6]);
    assert_ne!(a[3..6], a[6..9]);
}

#[tokio::test(start_paused = true)]
async fn run_report_hands_back_the_last_response_classified_as_failure() {
    let retrier = Retrier::new(fixed(3)).expect("a valid policy");
    let calls = AtomicU32::new(0);
    let report = retrier
        .run_report(
            Call::new(),
            |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok::<u16, ()>(503) }
            },
            http,
        )
        .await;
    assert!(matches!(report.result, Ok(503)), "{:?}", report.result);
    assert_eq!(report.stop, StopReason::AttemptsExhausted);
    assert_eq!(report.attempts, 3);
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // A deterministic failure response is handed back at once.
    let report = retrier
        .run_report(Call::new(), |_| async { Ok::<u16, ()>(500) }, http)
        .await;
    assert!(matches!(report.result, Ok(500)));
    assert_eq!(report.stop, StopReason::NeverRetry);
    assert_eq!(report.attempts, 1);
}
