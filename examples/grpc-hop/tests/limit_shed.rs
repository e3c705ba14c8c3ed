//! The server limit layer in front of a real tonic server on 127.0.0.1: over the limit, a
//! gRPC call is shed with `RESOURCE_EXHAUSTED` and `grpc-retry-pushback-ms` before its handler
//! runs, and our own client stack (a generated `RelayClient` over `ClientLayer`) waits out the
//! pushback before it retries — or does not retry at all when its deadline cannot wait that
//! long (DESIGN.md, classification: "do not retry sooner than … `grpc-retry-pushback-ms`").
//!
//! Everything runs on one current-thread runtime under paused tokio time with the clock held
//! ([`ClockHold`], see `clock_hold.rs` for why): it moves only by `tokio::time::advance`, so
//! "the client has not retried yet" is an exact statement, not a race.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../crates/stormguard-tower/tests/support/clock_hold.rs"]
mod clock_hold;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_hop::pb::relay_client::RelayClient;
use grpc_hop::pb::relay_server::{Relay, RelayServer};
use grpc_hop::pb::{HopReply, HopRequest};
use stormguard::limit::{Aimd, LimiterConfig};
use stormguard::policy::PolicyFile;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::{Client, ClientLayer};
use stormguard_tower::deadline::DeadlineLayer;
use stormguard_tower::limit::{AdaptiveLimitLayer, LimitStats};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::body::Body;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tower::ServiceBuilder;
use tower::util::MapRequest;

use clock_hold::ClockHold;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// A call with `work_ms > 0` waits for a permit of the gate; others answer at once.
#[derive(Clone)]
struct Gated {
    gate: Arc<Semaphore>,
}

#[tonic::async_trait]
impl Relay for Gated {
    async fn hop(&self, request: Request<HopRequest>) -> Result<Response<HopReply>, Status> {
        if request.get_ref().work_ms > 0 {
            self.gate.acquire().await.unwrap().forget();
        }
        Ok(Response::new(HopReply {
            hop: "gated".to_owned(),
            ..HopReply::default()
        }))
    }
}

/// When each request reached the server (before the limit layer), on tokio's clock.
type Arrivals = Arc<Mutex<Vec<Instant>>>;

/// A tonic server behind `DeadlineLayer` and a limit of one request in flight, no queue,
/// pushing back for `pushback`.
async fn serve(pushback: Duration) -> (String, AdaptiveLimitLayer, Arc<Semaphore>, Arrivals) {
    let layer = AdaptiveLimitLayer::builder(LimiterConfig::new(Aimd::new().with_limits(1, 1, 1)))
        .with_queue(0, MS(5), MS(100))
        .with_retry_after(pushback)
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let relay = Gated { gate: gate.clone() };
    let arrivals = Arrivals::default();
    let seen = arrivals.clone();
    let stack = ServiceBuilder::new()
        .map_request(move |req: http::Request<Body>| {
            seen.lock().unwrap().push(Instant::now());
            req
        })
        .layer(DeadlineLayer::new())
        .layer(layer.clone());
    tokio::spawn(
        Server::builder()
            .layer(stack)
            .add_service(RelayServer::new(relay))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    (uri, layer, gate, arrivals)
}

/// Polls (yielding, no time passing) until `done` holds.
async fn until(layer: &AdaptiveLimitLayer, done: impl Fn(LimitStats) -> bool) {
    while !done(layer.stats()) {
        tokio::task::yield_now().await;
    }
}

/// Lets every task run that can, without time passing.
async fn settle() {
    for _ in 0..200 {
        tokio::task::yield_now().await;
    }
}

/// A plain tonic client: no retries, no deadline.
fn raw_client(uri: &str) -> RelayClient<Channel> {
    RelayClient::new(
        Endpoint::from_shared(uri.to_owned())
            .unwrap()
            .connect_lazy(),
    )
}

/// The stack hands each attempt on as a `ReplayBody`; a tonic channel takes tonic's body.
type ToTonicBody = fn(http::Request<ReplayBody<Body>>) -> http::Request<Body>;

/// Our client stack: `Relay.Hop` is idempotent, retried at once (1 ms fixed backoff) up to
/// three attempts within `overall`.
fn our_client(uri: &str, overall: &str) -> RelayClient<Client<MapRequest<Channel, ToTonicBody>>> {
    let policies = PolicyFile::from_toml(&format!(
        r#"
        [endpoints."POST /stormguard.relay.Relay/*"]
        idempotency = "idempotent"
        timeouts = {{ per_try = "{overall}", overall = "{overall}" }}
        retry = {{ max_attempts = 3 }}
        backoff = {{ kind = "fixed", base = "1ms", jitter = "none" }}
        "#
    ))
    .unwrap();
    let channel = Endpoint::from_shared(uri.to_owned())
        .unwrap()
        .connect_lazy();
    let stack = ServiceBuilder::new()
        .layer(ClientLayer::from_policy_file(&policies).unwrap())
        .map_request((|req| req.map(Body::new)) as ToTonicBody)
        .service(channel);
    RelayClient::new(stack)
}

#[tokio::test(start_paused = true)]
async fn over_the_limit_a_grpc_call_is_shed_with_resource_exhausted_and_pushback() {
    let mut hold = ClockHold::new();
    let (uri, layer, gate, _) = serve(MS(250)).await;
    let mut busy_client = raw_client(&uri);
    let busy = tokio::spawn(async move { busy_client.hop(HopRequest { work_ms: 1 }).await });
    hold.within(until(&layer, |s| s.admitted == 1)).await;

    let status = hold
        .within(raw_client(&uri).hop(HopRequest { work_ms: 0 }))
        .await
        .expect_err("over the limit");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "250"
    );
    assert_eq!(layer.stats().shed_queue_full, 1);

    gate.add_permits(1);
    assert_eq!(
        hold.within(busy).await.unwrap().unwrap().into_inner().hop,
        "gated"
    );
    // The slot is free again: the next call is served.
    hold.within(raw_client(&uri).hop(HopRequest { work_ms: 0 }))
        .await
        .expect("under the limit");
    assert_eq!(layer.limiter().in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn our_client_waits_out_the_pushback_before_retrying() {
    let mut hold = ClockHold::new();
    let (uri, layer, gate, arrivals) = serve(MS(250)).await;
    let mut busy_client = raw_client(&uri);
    let busy = tokio::spawn(async move { busy_client.hop(HopRequest { work_ms: 1 }).await });
    hold.within(until(&layer, |s| s.admitted == 1)).await;

    let mut client = our_client(&uri, "5s");
    let call = tokio::spawn(async move { client.hop(HopRequest { work_ms: 0 }).await });
    hold.within(until(&layer, |s| s.shed() == 1)).await;
    // The slot is free from now on: only the pushback keeps the client from retrying.
    gate.add_permits(1);
    hold.within(busy).await.unwrap().unwrap();
    let mut steps = 0;
    while !call.is_finished() && steps < 1000 {
        tokio::time::advance(MS(1)).await;
        hold.within(settle()).await;
        steps += 1;
    }
    let reply = hold
        .within(call)
        .await
        .unwrap()
        .expect("the retry is served");
    assert_eq!(reply.into_inner().hop, "gated");
    // Arrivals at the server: the busy call, the shed attempt, the retry. The policy's
    // backoff is 1 ms; the pushback said 250 ms.
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 3, "{arrivals:?}");
    let gap = arrivals[2] - arrivals[1];
    assert!((MS(250)..MS(300)).contains(&gap), "retried after {gap:?}");
    let stats = layer.stats();
    assert_eq!((stats.admitted, stats.shed()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn our_client_does_not_retry_when_its_deadline_cannot_wait_for_the_pushback() {
    let mut hold = ClockHold::new();
    let (uri, layer, gate, _) = serve(Duration::from_secs(1)).await;
    let mut busy_client = raw_client(&uri);
    let busy = tokio::spawn(async move { busy_client.hop(HopRequest { work_ms: 1 }).await });
    hold.within(until(&layer, |s| s.admitted == 1)).await;

    // 300 ms in all, told to come back in 1 s: the one answer is final, at once.
    let started = tokio::time::Instant::now();
    let status = hold
        .within(our_client(&uri, "300ms").hop(HopRequest { work_ms: 0 }))
        .await
        .expect_err("shed, and not retried");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(started.elapsed(), Duration::ZERO, "it did not wait");
    assert_eq!((layer.stats().shed(), layer.stats().admitted), (1, 1));

    gate.add_permits(1);
    hold.within(busy).await.unwrap().unwrap();
}
