//! The deadline layers on real HTTP servers (axum on 127.0.0.1, ephemeral ports) and a real
//! hyper client, all on one current-thread runtime under paused tokio time, so every figure a
//! server sees is exact.
//!
//! Every test holds the clock ([`ClockHold`], see `support/clock_hold.rs` for why) and moves
//! it only with `tokio::time::advance`, at a point it has reached (say "the handler is
//! asleep"): no time passes during I/O, and every value is compared exactly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/clock_hold.rs"]
mod clock_hold;

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
use stormguard::clock::Clock;
use stormguard::deadline::{self, DeadlineHeaders, Reserve, WallClock};
use stormguard_tower::deadline::{
    DeadlineLayer, IncomingDeadline, MalformedPolicy, PropagateDeadline, PropagateDeadlineLayer,
};
use tokio::sync::mpsc;
use tower::ServiceExt;

use clock_hold::ClockHold;

const MS: fn(u64) -> Duration = Duration::from_millis;

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

/// Sends a GET with `headers` (a name may repeat) and returns status, headers and body text.
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
    let response = client().request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(bytes.to_vec()).unwrap(),
    )
}

/// Wall-clock time moving with tokio's paused clock (for `x-request-deadline`).
fn paused_wall() -> WallClock {
    WallClock::from_clock(Clock::tokio())
}

fn epoch_millis(at: SystemTime) -> u128 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        .div_ceil(1_000_000)
}

/// Reports the deadline headers it received, the time left it runs under and the header that
/// time came from.
async fn report(headers: HeaderMap, incoming: Option<IncomingDeadline>) -> String {
    let get = |name: &str| {
        let values: Vec<_> = headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        values.join(",")
    };
    let left = deadline::current().map(|d| d.remaining());
    let via = incoming.and_then(|i| i.header).map(|h| h.name());
    format!(
        "{}|{}|{}|{}|{left:?}|{via:?}",
        get("grpc-timeout"),
        get("connect-timeout-ms"),
        get("x-envoy-expected-rq-timeout-ms"),
        get("x-request-deadline"),
    )
}

fn report_route() -> axum::routing::MethodRouter {
    get(
        |headers: HeaderMap, incoming: Option<axum::Extension<IncomingDeadline>>| {
            report(headers, incoming.map(|e| e.0))
        },
    )
}

#[derive(Clone)]
struct Top {
    bottom: SocketAddr,
    client: PropagateDeadline<HttpClient>,
}

/// Calls the bottom hop under the current deadline; answers with the time it had and the
/// bottom's report.
async fn top_handler(State(top): State<Top>) -> Result<String, (StatusCode, String)> {
    let had = deadline::current().map(|d| d.remaining());
    let request = Request::get(format!("http://{}/report", top.bottom))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = top
        .client
        .oneshot(request)
        .await
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Ok(format!("{had:?} -> {}", String::from_utf8_lossy(&bytes)))
}

struct Chain {
    top: SocketAddr,
    top_layer: DeadlineLayer,
    bottom_calls: Arc<AtomicUsize>,
}

async fn chain(reserve: Reserve, min_call: Duration, wall: &WallClock) -> Chain {
    let bottom_calls = Arc::new(AtomicUsize::new(0));
    let calls = Arc::clone(&bottom_calls);
    let bottom = Router::new()
        .route(
            "/report",
            get(
                move |headers: HeaderMap, incoming: axum::Extension<IncomingDeadline>| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    report(headers, Some(incoming.0))
                },
            ),
        )
        .layer(DeadlineLayer::new().with_wall_clock(wall.clone()));
    let bottom = serve(bottom).await;
    let propagate = PropagateDeadlineLayer::new()
        .with_reserve(reserve)
        .with_min_call(min_call)
        .with_headers(DeadlineHeaders::ALL)
        .with_wall_clock(wall.clone())
        .validate()
        .unwrap();
    let top = Top {
        bottom,
        client: tower::Layer::layer(&propagate, client()),
    };
    let top_layer = DeadlineLayer::new().with_wall_clock(wall.clone());
    let top = Router::new()
        .route("/", get(top_handler))
        .with_state(top)
        .layer(top_layer.clone());
    Chain {
        top: serve(top).await,
        top_layer,
        bottom_calls,
    }
}

#[tokio::test(start_paused = true)]
async fn bottom_receives_what_the_top_had_minus_the_reserve() {
    let mut hold = ClockHold::new();
    let wall = paused_wall();
    let reserve = Reserve::fraction(0.1).unwrap().with_fixed(MS(20));
    let chain = chain(reserve, Duration::ZERO, &wall).await;
    let (status, _, body) = hold
        .within(get_with(chain.top, "/", &[("grpc-timeout", "2S".into())]))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The top had the 2 s it was sent, kept 10 % + 20 ms and handed on 1780 ms, in every
    // format; x-request-deadline is the wall-clock time now plus 1780 ms, rounded up to the
    // millisecond. The bottom runs under the earliest: 1780 ms, from grpc-timeout (the list
    // order breaks the tie with the millisecond headers).
    let absolute = epoch_millis(wall.now() + MS(1780));
    assert_eq!(
        body,
        format!("Some(2s) -> 1780000u|1780|1780|{absolute}|Some(1.78s)|Some(\"grpc-timeout\")")
    );
    assert_eq!(chain.bottom_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_repeated_deadline_header_leaves_the_request_with_the_earlier_deadline() {
    let mut hold = ClockHold::new();
    let wall = paused_wall();
    let chain = chain(Reserve::fixed(MS(100)), Duration::ZERO, &wall).await;
    // Two grpc-timeout headers: ignored as malformed (the default policy), the request still
    // runs under the earlier of them, and hands that on downstream.
    let repeated = [
        ("grpc-timeout", "5S".to_owned()),
        ("grpc-timeout", "2S".to_owned()),
    ];
    let (status, _, body) = hold.within(get_with(chain.top, "/", &repeated)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let absolute = epoch_millis(wall.now() + MS(1900));
    assert_eq!(
        body,
        format!("Some(2s) -> 1900000u|1900|1900|{absolute}|Some(1.9s)|Some(\"grpc-timeout\")")
    );
    assert_eq!(chain.top_layer.stats().malformed_headers, 1);
    assert_eq!(chain.top_layer.stats().rejected_malformed, 0);

    // Under MalformedPolicy::Reject the same request is refused, naming the repeat.
    let rejecting = DeadlineLayer::new().with_malformed(MalformedPolicy::Reject);
    let addr = serve(
        Router::new()
            .route("/", report_route())
            .layer(rejecting.clone()),
    )
    .await;
    let (status, _, body) = hold.within(get_with(addr, "/", &repeated)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body,
        "grpc-timeout appears 2 times; a deadline header may appear only once\n"
    );
    assert_eq!(rejecting.stats().rejected_malformed, 1);
}

#[tokio::test(start_paused = true)]
async fn propagate_refuses_to_send_below_the_minimum_useful_time() {
    let mut hold = ClockHold::new();
    let chain = chain(Reserve::fixed(MS(100)), MS(500), &paused_wall()).await;
    // 300 ms left, 100 ms kept, 500 ms needed: the bottom is never called.
    let (status, _, body) = hold
        .within(get_with(chain.top, "/", &[("grpc-timeout", "300m".into())]))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(
        body,
        "call not sent: 200ms left for downstream after the hop reserve, below the minimum useful call time of 500ms"
    );
    // 100 ms left, all kept: nothing is left for downstream.
    let (status, _, body) = hold
        .within(get_with(chain.top, "/", &[("grpc-timeout", "100m".into())]))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body, "call not sent: the deadline has passed");
    assert_eq!(chain.bottom_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn expired_request_is_refused_without_running_the_handler() {
    let mut hold = ClockHold::new();
    let wall = paused_wall();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let layer = DeadlineLayer::new().with_wall_clock(wall.clone());
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

    let past = epoch_millis(wall.now() - Duration::from_secs(1)).to_string();
    for expired in [
        ("x-request-deadline", past.clone()),
        // 1 ns left: below the server's minimum of 1 ms, as good as expired.
        ("grpc-timeout", "1n".to_owned()),
    ] {
        let (status, _, body) = hold.within(get_with(addr, "/", &[expired])).await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(body, "deadline exceeded\n");
    }
    for (content_type, answered) in [
        ("application/grpc", "application/grpc"),
        ("application/grpc-web+proto", "application/grpc-web+proto"),
    ] {
        let (status, headers, body) = hold
            .within(get_with(
                addr,
                "/",
                &[
                    ("x-request-deadline", past.clone()),
                    ("content-type", content_type.into()),
                ],
            ))
            .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["content-type"], answered);
        assert_eq!(headers["grpc-status"], "4");
        assert_eq!(body, "");
    }

    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(layer.stats().refused_expired, 4);
    // A request with time left runs.
    let (status, _, body) = hold
        .within(get_with(
            addr,
            "/",
            &[("connect-timeout-ms", "5000".into())],
        ))
        .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ran"));
}

/// Sends on its channel when dropped.
struct DropGuard(mpsc::UnboundedSender<&'static str>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        let _ = self.0.send("dropped");
    }
}

#[tokio::test(start_paused = true)]
async fn handler_outliving_its_deadline_is_cancelled() {
    let mut hold = ClockHold::new();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let finished = Arc::new(AtomicUsize::new(0));
    let finished_in_handler = Arc::clone(&finished);
    let layer = DeadlineLayer::new();
    let router = Router::new()
        .route(
            "/slow",
            get(move || {
                let guard = DropGuard(events_tx.clone());
                let finished = Arc::clone(&finished_in_handler);
                async move {
                    let _ = guard.0.send("asleep");
                    let _guard = guard;
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                    "done"
                }
            }),
        )
        .layer(layer.clone());
    let addr = serve(router).await;

    let start = tokio::time::Instant::now();
    let headers = [("grpc-timeout", "200m".to_owned())];
    let call = get_with(addr, "/slow", &headers);
    let ((status, _, body), ()) = hold
        .within(async {
            tokio::join!(call, async {
                assert_eq!(events.recv().await, Some("asleep"));
                // The handler waits for 600 s; its deadline passes after 200.
                tokio::time::advance(MS(200)).await;
            })
        })
        .await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(body, "deadline exceeded\n");
    assert_eq!(start.elapsed(), MS(200), "only the test moved the clock");
    assert_eq!(
        hold.within(events.recv()).await,
        Some("dropped"),
        "the handler's future was dropped"
    );
    assert_eq!(finished.load(Ordering::SeqCst), 0);
    assert_eq!(layer.stats().cancelled, 1);
}

#[tokio::test(start_paused = true)]
async fn malformed_headers_are_counted_and_ignored_or_rejected() {
    let mut hold = ClockHold::new();
    let ignoring = DeadlineLayer::new();
    let rejecting = DeadlineLayer::new().with_malformed(MalformedPolicy::Reject);
    let ignore_addr = serve(
        Router::new()
            .route("/", report_route())
            .layer(ignoring.clone()),
    )
    .await;
    let reject_addr = serve(
        Router::new()
            .route("/", report_route())
            .layer(rejecting.clone()),
    )
    .await;
    let bad = [
        ("grpc-timeout", "1.5S".to_owned()),
        ("connect-timeout-ms", "800".to_owned()),
    ];

    let (status, _, body) = hold.within(get_with(ignore_addr, "/", &bad)).await;
    assert_eq!(status, StatusCode::OK);
    // The connect-timeout-ms header still bounds the handler.
    assert_eq!(body, r#"1.5S|800|||Some(800ms)|Some("connect-timeout-ms")"#);
    assert_eq!(ignoring.stats().malformed_headers, 1);

    let (status, _, body) = hold.within(get_with(reject_addr, "/", &bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body,
        "invalid grpc-timeout value: byte 0x2e (.) at position 1 is not a digit\n"
    );
    assert_eq!(rejecting.stats().malformed_headers, 1);
    assert_eq!(rejecting.stats().rejected_malformed, 1);
}
