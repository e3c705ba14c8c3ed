//! `AdmissionLayer` around in-process tower services, under tokio's paused clock (or a manual
//! clock): HTTP statuses open a breaker, refused requests never reach the inner service, the
//! 503 option, probes after the open duration, abandoned probes, non-HTTP responses with a
//! closure classifier, many tasks sharing one breaker; an overloaded backend gets throttled,
//! a healthy one never does; a breaker and a throttle as one gate; refusals and transitions
//! reach the observer.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Request;
use stormguard::admission::Refusal;
use stormguard::breaker::{BreakerConfig, BreakerState, CircuitBreaker, Rejection, StateChange};
use stormguard::classify::Outcome;
use stormguard::clock::{Clock, ManualClock};
use stormguard::health::HealthConfig;
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};
use stormguard_tower::admission::AdmissionLayer;
use stormguard_tower::observe::{BreakerEvents, CallInfo, Observer};
use stormguard_tower::wire::{BoxError, REJECTED_BY, RETRY_EXHAUSTED, refusal_of};
use tower::{Layer, Service, ServiceExt};

const SEC: Duration = Duration::from_secs(1);

fn breaker(probes: u32) -> Arc<CircuitBreaker> {
    let config = BreakerConfig::new(HealthConfig::count(4))
        .with_minimum_throughput(4)
        .with_open_duration(10 * SEC)
        .with_permitted_probes(probes);
    Arc::new(CircuitBreaker::new(config, Clock::tokio()).unwrap())
}

fn get() -> Request<()> {
    Request::new(())
}

fn refusal(err: &BoxError) -> Refusal {
    refusal_of(err.as_ref()).expect("a refusal")
}

/// An HTTP backend answering with the status in `status` after 20 ms, counting requests.
fn backend(
    status: Arc<AtomicU16>,
    seen: Arc<AtomicU64>,
) -> impl Service<Request<()>, Response = http::Response<String>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(move |_: Request<()>| {
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
async fn failing_statuses_open_the_breaker_and_refusals_skip_the_service() {
    let status = Arc::new(AtomicU16::new(503));
    let seen = Arc::new(AtomicU64::new(0));
    let breaker = breaker(1);
    let mut svc = AdmissionLayer::new(Arc::clone(&breaker))
        .layer(backend(Arc::clone(&status), Arc::clone(&seen)));
    for _ in 0..4 {
        let response = svc.ready().await.unwrap().call(get()).await.unwrap();
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

    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    let Refusal::BreakerOpen(open) = refusal(&err) else {
        panic!("{err}")
    };
    assert_eq!((open.reason, open.retry_after), (Rejection::Open, 10 * SEC));
    assert_eq!(
        seen.load(Ordering::Relaxed),
        4,
        "the refused request was not sent"
    );
    assert!(err.to_string().contains("retry after"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_retry_exhausted_mark_does_not_hide_a_failure() {
    // What a retry layer below answers when it gave up: still a 503 for the breaker.
    let breaker = breaker(1);
    let mut svc = AdmissionLayer::new(Arc::clone(&breaker)).layer(tower::service_fn(
        |_: Request<()>| async {
            Ok::<_, Infallible>(
                http::Response::builder()
                    .status(503)
                    .header(RETRY_EXHAUSTED, "true")
                    .body(())
                    .unwrap(),
            )
        },
    ));
    for _ in 0..4 {
        svc.ready().await.unwrap().call(get()).await.unwrap();
    }
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn http_503_option_answers_with_retry_after_and_the_marks() {
    let status = Arc::new(AtomicU16::new(502));
    let seen = Arc::new(AtomicU64::new(0));
    let breaker = breaker(1);
    let mut svc = AdmissionLayer::new(Arc::clone(&breaker))
        .with_http_503()
        .layer(backend(status, Arc::clone(&seen)));
    for _ in 0..4 {
        svc.ready().await.unwrap().call(get()).await.unwrap();
    }
    tokio::time::advance(SEC + Duration::from_millis(500)).await;
    let response = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(response.status(), 503);
    // 10 s open, 1.58 s of it gone (4 calls of 20 ms, then 1.5 s): 8.42 s, rounded up.
    assert_eq!(response.headers()["retry-after"], "9");
    assert_eq!(response.headers()[REJECTED_BY], "circuit-open");
    assert_eq!(response.headers()[RETRY_EXHAUSTED], "true");
    assert_eq!(seen.load(Ordering::Relaxed), 4);
}

#[tokio::test(start_paused = true)]
async fn probes_after_the_open_duration_close_the_breaker() {
    let status = Arc::new(AtomicU16::new(504));
    let seen = Arc::new(AtomicU64::new(0));
    let breaker = breaker(2);
    let mut svc = AdmissionLayer::new(Arc::clone(&breaker))
        .layer(backend(Arc::clone(&status), Arc::clone(&seen)));
    for _ in 0..4 {
        svc.ready().await.unwrap().call(get()).await.unwrap();
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    status.store(200, Ordering::Relaxed);
    tokio::time::advance(10 * SEC).await;

    // Two probes in flight at once; a third request is refused while they are out.
    let p1 = svc.ready().await.unwrap().call(get());
    let p2 = svc.ready().await.unwrap().call(get());
    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    let Refusal::BreakerOpen(open) = refusal(&err) else {
        panic!("{err}")
    };
    assert_eq!(open.reason, Rejection::ProbesBusy);
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
    let mut svc = AdmissionLayer::new(Arc::clone(&breaker))
        .layer(backend(Arc::clone(&status), Arc::clone(&seen)));
    for _ in 0..4 {
        svc.ready().await.unwrap().call(get()).await.unwrap();
    }
    tokio::time::advance(10 * SEC).await;
    // The caller gives up on the probe before it answers (a timeout layer above, say).
    let probe = svc.ready().await.unwrap().call(get());
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
    let response = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[derive(Debug, PartialEq)]
enum DbError {
    Unavailable,
    NotFound,
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for DbError {}

#[tokio::test(start_paused = true)]
async fn other_responses_use_a_closure_classifier() {
    let breaker = breaker(1);
    let classify = |r: &Result<u32, DbError>| match r {
        Ok(_) => Outcome::Success,
        Err(DbError::NotFound) => Outcome::NeverRetry,
        Err(DbError::Unavailable) => Outcome::Retryable,
    };
    let mut svc = AdmissionLayer::new(Arc::clone(&breaker))
        .with_classifier(classify)
        .layer(tower::service_fn(|req: Request<u32>| async move {
            match *req.body() {
                0 => Err(DbError::NotFound),
                1 => Err(DbError::Unavailable),
                k => Ok(k),
            }
        }));
    let mut call = async |key: u32| svc.ready().await.unwrap().call(Request::new(key)).await;
    // Not-found answers are calls, not failures: they never open the breaker.
    for _ in 0..8 {
        let err = call(0).await.unwrap_err();
        assert_eq!(err.downcast_ref::<DbError>(), Some(&DbError::NotFound));
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    // The window now holds the last 4 calls: 2 not-found, 2 unavailable: 50 % opens it.
    for _ in 0..2 {
        let err = call(1).await.unwrap_err();
        assert_eq!(err.downcast_ref::<DbError>(), Some(&DbError::Unavailable));
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    assert!(matches!(
        refusal(&call(7).await.unwrap_err()),
        Refusal::BreakerOpen(_)
    ));
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
    let svc = AdmissionLayer::new(Arc::clone(&breaker))
        .layer(backend(Arc::clone(&status), Arc::clone(&seen)));
    let run = |calls: u64| {
        (0..TASKS)
            .map(|_| {
                let mut svc = svc.clone();
                tokio::spawn(async move {
                    let mut refused = 0u64;
                    for _ in 0..calls {
                        if let Err(e) = svc.ready().await.unwrap().call(get()).await {
                            assert!(matches!(refusal(&e), Refusal::BreakerOpen(_)));
                            refused += 1;
                        }
                    }
                    refused
                })
            })
            .collect::<Vec<_>>()
    };
    let mut refused = 0;
    for t in run(CALLS) {
        refused += t.await.unwrap();
    }
    assert_eq!(refused, 0);
    assert_eq!(breaker.window().snapshot().successes, TASKS * CALLS);

    // The backend starts failing: the breaker opens and the tasks are turned away.
    status.store(503, Ordering::Relaxed);
    let before = seen.load(Ordering::Relaxed);
    let mut refused = 0;
    for t in run(2 * CALLS) {
        refused += t.await.unwrap();
    }
    let sent = seen.load(Ordering::Relaxed) - before;
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(sent + refused, 2 * TASKS * CALLS);
    // 1000 successes in the window: 1000 failures open it (50 %), plus at most one call per
    // task already in flight then.
    assert!(
        (TASKS * CALLS..=TASKS * CALLS + TASKS).contains(&sent),
        "{sent} sent"
    );
}

fn throttle(clock: &ManualClock) -> Arc<AdaptiveThrottle> {
    Arc::new(
        AdaptiveThrottle::new(ThrottleConfig::sre_default(), clock.clock())
            .unwrap()
            .with_seed(11),
    )
}

/// A backend that accepts `capacity` requests per (virtual) second and answers 429 to the
/// rest; counts what it receives.
fn limited_backend(
    clock: ManualClock,
    capacity: u64,
    seen: Arc<AtomicU64>,
) -> impl Service<Request<()>, Response = http::Response<String>, Error = Infallible> + Clone {
    let served = Arc::new(Mutex::new((0u64, 0u64)));
    tower::service_fn(move |_: Request<()>| {
        let second = clock.elapsed().as_secs();
        let seen = Arc::clone(&seen);
        let served = Arc::clone(&served);
        async move {
            seen.fetch_add(1, Ordering::Relaxed);
            let mut s = served.lock().unwrap();
            if s.0 != second {
                *s = (second, 0);
            }
            let status = if s.1 < capacity {
                s.1 += 1;
                200
            } else {
                429
            };
            Ok(http::Response::builder()
                .status(status)
                .body(String::new())
                .unwrap())
        }
    })
}

#[tokio::test]
async fn an_overloaded_backend_sees_about_twice_its_capacity() {
    let clock = ManualClock::new();
    let seen = Arc::new(AtomicU64::new(0));
    let mut svc = AdmissionLayer::new(throttle(&clock)).layer(limited_backend(
        clock.clone(),
        50,
        Arc::clone(&seen),
    ));
    let (mut throttled, mut seen_late) = (0u64, 0u64);
    // 500 requests per second for 6 minutes; measure the last 3.
    for second in 0..360 {
        let before = seen.load(Ordering::Relaxed);
        for _ in 0..500 {
            clock.advance(Duration::from_millis(2));
            if let Err(e) = svc.ready().await.unwrap().call(get()).await {
                let Refusal::Throttled(t) = refusal(&e) else {
                    panic!("{e}")
                };
                assert!(t.probability > 0.0);
                throttled += 1;
            }
        }
        if second >= 180 {
            seen_late += seen.load(Ordering::Relaxed) - before;
        }
    }
    let rate = seen_late as f64 / 180.0;
    assert!((rate - 100.0).abs() <= 5.0, "backend saw {rate:.1}/s");
    assert!(throttled > 300 * 360, "{throttled}");
}

#[tokio::test]
async fn a_healthy_backend_is_not_throttled_and_503_is_an_option() {
    let clock = ManualClock::new();
    let seen = Arc::new(AtomicU64::new(0));
    let throttle = throttle(&clock);
    let mut healthy = AdmissionLayer::new(Arc::clone(&throttle))
        .with_http_503()
        .layer(limited_backend(clock.clone(), 1_000, Arc::clone(&seen)));
    for _ in 0..1_000 {
        clock.advance(Duration::from_millis(2));
        let response = healthy.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(throttle.rejection_probability(), 0.0);

    // Now every answer is 429: the 503 option answers locally once the throttle kicks in.
    let mut overloaded = AdmissionLayer::new(Arc::clone(&throttle))
        .with_http_503()
        .layer(limited_backend(clock.clone(), 0, Arc::clone(&seen)));
    let mut local = 0;
    for _ in 0..5_000 {
        let response = overloaded.ready().await.unwrap().call(get()).await.unwrap();
        if response.status() == 503 {
            assert_eq!(response.headers()[REJECTED_BY], "throttled");
            assert!(!response.headers().contains_key("retry-after"));
            local += 1;
        } else {
            assert_eq!(response.status(), 429);
        }
    }
    // The 1000 earlier accepts allow 2000 requests before p rises above 0; after that p
    // climbs towards (6000 − 2000) / 6001 ≈ 0.67.
    assert!(local > 1_000 && local < 4_000, "{local}");
}

#[tokio::test]
async fn other_responses_count_accepts_with_their_classifier() {
    let clock = ManualClock::new();
    let throttle = throttle(&clock);
    let mut svc = AdmissionLayer::new(Arc::clone(&throttle))
        .with_classifier(|r: &Result<u8, DbError>| match r {
            Ok(_) => Outcome::Success,
            Err(_) => Outcome::Overloaded { retry_after: None },
        })
        .layer(tower::service_fn(|req: Request<u8>| async move {
            match *req.body() {
                0 => Err(DbError::Unavailable),
                x => Ok(x),
            }
        }));
    assert_eq!(
        svc.ready()
            .await
            .unwrap()
            .call(Request::new(3))
            .await
            .unwrap(),
        3
    );
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(0))
        .await
        .unwrap_err();
    assert_eq!(err.downcast_ref::<DbError>(), Some(&DbError::Unavailable));
    let counts = throttle.counts();
    assert_eq!((counts.requests, counts.accepts), (2, 1));
}

/// Counts what the layer reports.
#[derive(Default)]
struct Probe {
    refused: Mutex<Vec<(String, &'static str)>>,
    changes: Mutex<Vec<(String, BreakerState)>>,
}

impl Observer for Probe {
    fn refused(&self, call: &CallInfo<'_>, refusal: &Refusal) {
        let entry = (call.endpoint.to_owned(), refusal.label());
        self.refused.lock().unwrap().push(entry);
    }

    fn breaker_changed(&self, endpoint: &str, change: &StateChange) {
        let entry = (endpoint.to_owned(), change.to);
        self.changes.lock().unwrap().push(entry);
    }
}

#[tokio::test(start_paused = true)]
async fn one_gate_of_breaker_and_throttle_reports_refusals_and_transitions() {
    let probe = Arc::new(Probe::default());
    let config = BreakerConfig::new(HealthConfig::count(4))
        .with_minimum_throughput(4)
        .with_open_duration(10 * SEC);
    let breaker = Arc::new(
        CircuitBreaker::new(config, Clock::tokio())
            .unwrap()
            .with_observer(BreakerEvents::shared(
                Arc::from("orders"),
                Arc::clone(&probe),
            )),
    );
    let throttle = Arc::new(
        AdaptiveThrottle::new(ThrottleConfig::sre_default(), Clock::tokio())
            .unwrap()
            .with_seed(3),
    );
    let status = Arc::new(AtomicU16::new(200));
    let seen = Arc::new(AtomicU64::new(0));
    let mut svc = AdmissionLayer::new((Arc::clone(&breaker), Arc::clone(&throttle)))
        .with_endpoint("orders")
        .with_observer(Arc::clone(&probe))
        .layer(backend(Arc::clone(&status), Arc::clone(&seen)));
    // Ten accepted calls keep the throttle open through the failures that follow; two of
    // those make half the breaker's window of four, which opens it.
    for _ in 0..10 {
        svc.ready().await.unwrap().call(get()).await.unwrap();
    }
    status.store(503, Ordering::Relaxed);
    for _ in 0..2 {
        svc.ready().await.unwrap().call(get()).await.unwrap();
    }
    let counts = throttle.counts();
    assert_eq!(
        (counts.requests, counts.accepts),
        (12, 10),
        "both gates saw every call"
    );
    assert_eq!(breaker.state(), BreakerState::Open);
    for _ in 0..3 {
        let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
        assert!(matches!(refusal(&err), Refusal::BreakerOpen(_)));
    }
    // The breaker refused first: the throttle was not asked.
    assert_eq!(throttle.counts().requests, 12);
    assert_eq!(seen.load(Ordering::Relaxed), 12);
    assert_eq!(
        *probe.refused.lock().unwrap(),
        vec![("orders".to_owned(), "circuit_open"); 3]
    );
    assert_eq!(
        *probe.changes.lock().unwrap(),
        vec![("orders".to_owned(), BreakerState::Open)]
    );
}
