//! Retry budgets under load, on a test clock: the seeds' Q5, gRPC A6's threshold, recovery and
//! the AWS quota.
//!
//! Load model: one request per millisecond (1000 QPS); a request fails when the failure pattern
//! says so, and every failed request asks the budget for one retry. Failures are spread evenly
//! (request *i* fails when ⌊(i+1)·f⌋ > ⌊i·f⌋), so the figures are exact, not statistical.

use std::time::Duration;

use stormguard::budget::{RatioBudget, RetryBudget, TokenBucket, Withdrawal};
use stormguard::clock::ManualClock;

fn fails(i: u64, rate: f64) -> bool {
    ((i + 1) as f64 * rate).floor() > (i as f64 * rate).floor()
}

/// Runs `requests` at 1000 QPS; returns, per request index, whether a retry was allowed
/// (`None` when the request succeeded).
fn drive<B: RetryBudget>(budget: &B, requests: u64, rate: f64) -> Vec<Option<bool>> {
    (0..requests)
        .map(|i| {
            budget.request_started();
            let decision = if fails(i, rate) {
                budget.record_failure();
                Some(budget.withdraw(Withdrawal::Retry).is_ok())
            } else {
                budget.record_success(None);
                None
            };
            budget.request_finished();
            decision
        })
        .collect()
}

/// Milliseconds until the first refused retry.
fn first_refusal_ms(decisions: &[Option<bool>]) -> usize {
    decisions
        .iter()
        .position(|d| *d == Some(false))
        .expect("the budget refused at some point")
}

fn allowed(decisions: &[Option<bool>]) -> usize {
    decisions.iter().filter(|d| **d == Some(true)).count()
}

#[test]
fn seeds_q5_spend_per_retry_bucket_runs_dry_in_about_20ms() {
    // 1000 QPS, 50 % failures, maxTokens 10, ratio 0.1, a retry costs 1: 50 tokens/s come in,
    // 500/s are wanted, the 10 tokens last 10 / 450 s ≈ 22 ms.
    let bucket = TokenBucket::spend_per_retry(10, 0.1).expect("valid");
    let decisions = drive(&bucket, 1000, 0.5);
    let stop = first_refusal_ms(&decisions);
    assert!((18..=25).contains(&stop), "ran dry after {stop} ms");
    // Afterwards retries are pinned to what successes pay for: 0.1 per success, about 50/s
    // instead of the 500/s that failures ask for.
    let rest = allowed(&decisions[stop..]);
    assert!(
        (45..=50).contains(&rest),
        "{rest} retries in the rest of the second"
    );
}

#[test]
fn grpc_a6_stops_after_about_11ms_at_the_same_load() {
    // Each failure costs 1 and retries need more than 5 tokens: 5 / 450 s ≈ 11 ms.
    let bucket = TokenBucket::grpc(10, 0.1).expect("valid");
    let decisions = drive(&bucket, 1000, 0.5);
    let stop = first_refusal_ms(&decisions);
    assert!((10..=13).contains(&stop), "stopped after {stop} ms");
    assert_eq!(
        allowed(&decisions[stop..]),
        0,
        "stops for good at 50 % failures"
    );
}

#[test]
fn grpc_a6_stops_for_good_above_r_over_1_plus_r() {
    // With ratio r a failure costs 1 and a success earns r: the balance drifts down when the
    // failure rate exceeds r / (1 + r) = 9.09 % for r = 0.1.
    let steady_state_retries = |rate: f64| {
        let bucket = TokenBucket::grpc(10, 0.1).expect("valid");
        let decisions = drive(&bucket, 200_000, rate);
        allowed(&decisions[100_000..])
    };
    for rate in [0.0925, 0.10, 0.2] {
        assert_eq!(steady_state_retries(rate), 0, "failure rate {rate}");
    }
    for rate in [0.05, 0.08, 0.0895] {
        let expected = (100_000.0 * rate) as usize;
        let got = steady_state_retries(rate);
        assert!(
            got + 1 >= expected,
            "failure rate {rate}: {got} of {expected}"
        );
    }
}

#[test]
fn grpc_a6_recovery_from_zero_needs_51_successes() {
    let bucket = TokenBucket::grpc(10, 0.1).expect("valid");
    drive(&bucket, 100, 1.0);
    assert_eq!(bucket.milli_tokens(), 0);
    let successes_needed = (1..)
        .find(|_| {
            bucket.record_success(None);
            bucket.withdraw(Withdrawal::Retry).is_ok()
        })
        .expect("recovers");
    assert_eq!(successes_needed, 51);
}

#[test]
fn aws_quota_in_a_total_outage() {
    let bucket = TokenBucket::aws_standard();
    assert_eq!(allowed(&drive(&bucket, 10_000, 1.0)), 100);
    let bucket = TokenBucket::aws_standard();
    let timeouts = (0..10_000)
        .filter(|_| bucket.withdraw(Withdrawal::TimeoutRetry).is_ok())
        .count();
    assert_eq!(timeouts, 50);
}

#[test]
fn ratio_budget_settles_near_its_percent_and_forgets_after_ttl() {
    let clock = ManualClock::new();
    let budget = RatioBudget::new(0.2, Duration::from_secs(10), 10, clock.clock()).expect("valid");
    // 1000 QPS, 50 % failures, for 30 s.
    let mut retries = 0;
    for i in 0..30_000u64 {
        budget.request_started();
        if fails(i, 0.5) && budget.withdraw(Withdrawal::Retry).is_ok() {
            retries += 1;
        }
        clock.advance(Duration::from_millis(1));
    }
    // 20 % of 30 000 requests plus a reserve of 100 retries per 10 s window.
    let ratio = f64::from(retries) / 30_000.0;
    assert!(
        (0.20..=0.215).contains(&ratio),
        "retries were {ratio} of requests"
    );
    // After a quiet ttl only the reserve is left.
    clock.advance(Duration::from_secs(10));
    assert_eq!(budget.available(), 100.0);
}
