//! `CircuitBreakerLayer` around in-process tower services, under tokio's paused clock: HTTP
//! statuses open the breaker, rejected requests never reach the inner service, the 503 option,
//! probes after the open duration, abandoned probes, generic (non-HTTP) services with a
//! closure classifier, and many tasks sharing one breaker.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use stormguard::breaker::{BreakerConfig, BreakerState, CircuitBreaker, Rejection};
use stormguard::classify::Outcome;
use stormguard::clock::Clock;
use stormguard::health::HealthConfig;
use stormguard_tower::breaker::{BreakerError, CircuitBreakerLayer};
use stormguard_tower::reject::REJECTED_BY;
use tower::{Layer, Service, ServiceExt};

const SEC: Duration = Duration::from_secs(1);

fn breaker(probes: u32) -> Arc<CircuitBreaker> {
    let config = BreakerConfig::new(HealthConfig::count(4))
        .with_minimum_throughput(4)
        .with_open_duration(10 * SEC)
        .with_permitted_probes(probes);
    Arc::new(CircuitBreaker::new(config, Clock::tokio()).unwrap())
}

/// An HTTP backend answering with the status in `status`, counting the requests it sees.
fn backend(
    status: Arc<AtomicU16>,
    seen: Arc<AtomicU64>,
) -> impl Service<(), Response = http::Response<String>, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(move |()| {
        let (status, seen) = (Arc::clone(&status), Arc::clone(&seen));
        async move {
            seen.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let code = status.load(Ordering::Relaxed);
            Ok(http::Response::builder()
                .status(code)
                .body(String::new())
                .unwrap())
        }
    })
}

#[tokio::test(start_paused = true)]
async fn failing_statuses_open_the_breaker_and_rejections_skip_the_service() {
    let status = Arc::new(AtomicU16::new(503));
    let seen = Arc::new(AtomicU64::new(0));
    let breaker = breaker(1);
    let mut svc = CircuitBreakerLayer::new(Arc::clone(&breaker))
        .layer(backend(Arc::clone(&status), Arc::clone(&seen)));
    for _ in 0..4 {
        let response = svc.ready().await.unwrap().call(()).await.unwrap();
        assert_eq!(response.status(), 503);
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    let window = breaker.window().snapshot();
    assert_eq!((window.calls, window.retryable), (4, 4));
    // The latency of each call was recorded on the breaker's (paused) clock.
    let p50 = breaker.window().latency_percentile(0.5).unwrap();
    assert!(
        p50 >= Duration::from_millis(20) && p50 < Duration::from_millis(25),
        "{p50:?}"
    );

    let err = svc.ready().await.unwrap().call(()).await.unwrap_err();
    let open = *err.open().unwrap();
    assert_eq!((open.reason, open.retry_after), (Rejection::Open, 10 * SEC));
    assert_eq!(
        seen.load(Ordering::Relaxed),
        4,
        "the rejected request was not sent"
    );
    assert!(err.to_string().contains("retry after"));
}

#[tokio::test(start_paused = true)]
async fn http_503_option_answers_with_retry_after() {
    let status = Arc::new(AtomicU16::new(502));
    let seen = Arc::new(AtomicU64::new(0));
    let breaker = breaker(1);
    let mut svc = CircuitBreakerLayer::new(Arc::clone(&breaker))
        .with_http_503()
        .layer(backend(status, Arc::clone(&seen)));
    for _ in 0..4 {
        svc.ready().await.unwrap().call(()).await.unwrap();
    }
    tokio::time::advance(SEC + Duration::from_millis(500)).await;
    let response = svc.ready().await.unwrap().call(()).await.unwrap();
    assert_eq!(response.status(), 503);
    // 10 s open, 1.58 s of it gone (4 calls of 20 ms, then 1.5 s): 8.42 s, rounded up.
    assert_eq!(response.headers()["retry-after"], "9");
    assert_eq!(response.headers()[REJECTED_BY], "circuit-open");
    assert_eq!(seen.load(Ordering::Relaxed), 4);
}

#[tokio::test(start_paused = true)]
async fn probes_after_the_open_duration_close_the_breaker() {
    let status = Arc::new(AtomicU16::new(504));
    let seen = Arc::new(AtomicU64::new(0));
    let breaker = breaker(2);
    let mut svc = CircuitBreakerLayer::new(Arc::clone(&breaker))
        .layer(backend(Arc::clone(&status), Arc::clone(&seen)));
    for _ in 0..4 {
        svc.ready().await.unwrap().call(()).await.unwrap();
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    status.store(200, Ordering::Relaxed);
    tokio::time::advance(10 * SEC).await;

    // Two probes in flight at once; a third request is rejected while they are out.
    let p1 = svc.ready().await.unwrap().call(());
    let p2 = svc.ready().await.unwrap().call(());
    let err = svc.ready().await.unwrap().call(()).await.unwrap_err();
    assert_eq!(err.open().unwrap().reason, Rejection::ProbesBusy);
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    let (r1, r2) = tokio::join!(p1, p2);
    assert_eq!(r1.unwrap().status(), 200);
    assert_eq!(r2.unwrap().status(), 200);
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(seen.load(Ordering::Relaxed), 6);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_gives_its_slot_back() {
    let status = Arc::new(AtomicU16::new(503));
    let seen = Arc::new(AtomicU64::new(0));
    let breaker = breaker(1);
    let mut svc = CircuitBreakerLayer::new(Arc::clone(&breaker))
        .layer(backend(Arc::clone(&status), Arc::clone(&seen)));
    for _ in 0..4 {
        svc.ready().await.unwrap().call(()).await.unwrap();
    }
    tokio::time::advance(10 * SEC).await;
    // The caller gives up on the probe before it answers (a timeout layer above, say).
    let probe = svc.ready().await.unwrap().call(());
    assert!(
        tokio::time::timeout(Duration::from_millis(5), probe)
            .await
            .is_err()
    );
    assert_eq!(
        breaker.window().snapshot().calls,
        4,
        "abandoned: not recorded"
    );
    status.store(200, Ordering::Relaxed);
    let response = svc.ready().await.unwrap().call(()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[derive(Debug, PartialEq)]
enum DbError {
    Unavailable,
    NotFound,
}

#[tokio::test(start_paused = true)]
async fn generic_services_use_a_closure_classifier() {
    let breaker = breaker(1);
    let classify = |r: &Result<u32, DbError>| match r {
        Ok(_) => Outcome::Success,
        Err(DbError::NotFound) => Outcome::NeverRetry,
        Err(DbError::Unavailable) => Outcome::Retryable,
    };
    let mut svc = CircuitBreakerLayer::new(Arc::clone(&breaker))
        .with_classifier(classify)
        .layer(tower::service_fn(|key: u32| async move {
            match key {
                0 => Err(DbError::NotFound),
                1 => Err(DbError::Unavailable),
                k => Ok(k),
            }
        }));
    // Not-found answers are calls, not failures: they never open the breaker.
    for _ in 0..8 {
        let err = svc.ready().await.unwrap().call(0).await.unwrap_err();
        assert!(matches!(err, BreakerError::Service(DbError::NotFound)));
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    // The window now holds the last 4 calls: 2 not-found, 2 unavailable: 50 % opens it.
    for _ in 0..2 {
        let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
        assert_eq!(err.into_service(), Some(DbError::Unavailable));
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    assert!(
        svc.ready()
            .await
            .unwrap()
            .call(7)
            .await
            .unwrap_err()
            .open()
            .is_some()
    );
}

#[tokio::test(start_paused = true)]
async fn many_tasks_share_the_layer() {
    const TASKS: u64 = 50;
    const CALLS: u64 = 20;
    let config = BreakerConfig::new(HealthConfig::time(10 * SEC, 10))
        .with_minimum_throughput(100)
        .with_open_duration(10 * SEC);
    let breaker = Arc::new(CircuitBreaker::new(config, Clock::tokio()).unwrap());
    let status = Arc::new(AtomicU16::new(200));
    let seen = Arc::new(AtomicU64::new(0));
    let svc = CircuitBreakerLayer::new(Arc::clone(&breaker))
        .layer(backend(Arc::clone(&status), Arc::clone(&seen)));
    let run = |calls: u64| {
        (0..TASKS)
            .map(|_| {
                let mut svc = svc.clone();
                tokio::spawn(async move {
                    let mut rejected = 0u64;
                    for _ in 0..calls {
                        match svc.ready().await.unwrap().call(()).await {
                            Ok(_) => {}
                            Err(BreakerError::Open(_)) => rejected += 1,
                            Err(BreakerError::Service(e)) => match e {},
                        }
                    }
                    rejected
                })
            })
            .collect::<Vec<_>>()
    };
    let mut rejected = 0;
    for t in run(CALLS) {
        rejected += t.await.unwrap();
    }
    assert_eq!(rejected, 0);
    assert_eq!(breaker.window().snapshot().successes, TASKS * CALLS);

    // The backend starts failing: the breaker opens and the tasks are turned away.
    status.store(503, Ordering::Relaxed);
    let before = seen.load(Ordering::Relaxed);
    let mut rejected = 0;
    for t in run(2 * CALLS) {
        rejected += t.await.unwrap();
    }
    let sent = seen.load(Ordering::Relaxed) - before;
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(sent + rejected, 2 * TASKS * CALLS);
    // 1000 successes in the window: 1000 failures open it (50 %), plus at most one call per
    // task already in flight then.
    assert!(
        (TASKS * CALLS..=TASKS * CALLS + TASKS).contains(&sent),
        "{sent} sent"
    );
}
