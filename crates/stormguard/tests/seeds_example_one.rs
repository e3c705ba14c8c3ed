//! The seeds' example ①, run by the real retrier under tokio's paused clock.
//!
//! 250 ms deadline, every call takes 60 ms and fails with 503, maxAttempts 5, base 20 ms,
//! cap 200 ms, full jitter whose draws are 17 ms and 12 ms, minimum call 60 ms, budget
//! (10, 0.1): exactly 3 calls (60 + 17 + 60 + 12 + 60 = 209 ms; the 41 ms left cannot fit a
//! wait plus a 60 ms call), and 8.0 tokens left.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use rand::RngCore;
use stormguard::backoff::Backoff;
use stormguard::budget::TokenBucket;
use stormguard::classify::{Outcome, classify_http_status};
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline};
use stormguard::retry::{
    AttemptOutcome, RandomSource, Retrier, RetryObserver, RetryPolicy, RetryReason, StopReason,
};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

/// Hands out a value that makes `uniform[0, upper)` return exactly `target`.
fn draw(target: Duration, upper: Duration) -> u64 {
    let value = (target.as_nanos() << 64).div_ceil(upper.as_nanos());
    u64::try_from(value).expect("target below upper")
}

/// Replays fixed draws, then repeats the last one.
#[derive(Clone)]
struct Scripted(Arc<Mutex<Vec<u64>>>);

impl RngCore for Scripted {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        let mut draws = self.0.lock().expect("not poisoned");
        if draws.len() > 1 {
            draws.remove(0)
        } else {
            draws[0]
        }
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

impl RandomSource for Scripted {
    type Rng = Scripted;
    fn rng(&self) -> Scripted {
        self.clone()
    }
}

#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl RetryObserver for Log {
    fn attempt_ended(&self, attempt: u32, ended: &AttemptOutcome) {
        self.push(format!("attempt {attempt} ended {}", ended.outcome.label()));
    }
    fn retry_scheduled(&self, next: u32, delay: Duration, reason: RetryReason) {
        self.push(format!("retry {next} after {delay:?} ({})", reason.label()));
    }
    fn gave_up(&self, attempts: u32, reason: StopReason) {
        self.push(format!("gave up after {attempts}: {}", reason.label()));
    }
}

impl Log {
    fn push(&self, line: String) {
        self.0.lock().expect("not poisoned").push(line);
    }
}

#[tokio::test(start_paused = true)]
async fn three_calls_then_the_deadline_cannot_fit_another() {
    let policy = RetryPolicy::new(5)
        .with_backoff(Backoff::exponential(20 * MS).with_cap(200 * MS))
        .with_min_call(60 * MS);
    let budget = Arc::new(TokenBucket::spend_per_retry(10, 0.1).expect("valid budget"));
    let draws = Scripted(Arc::new(Mutex::new(vec![
        draw(17 * MS, 20 * MS),
        draw(12 * MS, 40 * MS),
        draw(MS, 80 * MS),
    ])));
    let log = Arc::new(Log::default());
    let retrier = Retrier::new(policy)
        .expect("a valid policy")
        .with_budget(Arc::clone(&budget))
        .with_random(draws)
        .with_observer(Arc::clone(&log));

    let start = Instant::now();
    let starts = Mutex::new(Vec::new());
    let call = retrier.run(
        |_attempt| {
            starts.lock().expect("not poisoned").push(start.elapsed());
            async {
                tokio::time::sleep(60 * MS).await;
                Ok::<u16, ()>(503)
            }
        },
        |r: &Result<u16, ()>| r.map_or(Outcome::NeverRetry, |s| classify_http_status(s, None)),
    );
    let deadline = Deadline::after(250 * MS, Clock::tokio());
    let report = deadline::scope(deadline, call).await;

    assert_eq!(report.expect("the last 503 is handed back"), 503);
    assert_eq!(
        *starts.lock().expect("not poisoned"),
        vec![Duration::ZERO, 77 * MS, 149 * MS]
    );
    assert_eq!(start.elapsed(), 209 * MS);
    assert_eq!(budget.tokens(), 8.0);
    assert_eq!(
        *log.0.lock().expect("not poisoned"),
        vec![
            "attempt 1 ended retryable",
            "retry 2 after 17ms (failed)",
            "attempt 2 ended retryable",
            "retry 3 after 12ms (failed)",
            "attempt 3 ended retryable",
            "gave up after 3: deadline_too_close",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn same_run_reports_the_stop_reason_and_attempts() {
    let policy = RetryPolicy::new(5)
        .with_backoff(Backoff::exponential(20 * MS).with_cap(200 * MS))
        .with_min_call(60 * MS);
    let retrier = Retrier::new(policy)
        .expect("a valid policy")
        .with_random(Scripted(Arc::new(Mutex::new(vec![
            draw(17 * MS, 20 * MS),
            draw(12 * MS, 40 * MS),
            draw(MS, 80 * MS),
        ]))));
    let call = retrier.run_with(
        stormguard::retry::Call::new().with_deadline(Deadline::after(250 * MS, Clock::tokio())),
        |_| async {
            tokio::time::sleep(60 * MS).await;
            Err::<(), _>("503 downstream unavailable")
        },
        |_: &Result<(), &str>| Outcome::Retryable,
    );
    let err = call.await.expect_err("every call fails");
    assert_eq!(err.reason(), StopReason::DeadlineTooClose);
    assert_eq!(err.attempts(), 3);
    assert_eq!(
        err.to_string(),
        "gave up after 3 attempts (deadline_too_close): 503 downstream unavailable"
    );
}
