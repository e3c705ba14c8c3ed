//! The deadline layers on real HTTP servers (axum on 127.0.0.1, ephemeral ports) and a real
//! hyper client, in real time. No assertion is about how long something took: values the
//! servers saw are compared with values computed by the sender, with a tolerance.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard::deadline::{self, Reserve, parse_grpc_timeout};
use stormguard_tower::deadline::{
    DeadlineHeaders, DeadlineLayer, DeadlineTooClose, MalformedPolicy, PropagateDeadline,
    PropagateDeadlineLayer,
};
use tokio::sync::mpsc;
use tower::ServiceExt;

/// Generous bound on any single exchange, so a broken test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);
/// How far the header a downstream saw may be from what the sender computed.
const TOLERANCE: Duration = Duration::from_millis(5);

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// Sends a GET with `headers` and returns status, headers and body text.
async fn get_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, String)],
) -> (StatusCode, HeaderMap, String) {
    let mut builder = Request::get(format!("http://{addr}{path}"));
    for (name, value) in headers {
        builder = builder.header(*name, value.as_str());
    }
    let request = builder.body(Full::new(Bytes::new())).unwrap();
    let response = tokio::time::timeout(PATIENCE, client().request(request))
        .await
        .expect("answered in time")
        .unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(bytes.to_vec()).unwrap(),
    )
}

fn epoch_millis(at: SystemTime) -> u128 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Reports the deadline headers it received and the time left it runs under.
async fn report(headers: HeaderMap) -> String {
    let get = |name: &str| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let left = deadline::current().map(|d| d.remaining().as_nanos());
    format!(
        "{}|{}|{}|{}",
        get("grpc-timeout"),
        get("connect-timeout-ms"),
        get("x-request-deadline"),
        left.unwrap_or(0)
    )
}

#[derive(Clone)]
struct Top {
    bottom: SocketAddr,
    client: PropagateDeadline<HttpClient>,
    reserve: Reserve,
}

/// Calls the bottom hop under the current deadline and returns what the top computed just
/// before the call (time to hand downstream, and its wall-clock deadline) with the bottom's
/// report.
async fn top_handler(State(top): State<Top>) -> Result<String, (StatusCode, String)> {
    let current = deadline::current().expect("the top runs under a deadline");
    let had = current.remaining();
    // What `Deadline::child` hands on, computed from the same reading of the clock.
    let expected = had.saturating_sub(top.reserve.kept_from(had));
    let expected_abs = SystemTime::now() + expected;
    let request = Request::get(format!("http://{}/report", top.bottom))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = top.client.oneshot(request).await.map_err(|e| {
        let status = if e.downcast_ref::<DeadlineTooClose>().is_some() {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::BAD_GATEWAY
        };
        (status, e.to_string())
    })?;
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Ok(format!(
        "{}|{}|{}|{}",
        had.as_nanos(),
        expected.as_nanos(),
        epoch_millis(expected_abs),
        String::from_utf8_lossy(&bytes)
    ))
}

struct Chain {
    top: SocketAddr,
    bottom_calls: Arc<AtomicUsize>,
}

async fn chain(reserve: Reserve, min_call: Duration) -> Chain {
    let bottom_calls = Arc::new(AtomicUsize::new(0));
    let calls = Arc::clone(&bottom_calls);
    let bottom = Router::new()
        .route(
            "/report",
            get(move |headers: HeaderMap| {
                calls.fetch_add(1, Ordering::SeqCst);
                report(headers)
            }),
        )
        .layer(DeadlineLayer::new());
    let bottom = serve(bottom).await;
    let propagate = PropagateDeadlineLayer::new()
        .with_reserve(reserve)
        .with_min_call(min_call)
        .with_headers(DeadlineHeaders::ALL)
        .validate()
        .unwrap();
    let top = Top {
        bottom,
        client: tower::Layer::layer(&propagate, client()),
        reserve,
    };
    let top = Router::new()
        .route("/", get(top_handler))
        .with_state(top)
        .layer(DeadlineLayer::new());
    Chain {
        top: serve(top).await,
        bottom_calls,
    }
}

#[tokio::test]
async fn bottom_receives_what_the_top_had_minus_the_reserve() {
    let reserve = Reserve::fraction(0.1)
        .unwrap()
        .with_fixed(Duration::from_millis(20));
    let chain = chain(reserve, Duration::ZERO).await;
    let (status, _, body) = get_with(chain.top, "/", &[("grpc-timeout", "2S".into())]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let fields: Vec<&str> = body.split('|').collect();
    let nanos = |s: &str| Duration::from_nanos(s.parse().unwrap());
    let had = nanos(fields[0]);
    let expected = nanos(fields[1]);
    let expected_abs: u128 = fields[2].parse().unwrap();
    let (grpc, connect, absolute) = (fields[3], fields[4], fields[5]);
    let bottom_left = nanos(fields[6]);

    // The top had at most the 2 s it was sent, and handed on what it had minus the reserve.
    assert!(had <= Duration::from_secs(2), "top had {had:?}");
    assert!(expected < had);
    // The bottom saw that value, within the tolerance, in every format.
    let grpc = parse_grpc_timeout(grpc.as_bytes()).unwrap();
    assert!(
        grpc.abs_diff(expected) <= TOLERANCE,
        "grpc-timeout {grpc:?} vs expected {expected:?}"
    );
    let connect = Duration::from_millis(connect.parse().unwrap());
    assert!(
        connect.abs_diff(expected) <= TOLERANCE,
        "connect-timeout-ms {connect:?} vs expected {expected:?}"
    );
    let absolute: u128 = absolute.parse().unwrap();
    assert!(
        absolute.abs_diff(expected_abs) <= TOLERANCE.as_millis(),
        "x-request-deadline {absolute} vs expected {expected_abs}"
    );
    // The downstream never gets more than the sender meant (the grpc encoding rounds up by
    // less than a microsecond), and the bottom runs under it.
    assert!(grpc <= expected + Duration::from_micros(1));
    assert!(bottom_left > Duration::ZERO && bottom_left <= grpc);
    assert_eq!(chain.bottom_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn propagate_refuses_to_send_below_the_minimum_useful_time() {
    // 300 ms left, 100 ms kept, 500 ms needed: the bottom is never called.
    let chain = chain(
        Reserve::fixed(Duration::from_millis(100)),
        Duration::from_millis(500),
    )
    .await;
    let (status, _, body) = get_with(chain.top, "/", &[("grpc-timeout", "300m".into())]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.starts_with("call not sent"), "{body}");
    assert_eq!(chain.bottom_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn expired_request_is_refused_without_running_the_handler() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let layer = DeadlineLayer::new();
    let router = Router::new()
        .route(
            "/",
            get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { "ran" }
            }),
        )
        .layer(layer.clone());
    let addr = serve(router).await;

    let past = epoch_millis(SystemTime::now() - Duration::from_secs(1)).to_string();
    let (status, _, body) = get_with(addr, "/", &[("x-request-deadline", past.clone())]).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(body, "deadline exceeded\n");
    let (status, headers, body) = get_with(
        addr,
        "/",
        &[
            ("x-request-deadline", past),
            ("content-type", "application/grpc".into()),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["grpc-status"], "4");
    assert_eq!(body, "");

    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(layer.stats().refused_expired, 2);
    // A request with time left runs.
    let (status, _, body) = get_with(addr, "/", &[("connect-timeout-ms", "5000".into())]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ran"));
}

/// Sends on its channel when dropped.
struct DropGuard(mpsc::UnboundedSender<&'static str>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        let _ = self.0.send("dropped");
    }
}

#[tokio::test]
async fn handler_outliving_its_deadline_is_cancelled() {
    let (dropped_tx, mut dropped_rx) = mpsc::unbounded_channel();
    let finished = Arc::new(AtomicUsize::new(0));
    let finished_in_handler = Arc::clone(&finished);
    let layer = DeadlineLayer::new();
    let router = Router::new()
        .route(
            "/slow",
            get(move || {
                let guard = DropGuard(dropped_tx.clone());
                let finished = Arc::clone(&finished_in_handler);
                async move {
                    let _guard = guard;
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                    "done"
                }
            }),
        )
        .layer(layer.clone());
    let addr = serve(router).await;

    let (status, _, body) = get_with(addr, "/slow", &[("grpc-timeout", "200m".into())]).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(body, "deadline exceeded\n");
    let dropped = tokio::time::timeout(PATIENCE, dropped_rx.recv()).await;
    assert_eq!(dropped.expect("dropped in time"), Some("dropped"));
    assert_eq!(finished.load(Ordering::SeqCst), 0);
    assert_eq!(layer.stats().cancelled, 1);
}

#[tokio::test]
async fn malformed_headers_are_counted_and_ignored_or_rejected() {
    let ignoring = DeadlineLayer::new();
    let rejecting = DeadlineLayer::new().with_malformed(MalformedPolicy::Reject);
    let route = || get(|headers: HeaderMap| report(headers));
    let ignore_addr = serve(Router::new().route("/", route()).layer(ignoring.clone())).await;
    let reject_addr = serve(Router::new().route("/", route()).layer(rejecting.clone())).await;
    let bad = [
        ("grpc-timeout", "1.5S".to_owned()),
        ("connect-timeout-ms", "800".to_owned()),
    ];

    let (status, _, body) = get_with(ignore_addr, "/", &bad).await;
    assert_eq!(status, StatusCode::OK);
    // The connect-timeout-ms header still bounds the handler.
    let left: u128 = body.rsplit('|').next().unwrap().parse().unwrap();
    assert!(left > 0 && left <= Duration::from_millis(800).as_nanos());
    assert_eq!(ignoring.stats().malformed_headers, 1);

    let (status, _, body) = get_with(reject_addr, "/", &bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body,
        "invalid grpc-timeout value: byte 0x2e (.) at position 1 is not a digit\n"
    );
    assert_eq!(rejecting.stats().malformed_headers, 1);
    assert_eq!(rejecting.stats().rejected_malformed, 1);
}
