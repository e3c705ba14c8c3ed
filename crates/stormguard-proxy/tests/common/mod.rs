//! Real servers on 127.0.0.1 for the proxy's tests: a scriptable upstream, a client, and
//! proxies started on port 0.
//!
//! These tests run on the real clock, not paused time: every step is a wait on the kernel
//! (sockets, a file watch, a Python process), and under a paused clock each wait whose data
//! the kernel delivers late would jump the clock to the next timer (a per-try timeout, the
//! pool's sweep). No assertion reads a duration; a timeout in them is either what the test
//! is about and fires however slow the machine (a hedge delay of 5 ms against a copy that
//! never answers, a drain bound against a request that never ends), or a bound that only a
//! machine stalled for seconds would reach (per-try 5 s, overall 20–30 s, [`eventually`]'s and
//! `closed`'s 10 s). The service time of `/slow/MS` is real too: a loaded machine only makes
//! the latency an ingress limit learns longer, which the tests that shed by it allow for.
#![allow(dead_code, unreachable_pub)] // each test binary uses a part

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard::policy::PolicyFile;
use stormguard_proxy::{
    Direction, EgressConfig, IngressConfig, PolicySource, PoolConfig, Proxy, ProxyConfig, Upstream,
};

/// One request as the upstream saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
}

/// What the upstream does and saw.
#[derive(Default)]
pub struct Script {
    /// Answer 503 to this many requests first.
    pub fail_first: AtomicU32,
    pub seen: Mutex<Vec<Seen>>,
}

impl Script {
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    pub fn count(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }
}

/// The upstream: `/down/*` always answers 503; `/hang/*` never answers its first request
/// (a copy sent later answers); `/slow/MS` works MS milliseconds, then answers; anything
/// else answers 503 while `fail_first` lasts, then 200 with the body `ok`.
pub struct TestUpstream {
    pub addr: SocketAddr,
    pub script: Arc<Script>,
}

pub async fn upstream() -> TestUpstream {
    let script = Arc::new(Script::default());
    let app = Router::new()
        .fallback(handle)
        .with_state(Arc::clone(&script));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    TestUpstream { addr, script }
}

async fn handle(State(script): State<Arc<Script>>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let first = {
        let mut seen = script.seen.lock().expect("lock");
        seen.push(Seen {
            method: request.method().clone(),
            path: path.clone(),
            headers: request.headers().clone(),
        });
        seen.iter().filter(|s| s.path == path).count() == 1
    };
    if path.starts_with("/down") {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if path.starts_with("/hang") && first {
        std::future::pending::<()>().await;
    }
    if let Some(ms) = path.strip_prefix("/slow/").and_then(|ms| ms.parse().ok()) {
        // The service's own work time (what the ingress's limit measures), not a wait of
        // the test's.
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let failing = script
        .fail_first
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if failing {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let _ = request.into_body().collect().await;
    (StatusCode::OK, "ok").into_response()
}

/// A response read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends `request` to `addr` (the URI's path is kept, its authority replaced).
pub async fn send(addr: SocketAddr, request: http::Request<Full<Bytes>>) -> Answer {
    let (mut head, body) = request.into_parts();
    let path = head
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    head.uri = format!("http://{addr}{path}").parse().expect("uri");
    let response = client()
        .request(http::Request::from_parts(head, body))
        .await
        .expect("the proxy answers");
    let (head, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Answer {
        status: head.status,
        headers: head.headers,
        body,
    }
}

pub fn get(path: &str) -> http::Request<Full<Bytes>> {
    http::Request::get(path)
        .body(Full::new(Bytes::new()))
        .expect("request")
}

pub fn post(path: &str, key: Option<&str>) -> http::Request<Full<Bytes>> {
    let mut builder = http::Request::post(path);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", format!("\"{key}\""));
    }
    builder
        .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
        .expect("request")
}

/// An egress proxy to `upstream` (or to each request's host when `None`) with `policies`.
pub async fn egress(upstream: Option<SocketAddr>, policies: &str) -> Proxy {
    egress_with(upstream, PolicySource::Fixed(policy(policies)), None, None).await
}

pub async fn egress_with(
    upstream: Option<SocketAddr>,
    policy: PolicySource,
    fault: Option<stormguard::fault::FaultConfig>,
    admin: Option<SocketAddr>,
) -> Proxy {
    Proxy::start(egress_config(upstream, policy, fault, admin))
        .await
        .expect("the egress proxy starts")
}

/// The configuration [`egress_with`] starts: listening on a port of the system's choice, the
/// default pool, a fixed seed.
pub fn egress_config(
    upstream: Option<SocketAddr>,
    policy: PolicySource,
    fault: Option<stormguard::fault::FaultConfig>,
    admin: Option<SocketAddr>,
) -> ProxyConfig {
    ProxyConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        admin,
        upstream: upstream.map(|a| a.to_string().parse::<Upstream>().expect("upstream")),
        direction: Direction::Egress(EgressConfig {
            policy,
            fault,
            seed: Some(7),
        }),
        pool: PoolConfig::default(),
    }
}

pub async fn ingress(upstream: SocketAddr, config: IngressConfig) -> Proxy {
    Proxy::start(ProxyConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        admin: Some("127.0.0.1:0".parse().expect("addr")),
        upstream: Some(upstream.to_string().parse().expect("upstream")),
        direction: Direction::Ingress(config),
        pool: PoolConfig::default(),
    })
    .await
    .expect("the ingress proxy starts")
}

pub fn policy(toml: &str) -> PolicyFile {
    PolicyFile::from_toml(toml).expect("valid policies")
}

/// Polls `check` every millisecond until it holds, for at most ten seconds (a file watch
/// reports on its own time; nothing here asserts how long it took).
pub async fn eventually(mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..10_000 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the condition did not hold within ten seconds");
}

/// The admin port's `/status` document.
pub async fn status(admin: SocketAddr) -> serde_json::Value {
    let answer = send(admin, get("/status")).await;
    assert_eq!(answer.status, StatusCode::OK);
    serde_json::from_slice(&answer.body).expect("status is JSON")
}

pub fn body(b: &'static str) -> Body {
    Body::from(b)
}
