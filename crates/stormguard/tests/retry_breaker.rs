//! The retrier and the circuit breaker together, under tokio's paused clock: an outage of a
//! downstream that fails every call for 30 s, seen by 20 callers that each retry.
//!
//! Asserts that during the outage the downstream sees only the attempts the breaker lets
//! through (the failures that opened it, the calls in flight then, and the half-open probes),
//! that traffic resumes through probes once the downstream recovers, and the breaker's own
//! timing (open duration, probes) under paused time. Every wait is virtual.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard::backoff::Backoff;
use stormguard::breaker::{
    BreakerConfig, BreakerObserver, BreakerState, Cause, CircuitBreaker, Rejection, StateChange,
};
use stormguard::classify::Outcome;
use stormguard::clock::{Clock, ManualClock};
use stormguard::health::HealthConfig;
use stormguard::retry::{Failure, Retrier, RetryPolicy, SeededRandom, StopReason};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

const CALLERS: u64 = 20;
const OUTAGE_START: Duration = Duration::from_secs(10);
const OUTAGE_END: Duration = Duration::from_secs(40);
const RUN_FOR: Duration = Duration::from_secs(60);
const PROBES: u32 = 3;
const OPEN_FOR: Duration = Duration::from_secs(2);

/// State changes with the (virtual) time they happened at, since the test started.
struct Changes {
    start: Instant,
    log: Mutex<Vec<(Duration, StateChange)>>,
}

impl BreakerObserver for Changes {
    fn state_changed(&self, change: &StateChange) {
        self.log
            .lock()
            .unwrap()
            .push((self.start.elapsed(), *change));
    }
}

/// What the downstream and the callers saw.
#[derive(Debug, Default)]
struct Tally {
    /// Attempts that reached the downstream during the outage.
    outage_attempts: AtomicU64,
    /// Attempts that reached the downstream after it recovered.
    after_attempts: AtomicU64,
    /// Calls that succeeded after the downstream recovered.
    after_successes: AtomicU64,
    /// Calls stopped by the breaker, by when.
    rejected_during: AtomicU64,
    rejected_after: AtomicU64,
}

/// Runs the outage scenario; `breaker` is `None` for the baseline without one.
async fn outage(breaker: Option<Arc<CircuitBreaker<Arc<Changes>>>>) -> Arc<Tally> {
    let start = Instant::now();
    let tally = Arc::new(Tally::default());
    let policy = RetryPolicy::new(4).with_backoff(Backoff::exponential(50 * MS).with_cap(400 * MS));
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let tally = Arc::clone(&tally);
        let breaker = breaker.clone();
        tasks.push(tokio::spawn(async move {
            let with_breaker = breaker.map(|b| {
                Retrier::new(policy)
                    .expect("a valid policy")
                    .with_random(SeededRandom::new(caller))
                    .with_breaker(b)
            });
            let without = Retrier::new(policy)
                .expect("a valid policy")
                .with_random(SeededRandom::new(caller));
            let downstream = |_| {
                let tally = Arc::clone(&tally);
                async move {
                    tokio::time::sleep(5 * MS).await;
                    let t = start.elapsed();
                    if (OUTAGE_START..OUTAGE_END).contains(&t) {
                        tally.outage_attempts.fetch_add(1, Ordering::Relaxed);
                        Err(())
                    } else {
                        if t >= OUTAGE_END {
                            tally.after_attempts.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(())
                    }
                }
            };
            let classify = |r: &Result<(), ()>| match r {
                Ok(()) => Outcome::Success,
                Err(()) => Outcome::Retryable,
            };
            // Callers start 5 ms apart so they do not move in lockstep.
            tokio::time::sleep(5 * MS * caller as u32).await;
            while start.elapsed() < RUN_FOR {
                let result = match &with_breaker {
                    Some(retrier) => retrier.run(downstream, classify).await,
                    None => without.run(downstream, classify).await,
                };
                let after = start.elapsed() >= OUTAGE_END;
                match result {
                    Ok(()) if after => {
                        tally.after_successes.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) if e.reason() == StopReason::BreakerOpen => {
                        assert!(matches!(e.last(), Failure::Refused(_)));
                        let counter = if after {
                            &tally.rejected_after
                        } else {
                            &tally.rejected_during
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
                tokio::time::sleep(100 * MS).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    tally
}

fn outage_breaker(changes: &Arc<Changes>) -> Arc<CircuitBreaker<Arc<Changes>>> {
    let config = BreakerConfig::new(HealthConfig::time(Duration::from_secs(10), 10))
        .with_failure_ratio(0.5)
        .with_minimum_throughput(20)
        .with_open_duration(OPEN_FOR)
        .with_permitted_probes(PROBES);
    Arc::new(
        CircuitBreaker::new(config, Clock::tokio())
            .unwrap()
            .with_seed(1)
            .with_observer(Arc::clone(changes)),
    )
}

#[tokio::test(start_paused = true)]
async fn breaker_bounds_attempts_during_an_outage_and_probes_bring_traffic_back() {
    let baseline = outage(None).await;
    let changes = Arc::new(Changes {
        start: Instant::now(),
        log: Mutex::new(Vec::new()),
    });
    let breaker = outage_breaker(&changes);
    let tally = outage(Some(Arc::clone(&breaker))).await;
    let log = changes.log.lock().unwrap().clone();

    // It opened once on the failure ratio, during the outage, with the window's totals...
    let (opened_at, first_open) = log[0];
    assert_eq!(first_open.cause, Cause::FailureRatio);
    assert!(
        (OUTAGE_START..OUTAGE_END).contains(&opened_at),
        "{opened_at:?}"
    );
    let failures_to_open = first_open.counts.unwrap().failures;
    // ...and every later change during the outage is a probe period that failed.
    let half_opens_in_outage = log
        .iter()
        .filter(|(t, c)| *t < OUTAGE_END && c.to == BreakerState::HalfOpen)
        .count() as u64;
    assert!(
        log.iter()
            .filter(|(t, _)| *t < OUTAGE_END)
            .skip(1)
            .all(|(_, c)| matches!(c.cause, Cause::OpenElapsed | Cause::ProbeFailed)),
        "{log:#?}"
    );

    // The downstream saw: the failures that opened the breaker (all still in the 10 s
    // window), at most one attempt per caller already admitted when it opened, and the
    // probes of each half-open period.
    let outage_attempts = tally.outage_attempts.load(Ordering::Relaxed);
    let bound = failures_to_open + CALLERS + u64::from(PROBES) * half_opens_in_outage;
    assert!(
        outage_attempts <= bound,
        "{outage_attempts} attempts during the outage; bound {bound}"
    );
    eprintln!(
        "outage: {outage_attempts} attempts with the breaker (bound {bound}: {failures_to_open} \
         failures to open, {half_opens_in_outage} probe periods), {} without",
        baseline.outage_attempts.load(Ordering::Relaxed)
    );
    // A probe period every open duration at most.
    assert!(half_opens_in_outage <= (OUTAGE_END - opened_at).as_secs() / OPEN_FOR.as_secs() + 1);
    // Without the breaker every call retries 4 times for the whole 30 s.
    let without = baseline.outage_attempts.load(Ordering::Relaxed);
    assert!(
        outage_attempts * 4 < without,
        "with breaker {outage_attempts}, without {without}"
    );
    assert!(tally.rejected_during.load(Ordering::Relaxed) > 0);

    // After the outage the next probes succeed and close the breaker; traffic resumes.
    let (closed_at, closed) = *log
        .iter()
        .find(|(t, c)| *t >= OUTAGE_END && c.to == BreakerState::Closed)
        .expect("closed after the outage");
    assert_eq!(closed.cause, Cause::ProbesSucceeded);
    assert!(closed_at <= OUTAGE_END + OPEN_FOR + SEC, "{closed_at:?}");
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(log.last().unwrap().1.to, BreakerState::Closed);
    let after = tally.after_successes.load(Ordering::Relaxed);
    // 20 callers, 10 calls per second each, for most of the last 20 s.
    assert!(
        after > CALLERS * 10 * 15,
        "{after} successes after recovery"
    );
    assert!(tally.after_attempts.load(Ordering::Relaxed) >= after);
}

#[tokio::test(start_paused = true)]
async fn open_duration_and_probes_follow_paused_time() {
    let config = BreakerConfig::new(HealthConfig::count(4))
        .with_minimum_throughput(4)
        .with_open_duration(10 * SEC)
        .with_growth(2.0, 40 * SEC)
        .with_permitted_probes(2);
    let breaker = CircuitBreaker::new(config, Clock::tokio()).unwrap();
    for _ in 0..4 {
        breaker
            .try_acquire()
            .unwrap()
            .record(Outcome::Retryable, MS);
    }
    assert_eq!(breaker.state(), BreakerState::Open);

    tokio::time::advance(10 * SEC - MS).await;
    let rejected = breaker.try_acquire().unwrap_err();
    assert_eq!(
        (rejected.reason, rejected.retry_after),
        (Rejection::Open, MS)
    );
    tokio::time::advance(MS).await;
    let p1 = breaker.try_acquire().unwrap();
    let p2 = breaker.try_acquire().unwrap();
    assert!(p1.is_probe() && p2.is_probe());
    assert_eq!(
        breaker.try_acquire().unwrap_err().reason,
        Rejection::ProbesBusy
    );
    // A probe that fails reopens, for twice as long.
    p1.record(Outcome::InDoubt, SEC);
    drop(p2);
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(breaker.try_acquire().unwrap_err().retry_after, 20 * SEC);
    tokio::time::advance(20 * SEC).await;
    for _ in 0..2 {
        breaker.try_acquire().unwrap().record(Outcome::Success, MS);
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_retry_is_not_sent_into_a_breaker_that_opened_during_the_backoff() {
    let config = BreakerConfig::new(HealthConfig::count(4))
        .with_minimum_throughput(4)
        .with_open_duration(10 * SEC);
    let breaker = Arc::new(CircuitBreaker::new(config, Clock::tokio()).unwrap());
    let retrier = Retrier::new(RetryPolicy::new(5).with_backoff(Backoff::fixed(SEC)))
        .expect("a valid policy")
        .with_breaker(Arc::clone(&breaker));
    let sent = Arc::new(AtomicU64::new(0));
    let call = {
        let sent = Arc::clone(&sent);
        retrier.run(
            move |_| {
                let sent = Arc::clone(&sent);
                async move {
                    sent.fetch_add(1, Ordering::Relaxed);
                    Err::<(), _>(())
                }
            },
            |_: &Result<(), ()>| Outcome::Retryable,
        )
    };
    // Another caller's failures open the breaker while the first call waits to retry.
    let other = async {
        tokio::time::sleep(SEC / 2).await;
        for _ in 0..3 {
            breaker
                .try_acquire()
                .unwrap()
                .record(Outcome::Retryable, MS);
        }
    };
    let (result, ()) = tokio::join!(call, other);
    let err = result.unwrap_err();
    assert_eq!(err.reason(), StopReason::BreakerOpen);
    assert_eq!(err.attempts(), 1);
    assert_eq!(sent.load(Ordering::Relaxed), 1);
    assert_eq!(
        breaker.window().snapshot().calls,
        4,
        "each attempt is one call"
    );
}

#[tokio::test(start_paused = true)]
async fn each_attempt_records_its_elapsed_time_on_the_breakers_clock() {
    let breaker = Arc::new(
        CircuitBreaker::new(
            BreakerConfig::new(HealthConfig::count(10)).with_minimum_throughput(10),
            Clock::tokio(),
        )
        .unwrap(),
    );
    let retrier = Retrier::new(
        RetryPolicy::new(3)
            .with_backoff(Backoff::fixed(SEC))
            .with_per_try_timeout(300 * MS)
            .with_idempotent(true),
    )
    .expect("a valid policy")
    .with_breaker(Arc::clone(&breaker));
    let err = retrier
        .run(
            |a| async move {
                // The first two attempts hang until the per-try timeout; the third takes 20 ms.
                let wait = if a.number < 3 { 10 * SEC } else { 20 * MS };
                tokio::time::sleep(wait).await;
                Err::<(), _>(())
            },
            |_: &Result<(), ()>| Outcome::NeverRetry,
        )
        .await
        .unwrap_err();
    assert_eq!(err.reason(), StopReason::NeverRetry);
    let counts = breaker.window().snapshot();
    assert_eq!(
        (counts.calls, counts.in_doubt, counts.never_retry),
        (3, 2, 1)
    );
    let p100 = breaker.window().latency_percentile(1.0).unwrap();
    assert!(p100 >= 300 * MS && p100 < 375 * MS, "{p100:?}");
    let p0 = breaker.window().latency_percentile(0.0).unwrap();
    assert!(p0 >= 20 * MS && p0 < 25 * MS, "{p0:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_share_one_breaker() {
    const TASKS: u64 = 64;
    const CALLS: u64 = 500;
    let clock = ManualClock::new();
    let config = BreakerConfig::new(HealthConfig::time(Duration::from_secs(10), 10))
        .with_minimum_throughput(100)
        .with_failure_ratio(0.5);
    let breaker = Arc::new(CircuitBreaker::new(config, clock.clock()).unwrap());
    // Healthy traffic from many tasks on two worker threads: every call admitted, every call
    // counted exactly once.
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let breaker = Arc::clone(&breaker);
            tokio::spawn(async move {
                for i in 0..CALLS {
                    let permit = breaker.try_acquire_owned().unwrap();
                    tokio::task::yield_now().await;
                    permit.record(Outcome::Success, Duration::from_micros(i));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let counts = breaker.window().snapshot();
    assert_eq!(
        (counts.calls, counts.successes),
        (TASKS * CALLS, TASKS * CALLS)
    );
    assert_eq!(breaker.state(), BreakerState::Closed);

    // Then everything fails: the tasks stop as soon as the breaker opens, and the window
    // held at least as many failures as successes when it did.
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let breaker = Arc::clone(&breaker);
            tokio::spawn(async move {
                let mut sent = 0u64;
                while let Ok(permit) = breaker.try_acquire_owned() {
                    tokio::task::yield_now().await;
                    permit.record(Outcome::Retryable, MS);
                    sent += 1;
                }
                sent
            })
        })
        .collect();
    let mut failed = 0;
    for t in tasks {
        failed += t.await.unwrap();
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    assert!(failed >= TASKS * CALLS, "{failed}");
    assert!(
        failed <= TASKS * CALLS + TASKS,
        "{failed}: at most one late call per task"
    );
}
