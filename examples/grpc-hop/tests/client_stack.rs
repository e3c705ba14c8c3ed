//! The one client stack in front of a tonic channel: a generated `RelayClient` whose calls
//! are retried under a policy file, each attempt carrying its own `grpc-timeout` (the per-try
//! timeout, not the whole call's), against a real tonic server on 127.0.0.1 that fails on
//! purpose. This is the tonic snippet of the README's client section, run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use grpc_hop::pb::relay_client::RelayClient;
use grpc_hop::pb::relay_server::Relay;
use grpc_hop::pb::{HopReply, HopRequest};
use grpc_hop::serve;
use stormguard::deadline::parse_grpc_timeout;
use stormguard::policy::PolicyFile;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::{Client, ClientLayer};
use stormguard_tower::deadline::DeadlineLayer;
use stormguard_tower::wire::RETRY_EXHAUSTED;
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};
use tower::ServiceBuilder;
use tower::util::MapRequest;

/// Retries `Relay.Hop` (declared idempotent), 200 ms per attempt, 3 attempts in 5 s.
const POLICIES: &str = r#"
    [endpoints."POST /stormguard.relay.Relay/*"]
    idempotency = "idempotent"
    timeouts = { per_try = "200ms", overall = "5s" }
    retry = { max_attempts = 3 }
    backoff = { kind = "fixed", base = "1ms", jitter = "none" }
"#;

/// Answers `UNAVAILABLE` to the first `failures` calls, then reports the `grpc-timeout` it got.
#[derive(Clone)]
struct Flaky {
    failures: u32,
    calls: Arc<AtomicU32>,
}

#[tonic::async_trait]
impl Relay for Flaky {
    async fn hop(&self, request: Request<HopRequest>) -> Result<Response<HopReply>, Status> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
            return Err(Status::unavailable("warming up"));
        }
        let timeout = request.metadata().get("grpc-timeout").unwrap();
        Ok(Response::new(HopReply {
            hop: "flaky".to_owned(),
            header_value: timeout.to_str().unwrap().to_owned(),
            ..HopReply::default()
        }))
    }
}

async fn flaky_server(failures: u32) -> (String, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let relay = Flaky {
        failures,
        calls: calls.clone(),
    };
    tokio::spawn(serve(listener, relay, DeadlineLayer::new()));
    (uri, calls)
}

/// The stack hands each attempt on as a `ReplayBody`; a tonic channel takes tonic's body.
type ToTonicBody = fn(http::Request<ReplayBody<Body>>) -> http::Request<Body>;

/// The README's tonic client: the stack over a lazily connected channel.
fn relay_client(uri: String) -> RelayClient<Client<MapRequest<Channel, ToTonicBody>>> {
    let policies = PolicyFile::from_toml(POLICIES).unwrap();
    let channel = Endpoint::from_shared(uri).unwrap().connect_lazy();
    let stack = ServiceBuilder::new()
        .layer(ClientLayer::from_policy_file(&policies).unwrap())
        .map_request((|req| req.map(Body::new)) as ToTonicBody)
        .service(channel);
    RelayClient::new(stack)
}

#[tokio::test]
async fn a_tonic_client_is_retried_with_the_per_try_timeout_on_the_wire() {
    let (uri, calls) = flaky_server(2).await;
    let reply = relay_client(uri)
        .hop(HopRequest { work_ms: 0 })
        .await
        .expect("answered on the third attempt")
        .into_inner();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // The attempt's own deadline, not the call's 5 s.
    let sent = parse_grpc_timeout(reply.header_value.as_bytes()).unwrap();
    assert!(
        sent <= Duration::from_millis(200) && sent > Duration::ZERO,
        "grpc-timeout {} is not the per-try timeout",
        reply.header_value
    );
}

#[tokio::test]
async fn a_tonic_client_gets_the_last_status_marked_exhausted() {
    let (uri, calls) = flaky_server(u32::MAX).await;
    let status = relay_client(uri)
        .hop(HopRequest { work_ms: 0 })
        .await
        .expect_err("never answers");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "warming up");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // Nobody upstream retries it again.
    assert_eq!(
        status.metadata().get(RETRY_EXHAUSTED.as_str()).unwrap(),
        "true"
    );
}
