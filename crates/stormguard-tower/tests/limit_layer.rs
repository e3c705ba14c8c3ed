//! The server limit layer on real axum servers (127.0.0.1, ephemeral ports) under paused tokio
//! time: admission under the limit, 503 + `Retry-After` / `RESOURCE_EXHAUSTED` + pushback for
//! the rest, deadline shedding first, the queue, partitions, and our own client stack backing
//! off on the shed answer.
//!
//! Handlers wait on a gate the test opens, and the clock is held ([`ClockHold`]) and moved
//! only with `tokio::time::advance`, so every count is exact.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/clock_hold.rs"]
mod clock_hold;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::limit::{Aimd, LimiterConfig};
use stormguard::policy::EndpointPolicy;
use stormguard::retry::RetryPolicy;
use stormguard_tower::DeadlineLayer;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::ClientLayerBuilder;
use stormguard_tower::limit::{AdaptiveLimitLayer, LimitStats};
use tokio::sync::Semaphore;
use tower::{Layer, ServiceExt};

use clock_hold::ClockHold;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// A fixed limit of `n` (AIMD pinned between `n` and `n`), so the counts do not depend on
/// the algorithm.
fn fixed(n: u32) -> LimiterConfig {
    LimiterConfig::new(Aimd::new().with_limits(n, n, n))
}

/// `/gated` waits for a permit of the gate; `/` answers at once.
async fn serve(layer: AdaptiveLimitLayer, gate: Arc<Semaphore>) -> SocketAddr {
    let router = Router::new()
        .route(
            "/gated",
            get(|State(gate): State<Arc<Semaphore>>| async move {
                gate.acquire().await.unwrap().forget();
                "done"
            }),
        )
        .route("/", get(|| async { "fast" }))
        .with_state(gate)
        .layer(layer)
        .layer(DeadlineLayer::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

async fn send(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> http::Response<Bytes> {
    let mut builder = Request::get(format!("http://{addr}{path}"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client
        .request(builder.body(Full::default()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    http::Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

/// Polls (yielding, no time passing) until `done` holds.
async fn until(layer: &AdaptiveLimitLayer, done: impl Fn(LimitStats) -> bool) {
    while !done(layer.stats()) {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn admits_up_to_the_limit_and_sheds_the_rest_with_retry_after() {
    let mut hold = ClockHold::new();
    let layer = AdaptiveLimitLayer::builder(fixed(4))
        .with_queue(0, MS(5), MS(100))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let addr = serve(layer.clone(), gate.clone()).await;
    let held: Vec<_> = (0..4)
        .map(|_| tokio::spawn(send(addr, "/gated", &[])))
        .collect();
    hold.within(until(&layer, |s| s.admitted == 4)).await;
    for _ in 0..6 {
        let shed = hold.within(send(addr, "/", &[])).await;
        assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(shed.headers()["retry-after"], "1");
        assert!(
            shed.headers().get("x-stormguard-rejected").is_none(),
            "a server answer, not a local refusal"
        );
    }
    // gRPC callers get RESOURCE_EXHAUSTED with the pushback in milliseconds.
    let grpc = hold
        .within(send(addr, "/", &[("content-type", "application/grpc")]))
        .await;
    assert_eq!(grpc.status(), StatusCode::OK);
    assert_eq!(grpc.headers()["grpc-status"], "8");
    assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "1000");
    gate.add_permits(4);
    for h in held {
        assert_eq!(hold.within(h).await.unwrap().status(), StatusCode::OK);
    }
    let stats = layer.stats();
    assert_eq!(
        (stats.admitted, stats.shed_queue_full, stats.shed()),
        (4, 7, 7)
    );
    assert_eq!(layer.limiter().in_flight(), 0);
    // A slot is free again.
    assert_eq!(
        hold.within(send(addr, "/", &[])).await.status(),
        StatusCode::OK
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_in_the_queue_and_runs_when_a_slot_frees() {
    let mut hold = ClockHold::new();
    let layer = AdaptiveLimitLayer::builder(fixed(1))
        .with_queue(1, MS(5), MS(100))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let addr = serve(layer.clone(), gate.clone()).await;
    let first = tokio::spawn(send(addr, "/gated", &[]));
    hold.within(until(&layer, |s| s.admitted == 1)).await;
    let queued = tokio::spawn(send(addr, "/", &[]));
    hold.within(async {
        while layer.queued() == 0 {
            tokio::task::yield_now().await
        }
    })
    .await;
    // The queue holds one: a third request is shed at once.
    assert_eq!(
        hold.within(send(addr, "/", &[])).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    tokio::time::advance(MS(50)).await;
    gate.add_permits(1);
    assert_eq!(hold.within(first).await.unwrap().status(), StatusCode::OK);
    assert_eq!(hold.within(queued).await.unwrap().status(), StatusCode::OK);
    let stats = layer.stats();
    assert_eq!(
        (stats.admitted, stats.queued, stats.shed_queue_full),
        (2, 1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_is_shed_when_its_patience_runs_out() {
    let mut hold = ClockHold::new();
    let layer = AdaptiveLimitLayer::builder(fixed(1))
        .with_queue(4, MS(5), MS(100))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let addr = serve(layer.clone(), gate.clone()).await;
    let first = tokio::spawn(send(addr, "/gated", &[]));
    hold.within(until(&layer, |s| s.admitted == 1)).await;
    let queued = tokio::spawn(send(addr, "/", &[]));
    hold.within(async {
        while layer.queued() == 0 {
            tokio::task::yield_now().await
        }
    })
    .await;
    // The queue was empty just before: a burst, so the request may wait the whole interval.
    tokio::time::advance(MS(101)).await;
    let shed = hold.within(queued).await.unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(layer.stats().shed_queue_timeout, 1);
    gate.add_permits(1);
    assert_eq!(hold.within(first).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_waits_no_longer_than_one_expected_round_trip() {
    let mut hold = ClockHold::new();
    // One slot; ten requests of 20 ms teach the limiter that a request takes 20 ms.
    let layer = AdaptiveLimitLayer::builder(fixed(1).with_window(MS(100), 10))
        .with_queue(4, MS(5), MS(100))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let addr = serve(layer.clone(), gate.clone()).await;
    for i in 1..=10 {
        let request = tokio::spawn(send(addr, "/gated", &[]));
        hold.within(until(&layer, |s| s.admitted == i)).await;
        tokio::time::advance(MS(20)).await;
        gate.add_permits(1);
        assert_eq!(hold.within(request).await.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(layer.limiter().expected_rtt(), Some(MS(20)));
    let held = tokio::spawn(send(addr, "/gated", &[]));
    hold.within(until(&layer, |s| s.admitted == 11)).await;
    // A burst (the queue was empty just before): CoDel alone would let it wait the whole
    // 100 ms interval; one round trip of 20 ms is all it gets.
    let queued = tokio::spawn(send(addr, "/", &[]));
    hold.within(async {
        while layer.queued() == 0 {
            tokio::task::yield_now().await
        }
    })
    .await;
    tokio::time::advance(MS(19)).await;
    assert!(!queued.is_finished(), "still within one round trip");
    tokio::time::advance(MS(2)).await;
    let shed = hold.within(queued).await.unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(layer.stats().shed_queue_timeout, 1);
    gate.add_permits(1);
    assert_eq!(hold.within(held).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn requests_whose_deadline_is_shorter_than_the_service_time_are_shed_first() {
    let mut hold = ClockHold::new();
    // Windows of 100 ms and 10 samples: ten requests of 50 ms teach the limiter that a request
    // takes 50 ms.
    let config = fixed(8).with_window(MS(100), 10);
    let layer = AdaptiveLimitLayer::new(config).unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let addr = serve(layer.clone(), gate.clone()).await;
    for i in 1..=10 {
        let request = tokio::spawn(send(addr, "/gated", &[]));
        hold.within(until(&layer, |s| s.admitted == i)).await;
        tokio::time::advance(MS(50)).await;
        gate.add_permits(1);
        assert_eq!(hold.within(request).await.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(layer.limiter().expected_rtt(), Some(MS(50)));
    // 20 ms left: it cannot be answered in time, so it is shed before it takes a slot...
    let shed = hold
        .within(send(addr, "/", &[("grpc-timeout", "20m")]))
        .await;
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(layer.stats().shed_deadline, 1);
    // ...while one with time enough is served.
    let served = hold
        .within(send(addr, "/", &[("grpc-timeout", "200m")]))
        .await;
    assert_eq!(served.status(), StatusCode::OK);
    assert_eq!(layer.stats().admitted, 11);
}

#[tokio::test(start_paused = true)]
async fn paying_traffic_keeps_its_share_when_free_traffic_fills_the_limit() {
    let mut hold = ClockHold::new();
    let config = fixed(4).with_partitions(vec![0.75, 0.25]);
    let layer = AdaptiveLimitLayer::builder(config)
        .with_queue(0, MS(5), MS(100))
        .with_partitions(|headers| usize::from(headers.get("x-tier").is_none_or(|t| t != "paying")))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let addr = serve(layer.clone(), gate.clone()).await;
    let free: Vec<_> = (0..4)
        .map(|_| tokio::spawn(send(addr, "/gated", &[])))
        .collect();
    hold.within(until(&layer, |s| s.admitted == 4)).await;
    assert_eq!(
        hold.within(send(addr, "/", &[])).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    const PAYING: &[(&str, &str)] = &[("x-tier", "paying")];
    let held: Vec<_> = (0..3)
        .map(|_| tokio::spawn(send(addr, "/gated", PAYING)))
        .collect();
    hold.within(until(&layer, |s| s.admitted == 7)).await;
    assert_eq!(
        hold.within(send(addr, "/", PAYING)).await.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "paying traffic has its 3 of 4"
    );
    gate.add_permits(7);
    for h in free.into_iter().chain(held) {
        assert_eq!(hold.within(h).await.unwrap().status(), StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn our_client_stack_waits_out_the_retry_after_before_retrying() {
    let mut hold = ClockHold::new();
    let layer = AdaptiveLimitLayer::builder(fixed(1))
        .with_queue(0, MS(5), MS(100))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let addr = serve(layer.clone(), gate.clone()).await;
    let busy = tokio::spawn(send(addr, "/gated", &[]));
    hold.within(until(&layer, |s| s.admitted == 1)).await;

    // A client that would retry at once, three attempts.
    let policy = EndpointPolicy::new(
        RetryPolicy::new(3)
            .with_idempotent(true)
            .with_backoff(Backoff::fixed(Duration::ZERO).with_jitter(Jitter::None)),
    );
    let stack = ClientLayerBuilder::single("limited", policy)
        .with_observer(())
        .build()
        .unwrap()
        .layer(Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Full<Bytes>>>());
    let request = Request::get(format!("http://{addr}/"))
        .body(Full::<Bytes>::default())
        .unwrap();
    let started = tokio::time::Instant::now();
    let call = tokio::spawn(stack.oneshot(request));
    hold.within(until(&layer, |s| s.shed() == 1)).await;
    // Half a second later it has not come back: Retry-After said one second.
    tokio::time::advance(MS(500)).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(layer.stats().shed(), 1);
    gate.add_permits(1);
    assert_eq!(hold.within(busy).await.unwrap().status(), StatusCode::OK);
    // (The client may have read the answer only after the first advance: give it the whole
    // second again.)
    tokio::time::advance(MS(1000)).await;
    let response = hold.within(call).await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_secs(1));
    let stats = layer.stats();
    assert_eq!((stats.admitted, stats.shed()), (2, 1));
}
