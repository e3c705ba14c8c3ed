//! The layers composed by hand, in the orders the crate docs allow, over a real axum server on
//! 127.0.0.1 (with `FaultLayer` injecting 503s in front of it), under paused time held still
//! (see `support/clock_hold.rs`: time moves only where a test or a handler moves it):
//!
//! - retry over admission: never retries into an open breaker, nor charges the budget for it;
//! - admission over retry: the breaker still opens on the exhausted 503s;
//! - retry over a throttle: stops at the first refusal;
//! - retry and deadline propagation, in both orders: each attempt carries what is left of the
//!   deadline, and no attempt is sent past it;
//! - hedge over admission: no copy is sent into an open breaker;
//! - what the retry layer and the admission layer report to their observers matches.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/clock_hold.rs"]
mod clock_hold;
mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::any;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use stormguard::admission::Refusal;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::breaker::{BreakerConfig, BreakerState, CircuitBreaker, StateChange};
use stormguard::budget::{RetryBudget, TokenBucket};
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline};
use stormguard::fault::{Abort, FaultConfig, FaultInjector};
use stormguard::health::HealthConfig;
use stormguard::policy::{BudgetSpec, HedgeDelaySpec, HedgeSpec};
use stormguard::retry::{RetryPolicy, StopReason};
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};
use stormguard_tower::admission::AdmissionLayer;
use stormguard_tower::client::Error;
use stormguard_tower::deadline::PropagateDeadlineLayer;
use stormguard_tower::fault::FaultLayer;
use stormguard_tower::hedge::HedgeLayer;
use stormguard_tower::observe::{AttemptStart, BreakerEvents, CallEnd, CallInfo, Observer};
use stormguard_tower::retry::RetryLayer;
use stormguard_tower::wire::{BoxError, is_exhausted, refusal_of};
use tower::{Service, ServiceBuilder, ServiceExt};

use clock_hold::ClockHold;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// The downstream: counts requests, keeps the `grpc-timeout` each carried, and moves the
/// paused clock by `work` (its processing time) before it answers: 200 from the axum router,
/// or 503 from the fault injector in front of it while that is enabled (it starts enabled).
struct Downstream {
    addr: SocketAddr,
    hits: Arc<AtomicU32>,
    timeouts: Arc<Mutex<Vec<String>>>,
    faults: Arc<FaultInjector>,
}

impl Downstream {
    async fn start(work: Duration) -> Downstream {
        let hits = Arc::new(AtomicU32::new(0));
        let timeouts = Arc::new(Mutex::new(Vec::new()));
        let faults = Arc::new(
            FaultInjector::new(FaultConfig::new(1).with_abort(
                1.0,
                Abort::Status {
                    status: 503,
                    retry_after: None,
                },
            ))
            .unwrap(),
        );
        let app = Router::new().route("/", any(|| async { StatusCode::OK }));
        let (counted, seen) = (Arc::clone(&hits), Arc::clone(&timeouts));
        let server = ServiceBuilder::new()
            .map_request(move |req: Request<axum::body::Body>| {
                counted.fetch_add(1, Ordering::SeqCst);
                let timeout = req
                    .headers()
                    .get("grpc-timeout")
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_default();
                seen.lock().unwrap().push(timeout);
                req
            })
            .then(move |answer| async move {
                tokio::time::advance(work).await;
                answer
            })
            .layer(FaultLayer::new(Arc::clone(&faults)))
            .service(app);
        let addr = serve(server).await;
        Downstream {
            addr,
            hits,
            timeouts,
            faults,
        }
    }

    fn hits(&self) -> u32 {
        self.hits.load(Ordering::SeqCst)
    }

    fn request(&self) -> Request<Full<Bytes>> {
        Request::get(format!("http://{}/", self.addr))
            .body(support::full(""))
            .unwrap()
    }
}

/// Serves `svc` (a fault layer around an axum router) over HTTP/1 on 127.0.0.1.
async fn serve<S>(svc: S) -> SocketAddr
where
    S: Service<
            Request<axum::body::Body>,
            Response = http::Response<axum::body::Body>,
            Error = BoxError,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let svc = svc.clone();
            tokio::spawn(async move {
                let handler =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        svc.clone().oneshot(req.map(axum::body::Body::new))
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, handler)
                    .await;
            });
        }
    });
    addr
}

/// `attempts` attempts with no wait between them: nothing but the downstream moves the clock.
fn at_once(attempts: u32) -> RetryPolicy {
    RetryPolicy::new(attempts)
        .with_backoff(Backoff::fixed(Duration::ZERO).with_jitter(Jitter::None))
}

fn breaker(probe: &Arc<Probe>) -> Arc<CircuitBreaker<BreakerEvents<Probe>>> {
    let config = BreakerConfig::new(HealthConfig::count(4))
        .with_minimum_throughput(4)
        .with_open_duration(Duration::from_secs(60))
        .with_permitted_probes(1);
    Arc::new(
        CircuitBreaker::new(config, Clock::tokio())
            .unwrap()
            .with_observer(BreakerEvents::shared(Arc::from("down"), Arc::clone(probe))),
    )
}

/// What an observer was told.
#[derive(Default)]
struct Probe {
    attempts: AtomicU64,
    refused: Mutex<Vec<&'static str>>,
    budget_refused: AtomicU64,
    calls: Mutex<Vec<CallEnd>>,
    transitions: Mutex<Vec<BreakerState>>,
}

impl Observer for Probe {
    fn attempt_started(&self, _: &CallInfo<'_>, _: &AttemptStart) {
        self.attempts.fetch_add(1, Ordering::SeqCst);
    }
    fn call_finished(&self, _: &CallInfo<'_>, end: &CallEnd) {
        self.calls.lock().unwrap().push(*end);
    }
    fn budget_refused(&self, _: &CallInfo<'_>) {
        self.budget_refused.fetch_add(1, Ordering::SeqCst);
    }
    fn refused(&self, _: &CallInfo<'_>, refusal: &Refusal) {
        self.refused.lock().unwrap().push(refusal.label());
    }
    fn breaker_changed(&self, _: &str, change: &StateChange) {
        self.transitions.lock().unwrap().push(change.to);
    }
}

impl Probe {
    fn stops(&self) -> Vec<StopReason> {
        self.calls.lock().unwrap().iter().map(|c| c.stop).collect()
    }
    fn refusals(&self) -> Vec<&'static str> {
        self.refused.lock().unwrap().clone()
    }
}

#[tokio::test(start_paused = true)]
async fn retry_over_admission_never_retries_into_an_open_breaker_nor_charges_the_budget() {
    let mut hold = ClockHold::new();
    let down = Downstream::start(MS(5)).await;
    let (retries, gate) = (Arc::new(Probe::default()), Arc::new(Probe::default()));
    let breaker = breaker(&gate);
    let bucket = Arc::new(TokenBucket::grpc(100, 0.1).unwrap());
    let client = ServiceBuilder::new()
        .layer(
            RetryLayer::builder(at_once(4))
                .with_budget(Arc::clone(&bucket) as Arc<dyn RetryBudget>)
                .with_observer(Arc::clone(&retries))
                .build()
                .unwrap(),
        )
        .layer(AdmissionLayer::new(Arc::clone(&breaker)).with_observer(Arc::clone(&gate)))
        .service(support::client());

    // Four 503s: the retries use up the call and open the breaker on the fourth.
    let response = hold
        .within(client.clone().oneshot(down.request()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(is_exhausted(response.headers()));
    assert_eq!(down.hits(), 4);
    assert_eq!(breaker.state(), BreakerState::Open);
    let tokens = bucket.tokens();
    assert_eq!(tokens, 96.0, "four failed attempts");

    // Open: each call is refused at its first attempt, at once, uncharged.
    for _ in 0..3 {
        let err = hold
            .within(client.clone().oneshot(down.request()))
            .await
            .unwrap_err();
        let Error::Refused { attempts, source } = err else {
            panic!("{err}")
        };
        assert_eq!(attempts, 0);
        assert!(matches!(source, Refusal::BreakerOpen(_)));
    }
    assert_eq!(down.hits(), 4);
    assert_eq!(bucket.tokens(), tokens);

    assert_eq!(
        retries.stops(),
        [
            StopReason::AttemptsExhausted,
            StopReason::BreakerOpen,
            StopReason::BreakerOpen,
            StopReason::BreakerOpen
        ]
    );
    assert_eq!(retries.budget_refused.load(Ordering::SeqCst), 0);
    // Each refusal is reported once, by the layer that refused (metrics count it once).
    assert_eq!(gate.refusals(), ["circuit_open"; 3]);
    assert!(retries.refusals().is_empty());
    assert_eq!(*gate.transitions.lock().unwrap(), [BreakerState::Open]);
}

#[tokio::test(start_paused = true)]
async fn admission_over_retry_opens_the_breaker_on_exhausted_503s() {
    let mut hold = ClockHold::new();
    let down = Downstream::start(MS(5)).await;
    let gate = Arc::new(Probe::default());
    let breaker = breaker(&gate);
    let client = ServiceBuilder::new()
        .layer(AdmissionLayer::new(Arc::clone(&breaker)).with_observer(Arc::clone(&gate)))
        .layer(RetryLayer::new(at_once(3)).unwrap())
        .service(support::client());

    for _ in 0..4 {
        let response = hold
            .within(client.clone().oneshot(down.request()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            is_exhausted(response.headers()),
            "marked by the retry layer"
        );
    }
    // Each call is one call to the breaker, its final 503 a failure despite the mark.
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(breaker.window().snapshot().calls, 4);
    assert_eq!(down.hits(), 12);

    let err = hold
        .within(client.clone().oneshot(down.request()))
        .await
        .unwrap_err();
    assert!(matches!(
        refusal_of(err.as_ref()),
        Some(Refusal::BreakerOpen(_))
    ));
    assert_eq!(down.hits(), 12);
    assert_eq!(gate.refusals(), ["circuit_open"]);
    assert_eq!(*gate.transitions.lock().unwrap(), [BreakerState::Open]);

    // The downstream recovers; after the open duration a probe closes the breaker.
    down.faults.disable();
    tokio::time::advance(Duration::from_secs(60)).await;
    let response = hold
        .within(client.clone().oneshot(down.request()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn retry_over_a_throttle_stops_at_the_first_refusal() {
    let mut hold = ClockHold::new();
    let down = Downstream::start(MS(5)).await;
    let (retries, gate) = (Arc::new(Probe::default()), Arc::new(Probe::default()));
    let throttle = Arc::new(
        AdaptiveThrottle::new(ThrottleConfig::sre_default(), Clock::tokio())
            .unwrap()
            .with_seed(5),
    );
    let bucket = Arc::new(TokenBucket::grpc(1000, 0.1).unwrap());
    let client = ServiceBuilder::new()
        .layer(
            RetryLayer::builder(at_once(5))
                .with_budget(Arc::clone(&bucket) as Arc<dyn RetryBudget>)
                .with_observer(Arc::clone(&retries))
                .build()
                .unwrap(),
        )
        .layer(AdmissionLayer::new(Arc::clone(&throttle)).with_observer(Arc::clone(&gate)))
        .service(support::client());

    let mut throttled = 0;
    for _ in 0..30 {
        match hold.within(client.clone().oneshot(down.request())).await {
            Ok(response) => assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE),
            Err(Error::Refused {
                source: Refusal::Throttled(_),
                ..
            }) => throttled += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(throttled > 10, "{throttled}");
    // Every attempt the stack counted reached the downstream; a refused one ended its call.
    let calls = retries.calls.lock().unwrap().clone();
    let sent: u32 = calls.iter().map(|c| c.attempts).sum();
    assert_eq!(sent, down.hits());
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.stop == StopReason::Throttled)
            .count(),
        throttled
    );
    assert!(calls.iter().all(|c| c.marked_exhausted));
    // Only attempts that were sent cost tokens.
    assert_eq!(bucket.tokens(), 1000.0 - f64::from(down.hits()));
    assert!(down.hits() < 30 * 5);
    assert_eq!(gate.refusals().len(), throttled);
    assert!(retries.refusals().is_empty());
}

/// Runs one call in a task deadline of 100 ms against a downstream that works 60 ms per
/// request: the first attempt gets 100 ms, the retry what is left (40 ms), and no third
/// attempt is sent past the deadline.
async fn deadline_bounds_the_retries<S, B, E>(down: &Downstream, client: S, hold: &mut ClockHold)
where
    S: Service<Request<Full<Bytes>>, Response = http::Response<B>, Error = E>,
    E: std::fmt::Display,
{
    let deadline = Deadline::after(MS(100), Clock::tokio());
    let result = hold
        .within(deadline::scope(deadline, client.oneshot(down.request())))
        .await;
    match result {
        // The last 503, marked: nobody upstream retries it either.
        Ok(response) => {
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert!(is_exhausted(response.headers()));
        }
        // The second attempt cut at the deadline.
        Err(e) => assert!(e.to_string().contains("timed out"), "{e}"),
    }
    assert_eq!(down.hits(), 2);
    // 100 ms, then the 40 ms left (grpc-timeout's finest unit that fits in 8 digits).
    assert_eq!(*down.timeouts.lock().unwrap(), ["100000u", "40000000n"]);
}

#[tokio::test(start_paused = true)]
async fn retry_over_propagation_hands_each_attempt_what_is_left() {
    let mut hold = ClockHold::new();
    let down = Downstream::start(MS(60)).await;
    let gate = Arc::new(Probe::default());
    let breaker = breaker(&gate);
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(at_once(5)).unwrap())
        .layer(AdmissionLayer::new(Arc::clone(&breaker)))
        .layer(PropagateDeadlineLayer::new().with_min_call(MS(20)))
        .service(support::client());
    deadline_bounds_the_retries(&down, client, &mut hold).await;
    assert_eq!(breaker.window().snapshot().calls, 2, "the attempts sent");
}

#[tokio::test(start_paused = true)]
async fn propagation_over_retry_hands_each_attempt_what_is_left() {
    let mut hold = ClockHold::new();
    let down = Downstream::start(MS(60)).await;
    let gate = Arc::new(Probe::default());
    let breaker = breaker(&gate);
    let client = ServiceBuilder::new()
        .layer(PropagateDeadlineLayer::new().with_min_call(MS(20)))
        .layer(RetryLayer::new(at_once(5)).unwrap())
        .layer(AdmissionLayer::new(Arc::clone(&breaker)))
        .service(support::client());
    deadline_bounds_the_retries(&down, client, &mut hold).await;
    assert_eq!(breaker.window().snapshot().calls, 2, "the attempts sent");
}

#[tokio::test(start_paused = true)]
async fn hedge_over_admission_sends_no_copy_into_an_open_breaker() {
    let mut hold = ClockHold::new();
    let down = Downstream::start(MS(5)).await;
    let (hedges, gate) = (Arc::new(Probe::default()), Arc::new(Probe::default()));
    let breaker = breaker(&gate);
    breaker.isolate();
    let spec = HedgeSpec {
        max_attempts: 3,
        delay: HedgeDelaySpec::Fixed(MS(10)),
    };
    let client = ServiceBuilder::new()
        .layer(
            HedgeLayer::builder(spec)
                .with_budget(BudgetSpec::Grpc {
                    max_tokens: 10,
                    token_ratio: 0.1,
                })
                .with_observer(Arc::clone(&hedges))
                .build()
                .unwrap(),
        )
        .layer(AdmissionLayer::new(Arc::clone(&breaker)).with_observer(Arc::clone(&gate)))
        .service(support::client());
    let err = hold
        .within(client.clone().oneshot(down.request()))
        .await
        .unwrap_err();
    assert!(
        matches!(err.refusal(), Some(Refusal::BreakerOpen(_))),
        "{err}"
    );
    assert_eq!(down.hits(), 0);
    assert_eq!(gate.refusals(), ["circuit_open"]);
    assert_eq!(hedges.budget_refused.load(Ordering::SeqCst), 0);
    assert_eq!(hedges.stops(), [StopReason::BreakerOpen]);
}
