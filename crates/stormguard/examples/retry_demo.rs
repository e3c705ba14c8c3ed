//! What stormguard's retrier does when a downstream fails, on a virtual clock.
//!
//! Part ① is the seeds' example: a request arrives with 250 ms left, every downstream call
//! takes 60 ms and fails with 503, the policy allows 5 attempts. The retrier makes 3 calls and
//! stops because the 41 ms left cannot fit a backoff wait plus another 60 ms call.
//!
//! Part ② is a client population at 1000 requests/s whose downstream drops from 99 % to 50 %
//! success at t = 1 s: the shared retry budget shuts retries off within milliseconds, for
//! each kind of budget.
//!
//! Time is tokio's paused clock (part ①) and a manual clock (part ②), so the run takes no
//! wall time and prints the same thing every time.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use stormguard::backoff::Backoff;
use stormguard::budget::{ConcurrencyBudget, RatioBudget, RetryBudget, TokenBucket};
use stormguard::classify::{Outcome, classify_http_status};
use stormguard::clock::{Clock, ManualClock};
use stormguard::deadline::{self, Deadline};
use stormguard::retry::{
    AttemptOutcome, Decision, Retrier, RetryObserver, RetryPolicy, RetryReason, RetryRun,
    SeededRandom, StopReason,
};

const MS: Duration = Duration::from_millis(1);

/// Prints every attempt with its virtual start time.
struct Printer {
    start: tokio::time::Instant,
}

impl RetryObserver for Printer {
    fn attempt_started(&self, attempt: u32) {
        println!(
            "    t={:>4} ms  attempt {attempt} sent",
            self.start.elapsed().as_millis()
        );
    }
    fn attempt_ended(&self, attempt: u32, ended: &AttemptOutcome) {
        println!(
            "    t={:>4} ms  attempt {attempt} ended: {}",
            self.start.elapsed().as_millis(),
            ended.outcome.label()
        );
    }
    fn retry_scheduled(&self, next: u32, delay: Duration, reason: RetryReason) {
        println!(
            "               retry {next} in {} ms ({})",
            delay.as_millis(),
            reason.label()
        );
    }
    fn gave_up(&self, attempts: u32, reason: StopReason) {
        println!(
            "    t={:>4} ms  gave up after {attempts} attempts: {}",
            self.start.elapsed().as_millis(),
            reason.label()
        );
    }
}

async fn example_one() {
    println!(
        "① deadline-aware retry: 250 ms budget, 60 ms calls that fail with 503, maxAttempts 5"
    );
    let policy = RetryPolicy::new(5)
        .with_backoff(Backoff::exponential(20 * MS).with_cap(200 * MS))
        .with_min_call(60 * MS);
    let budget = Arc::new(TokenBucket::spend_per_retry(10, 0.1).expect("valid budget"));
    let retrier = Retrier::new(policy)
        .expect("a valid policy")
        .with_budget(Arc::clone(&budget))
        .with_random(SeededRandom::new(7))
        .with_observer(Printer {
            start: tokio::time::Instant::now(),
        });
    let call = retrier.run_report(
        Default::default(),
        |_| async {
            tokio::time::sleep(60 * MS).await;
            Ok::<u16, ()>(503)
        },
        |r: &Result<u16, ()>| r.map_or(Outcome::NeverRetry, |s| classify_http_status(s, None)),
    );
    let report = deadline::scope(Deadline::after(250 * MS, Clock::tokio()), call).await;
    println!(
        "    result: {:?} after {} calls ({}), {:.1} tokens left in the budget\n",
        report.result,
        report.attempts,
        report.stop.label(),
        budget.tokens()
    );
}

/// 1000 requests/s for 3 s; success drops from 99 % to 50 % at t = 1 s. Every failed attempt
/// may retry up to 3 times (4 attempts) through the budget. Prints retries per 250 ms.
fn budget_run(name: &str, budget: &dyn RetryBudget, clock: &ManualClock) {
    let policy = RetryPolicy::new(4).with_backoff(Backoff::fixed(Duration::ZERO));
    let mut rng = SmallRng::seed_from_u64(42);
    let mut row = Vec::new();
    let (mut sent, mut retries, mut shut_off_at) = (0u32, 0u32, None);
    for ms in 0..3000u32 {
        let success_rate = if ms < 1000 { 0.99 } else { 0.5 };
        let mut run = RetryRun::start(&policy, budget, true);
        loop {
            let ok = (rng.next_u32() as f64) < success_rate * f64::from(u32::MAX);
            let outcome = if ok {
                Outcome::Success
            } else {
                Outcome::Retryable
            };
            match run.finish_attempt(outcome.into(), || None, &mut rng) {
                Decision::Retry { .. } => retries += 1,
                Decision::Stop(StopReason::BudgetExhausted) if ms >= 1000 => {
                    shut_off_at.get_or_insert(ms - 1000);
                    break;
                }
                Decision::Stop(_) => break,
            }
        }
        sent += run.attempts();
        drop(run);
        clock.advance(MS);
        if ms % 250 == 249 {
            row.push(format!("{retries:>5}"));
            retries = 0;
        }
    }
    println!(
        "    {name:<25}{}   load {:.2}x   retries refused {} after the drop",
        row.join(""),
        f64::from(sent) / 3000.0,
        shut_off_at.map_or("never".into(), |ms| format!("from {ms} ms"))
    );
}

fn budgets() {
    println!("② retries per 250 ms at 1000 QPS, success 99 % → 50 % at t = 1 s, 4 attempts each");
    println!(
        "    {:<25}{}",
        "budget        t (ms) =",
        (1..=12)
            .map(|q| format!("{:>5}", q * 250))
            .collect::<String>()
    );
    let clock = ManualClock::new();
    budget_run("none", &stormguard::budget::Unlimited, &clock);
    budget_run(
        "gRPC A6 (10, 0.1)",
        &TokenBucket::grpc(10, 0.1).expect("valid"),
        &clock,
    );
    budget_run(
        "spend-per-retry (10,0.1)",
        &TokenBucket::spend_per_retry(10, 0.1).expect("valid"),
        &clock,
    );
    budget_run("AWS standard quota", &TokenBucket::aws_standard(), &clock);
    budget_run(
        "ratio 20 % / 10 s",
        &RatioBudget::finagle_default(clock.clock()),
        &clock,
    );
    budget_run(
        "Envoy concurrency",
        &ConcurrencyBudget::envoy_default(),
        &clock,
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a tokio runtime");
    runtime.block_on(example_one());
    budgets();
}
