//! One budget shared by many tasks on a multi-threaded runtime, through the client stack: the
//! retry bound holds under contention, and a concurrency budget's counts return to zero when
//! calls are cancelled in the middle of their retries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::budget::{ConcurrencyBudget, RetryBudget, TokenBucket};
use stormguard::policy::EndpointPolicy;
use stormguard::retry::RetryPolicy;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::ClientLayerBuilder;
use tower::{Layer, ServiceExt, service_fn};

/// Retries at once (no wait), up to `attempts` attempts per call.
fn eager(attempts: u32) -> EndpointPolicy {
    EndpointPolicy::new(
        RetryPolicy::new(attempts)
            .with_idempotent(true)
            .with_backoff(Backoff::fixed(Duration::ZERO).with_jitter(Jitter::None)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_bucket_bounds_the_retries_of_every_task() {
    // The seeds' bucket: 20 tokens, each retry spends one, and nothing succeeds to refund any.
    let bucket = Arc::new(TokenBucket::spend_per_retry(20, 0.1).unwrap());
    let seen = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&seen);
    let always_503 = service_fn(move |_req: Request<ReplayBody<Full<Bytes>>>| {
        counted.fetch_add(1, Ordering::Relaxed);
        async {
            // Interleave the tasks on both workers without a timer.
            tokio::task::yield_now().await;
            let mut response = Response::new(Full::<Bytes>::default());
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            Ok::<_, Infallible>(response)
        }
    });
    let stack = ClientLayerBuilder::single("flaky", eager(5))
        .with_budget(bucket.clone())
        .with_observer(())
        .build()
        .unwrap()
        .layer(always_503);
    const TASKS: u64 = 64;
    const CALLS: u64 = 20;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let stack = stack.clone();
            tokio::spawn(async move {
                for _ in 0..CALLS {
                    let request = Request::get("http://flaky/").body(Full::default()).unwrap();
                    let response = stack.clone().oneshot(request).await.unwrap();
                    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let calls = TASKS * CALLS;
    let retries = seen.load(Ordering::Relaxed) - calls;
    // 4 retries allowed per call by the policy: 5,120 without the budget.
    assert!(retries <= 20, "{retries} retries from a 20-token bucket");
    assert_eq!(retries, 20, "every token is spent, none twice");
    assert_eq!(bucket.milli_tokens(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_budget_returns_to_zero_after_cancellations() {
    let budget = Arc::new(ConcurrencyBudget::new(20.0, 3).unwrap());
    // Every call's first attempt fails; its retry never answers, until the task is aborted.
    let attempts = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&attempts);
    let stuck_retries = service_fn(move |req: Request<ReplayBody<Full<Bytes>>>| {
        counted.fetch_add(1, Ordering::Relaxed);
        let retry = req.headers()["x-stormguard-attempt"] != "1";
        async move {
            if retry {
                std::future::pending::<()>().await;
            }
            let mut response = Response::new(Full::<Bytes>::default());
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            Ok::<_, Infallible>(response)
        }
    });
    let shared: Arc<dyn RetryBudget> = budget.clone();
    let stack = ClientLayerBuilder::single("stuck", eager(3))
        .with_budget(shared)
        .with_observer(())
        .build()
        .unwrap()
        .layer(stuck_retries);
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let stack = stack.clone();
            tokio::spawn(async move {
                let request = Request::get("http://stuck/").body(Full::default()).unwrap();
                stack.oneshot(request).await
            })
        })
        .collect();
    // Wait (without a timer) until every call has settled: either its retry was refused and the
    // call ended with the 503, or its retry is in flight and stuck.
    let settled = |tasks: &[tokio::task::JoinHandle<_>]| {
        let ended = tasks.iter().filter(|task| task.is_finished()).count() as u64;
        ended + budget.active_retries() == 100
            && budget.active_requests() == budget.active_retries()
    };
    while !settled(&tasks) {
        tokio::task::yield_now().await;
    }
    let in_flight_retries = budget.active_retries();
    assert!(
        (1..=20).contains(&in_flight_retries),
        "active retries {in_flight_retries} above 20 % of 100 active requests (3 always allowed)"
    );
    assert_eq!(attempts.load(Ordering::Relaxed), 100 + in_flight_retries);
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        // A call whose retry was refused had already ended with its 503.
        match task.await {
            Ok(answer) => assert_eq!(answer.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE),
            Err(aborted) => assert!(aborted.is_cancelled()),
        }
    }
    assert_eq!(
        budget.active_requests(),
        0,
        "every cancelled call released its request"
    );
    assert_eq!(
        budget.active_retries(),
        0,
        "every cancelled retry released its share"
    );
}
