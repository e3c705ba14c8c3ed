//! The deadline layers in-process (tower `service_fn`s, no sockets) under paused tokio time,
//! so every figure is exact: what a hop receives, what it hands downstream, when a handler is
//! cancelled.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use stormguard::admission::{DeadlineTooClose, Refusal};
use stormguard::clock::Clock;
use stormguard::deadline::{
    self, Deadline, DeadlineHeader, DeadlineHeaders, Reserve, Selection, WallClock,
};
use stormguard_tower::deadline::{
    DeadlineBody, DeadlineLayer, IncomingDeadline, MalformedPolicy, PropagateDeadlineLayer,
};
use stormguard_tower::wire::{BoxError, refusal_of};
use tokio::sync::oneshot;
use tower::{Layer, ServiceExt, service_fn};

const MS: fn(u64) -> Duration = Duration::from_millis;

/// A wall clock that moves with tokio's (paused) clock, starting at a fixed epoch time.
fn paused_wall() -> (WallClock, SystemTime) {
    let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let start = tokio::time::Instant::now();
    let wall = WallClock::from_fn(move || base + start.elapsed());
    (wall, base)
}

fn request(headers: &[(&'static str, &'static str)]) -> Request<()> {
    let mut builder = Request::builder().uri("/");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap()
}

async fn body_text<B>(response: Response<DeadlineBody<B>>) -> String
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// A handler that counts its calls and reports the deadline it runs under.
fn counting_handler(
    calls: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<()>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<String>, Infallible>> + Send,
> + Clone {
    service_fn(move |req: Request<()>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let incoming = req.extensions().get::<IncomingDeadline>().cloned();
        async move {
            let current = deadline::current().map(|d| d.remaining());
            let header = incoming.and_then(|i| i.header).map(|h| h.name());
            Ok(Response::new(format!("{current:?} {header:?}")))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn bottom_receives_remaining_minus_reserve_exactly() {
    let (wall, base) = paused_wall();
    type Seen = Option<(HeaderMap, Option<IncomingDeadline>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let seen_by_bottom = Arc::clone(&seen);
    let bottom = DeadlineLayer::new()
        .with_wall_clock(wall.clone())
        .layer(service_fn(move |req: Request<()>| {
            *seen_by_bottom.lock().unwrap() = Some((
                req.headers().clone(),
                req.extensions().get::<IncomingDeadline>().cloned(),
            ));
            async { Ok::<_, Infallible>(Response::new(String::new())) }
        }));
    let client = PropagateDeadlineLayer::new()
        .with_reserve(Reserve::fraction(0.1).unwrap().with_fixed(MS(5)))
        .with_headers(DeadlineHeaders::ALL)
        .with_wall_clock(wall.clone())
        .validate()
        .unwrap()
        .layer(bottom);
    let had = Arc::new(Mutex::new(None));
    let had_in_top = Arc::clone(&had);
    let top = DeadlineLayer::new().layer(service_fn(move |_req: Request<()>| {
        let client = client.clone();
        let had = Arc::clone(&had_in_top);
        async move {
            // Some work of the top hop's own before the call.
            tokio::time::sleep(MS(37)).await;
            *had.lock().unwrap() = deadline::current().map(|d| d.remaining());
            client.oneshot(Request::new(())).await
        }
    }));

    let response = top.oneshot(request(&[("grpc-timeout", "1000m")])).await;
    assert_eq!(response.unwrap().status(), StatusCode::OK);

    // The top had 1000 - 37 = 963 ms; it keeps 10 % + 5 ms = 101.3 ms; 861.7 ms go downstream.
    assert_eq!(*had.lock().unwrap(), Some(MS(963)));
    let (headers, incoming) = seen.lock().unwrap().take().expect("bottom was called");
    assert_eq!(headers["grpc-timeout"], "861700u");
    assert_eq!(headers["connect-timeout-ms"], "861");
    assert_eq!(headers["x-envoy-expected-rq-timeout-ms"], "861");
    let wall_deadline = base + MS(37) + Duration::from_micros(861_700);
    let expected_abs = wall_deadline
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        .div_ceil(1_000_000);
    assert_eq!(
        headers["x-request-deadline"],
        expected_abs.to_string().as_str()
    );
    // The bottom runs under the earliest of them: 861 ms (connect-timeout-ms wins the tie
    // with Envoy's header by list order).
    let incoming = incoming.expect("bottom had a deadline");
    assert_eq!(incoming.deadline.remaining(), MS(861));
    assert_eq!(incoming.header, Some(DeadlineHeader::ConnectTimeoutMs));
    assert!(!incoming.capped);
}

/// The seeds' budget table: gateway 1000 ms → A 900 → B 600 → C 300, each hop keeping its
/// reserve (10 %, then a fixed 300 ms twice).
#[tokio::test(start_paused = true)]
async fn seeds_budget_table_gateway_a_b_c() {
    // Owned names: a `&'static str` captured by a service nested inside another handler's
    // future trips a rustc limitation (proving `Send` + `'static` with erased lifetimes).
    type Log = Arc<Mutex<Vec<(String, Duration)>>>;
    fn log(name: &str, log: &Log) {
        let left = deadline::current().map(|d| d.remaining()).unwrap();
        log.lock().unwrap().push((name.to_owned(), left));
    }
    let received: Log = Arc::default();

    let c_log = Arc::clone(&received);
    let c = DeadlineLayer::new().layer(service_fn(move |_req: Request<()>| {
        let c_log = Arc::clone(&c_log);
        async move {
            log("C", &c_log);
            Ok::<_, std::io::Error>(Response::new(String::new()))
        }
    }));
    let to_c = PropagateDeadlineLayer::new()
        .with_reserve(Reserve::fixed(MS(300)))
        .layer(c);
    let b_log = Arc::clone(&received);
    let b = DeadlineLayer::new().layer(service_fn(move |_req: Request<()>| {
        let b_log = Arc::clone(&b_log);
        let to_c = to_c.clone();
        async move {
            log("B", &b_log);
            let response = to_c.oneshot(Request::new(())).await;
            response
                .map(|_| Response::new(String::new()))
                .map_err(std::io::Error::other)
        }
    }));
    let to_b = PropagateDeadlineLayer::new()
        .with_reserve(Reserve::fixed(MS(300)))
        .layer(b);
    let a_log = Arc::clone(&received);
    let a = DeadlineLayer::new().layer(service_fn(move |_req: Request<()>| {
        let a_log = Arc::clone(&a_log);
        let to_b = to_b.clone();
        async move {
            log("A", &a_log);
            let response = to_b.oneshot(Request::new(())).await;
            response
                .map(|_| Response::new(String::new()))
                .map_err(std::io::Error::other)
        }
    }));
    let to_a = PropagateDeadlineLayer::new()
        .with_reserve(Reserve::fraction(0.1).unwrap())
        .layer(a);
    let gateway_log = Arc::clone(&received);
    // The gateway is the entry: the request carries no deadline, the gateway's default is
    // the budget.
    let gateway = DeadlineLayer::new()
        .with_default_timeout(MS(1000))
        .layer(service_fn(move |_req: Request<()>| {
            let gateway_log = Arc::clone(&gateway_log);
            let to_a = to_a.clone();
            async move {
                log("gateway", &gateway_log);
                let response = to_a.oneshot(Request::new(())).await;
                response
                    .map(|_| Response::new(String::new()))
                    .map_err(std::io::Error::other)
            }
        }));

    let response = gateway.oneshot(request(&[])).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let received = received.lock().unwrap().clone();
    let received: Vec<(&str, Duration)> = received
        .iter()
        .map(|(name, left)| (name.as_str(), *left))
        .collect();
    assert_eq!(
        received,
        [
            ("gateway", MS(1000)),
            ("A", MS(900)),
            ("B", MS(600)),
            ("C", MS(300))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn expired_request_never_reaches_the_handler() {
    let (wall, base) = paused_wall();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = DeadlineLayer::new().with_wall_clock(wall);
    let service = layer.layer(counting_handler(Arc::clone(&calls)));

    let past = (base - MS(1))
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    let past: &'static str = Box::leak(past.into_boxed_str());
    let cases = [
        request(&[("grpc-timeout", "0n")]),
        // Time left, but below the default minimum of 1 ms: as good as expired.
        request(&[("grpc-timeout", "1n")]),
        request(&[("grpc-timeout", "999u")]),
        request(&[("connect-timeout-ms", "0")]),
        request(&[("x-request-deadline", past)]),
        // Earliest wins: the long grpc-timeout does not rescue it.
        request(&[
            ("grpc-timeout", "10S"),
            ("x-envoy-expected-rq-timeout-ms", "0"),
        ]),
    ];
    for req in cases {
        let response = service.clone().oneshot(req).await.unwrap();
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(body_text(response).await, "deadline exceeded\n");
    }
    // gRPC: trailers-only DEADLINE_EXCEEDED.
    let grpc = request(&[
        ("content-type", "application/grpc+proto"),
        ("grpc-timeout", "0m"),
    ]);
    let response = service.clone().oneshot(grpc).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/grpc");
    assert_eq!(response.headers()["grpc-status"], "4");
    assert!(http_body::Body::is_end_stream(response.body()));

    // gRPC-Web: the same trailers-only answer, in the caller's own encoding.
    let grpc_web = request(&[
        ("content-type", "application/grpc-web-text+proto"),
        ("grpc-timeout", "1n"),
    ]);
    let response = service.clone().oneshot(grpc_web).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "application/grpc-web-text+proto"
    );
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(response.headers()["grpc-message"], "deadline exceeded");
    assert!(http_body::Body::is_end_stream(response.body()));

    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler never ran");
    assert_eq!(layer.stats().refused_expired, 8);
    assert_eq!(layer.stats().cancelled, 0);
    // Exactly 1 ms left is enough to run.
    let response = service
        .clone()
        .oneshot(request(&[("grpc-timeout", "1000u")]))
        .await
        .unwrap();
    assert_eq!(
        body_text(response).await,
        r#"Some(1ms) Some("grpc-timeout")"#
    );
}

#[tokio::test(start_paused = true)]
async fn the_minimum_time_left_is_configurable() {
    let calls = Arc::new(AtomicUsize::new(0));
    let text = |layer: &DeadlineLayer, timeout: &'static str| {
        let service = layer.layer(counting_handler(Arc::clone(&calls)));
        async move {
            let response = service
                .oneshot(request(&[("grpc-timeout", timeout)]))
                .await
                .unwrap();
            (response.status(), body_text(response).await)
        }
    };
    // Zero: only a request with nothing left is refused; 1 ns runs.
    let zero = DeadlineLayer::new()
        .with_min_remaining(Duration::ZERO)
        .validate()
        .unwrap();
    assert_eq!(
        text(&zero, "1n").await,
        (StatusCode::OK, r#"Some(1ns) Some("grpc-timeout")"#.into())
    );
    assert_eq!(text(&zero, "0n").await.0, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(zero.stats().refused_expired, 1);
    // 20 ms: a request with 19 ms left is refused, one with 20 ms runs.
    let twenty = DeadlineLayer::new()
        .with_min_remaining(MS(20))
        .validate()
        .unwrap();
    assert_eq!(text(&twenty, "19m").await.0, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        text(&twenty, "20m").await,
        (StatusCode::OK, r#"Some(20ms) Some("grpc-timeout")"#.into())
    );
    assert_eq!(twenty.stats().refused_expired, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Sends on its channel when dropped: proof that the handler's future was dropped.
struct DropGuard(Option<oneshot::Sender<()>>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn handler_that_outlives_the_deadline_is_cancelled() {
    for grpc in [false, true] {
        let (dropped_tx, dropped_rx) = oneshot::channel();
        let dropped_tx = Arc::new(Mutex::new(Some(dropped_tx)));
        let finished = Arc::new(AtomicUsize::new(0));
        let finished_in_handler = Arc::clone(&finished);
        let layer = DeadlineLayer::new();
        let service = layer.layer(service_fn(move |_req: Request<()>| {
            let guard = DropGuard(dropped_tx.lock().unwrap().take());
            let finished = Arc::clone(&finished_in_handler);
            async move {
                let _guard = guard;
                tokio::time::sleep(Duration::from_secs(10)).await;
                finished.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(String::from("too late")))
            }
        }));
        let start = tokio::time::Instant::now();
        let mut headers = vec![("grpc-timeout", "250m")];
        if grpc {
            headers.push(("content-type", "application/grpc"));
        }
        let response = service.oneshot(request(&headers)).await.unwrap();
        // Under paused time this is exact: the answer comes when the deadline passes.
        assert_eq!(start.elapsed(), MS(250));
        if grpc {
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()["grpc-status"], "4");
        } else {
            assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
        }
        dropped_rx.await.expect("the handler's future was dropped");
        assert_eq!(finished.load(Ordering::SeqCst), 0);
        assert_eq!(layer.stats().cancelled, 1);
        assert_eq!(layer.stats().refused_expired, 0);
    }
}

#[tokio::test(start_paused = true)]
async fn malformed_headers_are_ignored_and_counted() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = DeadlineLayer::new();
    let service = layer.layer(counting_handler(Arc::clone(&calls)));

    // The malformed grpc-timeout is ignored; the valid Envoy header still applies.
    let req = request(&[
        ("grpc-timeout", "-5S"),
        ("x-envoy-expected-rq-timeout-ms", "700"),
    ]);
    let response = service.clone().oneshot(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        body_text(response).await,
        r#"Some(700ms) Some("x-envoy-expected-rq-timeout-ms")"#
    );
    // Only malformed: the handler runs without a deadline.
    let req = request(&[
        ("connect-timeout-ms", "1.5"),
        ("x-request-deadline", "soon"),
    ]);
    let response = service.clone().oneshot(req).await.unwrap();
    assert_eq!(body_text(response).await, "None None");
    // A repeated header is counted, and the request keeps the earlier of its deadlines.
    let req = request(&[("grpc-timeout", "2S"), ("grpc-timeout", "1S")]);
    let response = service.clone().oneshot(req).await.unwrap();
    assert_eq!(
        body_text(response).await,
        r#"Some(1s) Some("grpc-timeout")"#
    );

    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let stats = layer.stats();
    assert_eq!(stats.malformed_headers, 4);
    assert_eq!(stats.malformed(DeadlineHeader::GrpcTimeout), 2);
    assert_eq!(stats.malformed(DeadlineHeader::ConnectTimeoutMs), 1);
    assert_eq!(stats.malformed(DeadlineHeader::RequestDeadline), 1);
    assert_eq!(stats.malformed(DeadlineHeader::EnvoyExpectedRqTimeoutMs), 0);
    assert_eq!(stats.rejected_malformed, 0);
}

#[tokio::test(start_paused = true)]
async fn malformed_headers_are_rejected_when_configured() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = DeadlineLayer::new().with_malformed(MalformedPolicy::Reject);
    let service = layer.layer(counting_handler(Arc::clone(&calls)));

    let response = service
        .clone()
        .oneshot(request(&[
            ("grpc-timeout", "10x"),
            ("connect-timeout-ms", "5"),
        ]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        body_text(response).await,
        "invalid grpc-timeout value: unknown unit 'x': expected one of H M S m u n\n"
    );
    let grpc = request(&[
        ("content-type", "application/grpc"),
        ("connect-timeout-ms", "12345678901"),
    ]);
    let response = service.clone().oneshot(grpc).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "3");
    assert_eq!(
        response.headers()["grpc-message"],
        "invalid connect-timeout-ms value: 11 digits, at most 10 allowed"
    );
    // A valid request still goes through.
    let response = service
        .clone()
        .oneshot(request(&[("grpc-timeout", "1S")]))
        .await
        .unwrap();
    assert_eq!(
        body_text(response).await,
        r#"Some(1s) Some("grpc-timeout")"#
    );

    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(layer.stats().rejected_malformed, 2);
    assert_eq!(layer.stats().malformed_headers, 2);
}

#[tokio::test(start_paused = true)]
async fn server_maximum_and_default_apply() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = DeadlineLayer::new()
        .with_max(MS(500))
        .with_default_timeout(MS(200))
        .validate()
        .unwrap();
    let service = layer.layer(counting_handler(Arc::clone(&calls)));
    let text = |req| {
        let service = service.clone();
        async move { body_text(service.oneshot(req).await.unwrap()).await }
    };
    assert_eq!(
        text(request(&[("grpc-timeout", "1H")])).await,
        r#"Some(500ms) Some("grpc-timeout")"#
    );
    assert_eq!(
        text(request(&[("grpc-timeout", "300m")])).await,
        r#"Some(300ms) Some("grpc-timeout")"#
    );
    assert_eq!(text(request(&[])).await, "Some(200ms) None");
}

#[tokio::test(start_paused = true)]
async fn first_present_selection_follows_the_configured_order() {
    let calls = Arc::new(AtomicUsize::new(0));
    let order = DeadlineHeaders::new(&[
        DeadlineHeader::ConnectTimeoutMs,
        DeadlineHeader::GrpcTimeout,
    ])
    .unwrap();
    let service = DeadlineLayer::new()
        .with_headers(order)
        .with_selection(Selection::FirstPresent)
        .layer(counting_handler(calls));
    let req = request(&[
        ("grpc-timeout", "100m"),
        ("connect-timeout-ms", "900"),
        // Not in the list: never read.
        ("x-envoy-expected-rq-timeout-ms", "1"),
    ]);
    let response = service.oneshot(req).await.unwrap();
    assert_eq!(
        body_text(response).await,
        r#"Some(900ms) Some("connect-timeout-ms")"#
    );
}

#[tokio::test(start_paused = true)]
async fn propagate_refuses_below_the_minimum_useful_time() {
    let sent = Arc::new(AtomicUsize::new(0));
    let sent_in_downstream = Arc::clone(&sent);
    let layer = PropagateDeadlineLayer::new()
        .with_reserve(Reserve::fixed(MS(50)))
        .with_min_call(MS(20));
    let client = layer.clone().layer(service_fn(move |_req: Request<()>| {
        sent_in_downstream.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(())) }
    }));

    // 60 ms left - 50 ms reserve = 10 ms < 20 ms: not sent.
    let parent = Deadline::after(MS(60), Clock::tokio());
    let err = deadline::scope(parent, client.clone().oneshot(Request::new(())))
        .await
        .expect_err("refused");
    let too_close = err.downcast_ref::<DeadlineTooClose>().expect("typed error");
    assert_eq!(
        *too_close,
        DeadlineTooClose {
            remaining: MS(10),
            min_call: MS(20)
        }
    );
    // Nothing left at all.
    let parent = Deadline::after(MS(40), Clock::tokio());
    let err = deadline::scope(parent, client.clone().oneshot(Request::new(())))
        .await
        .expect_err("refused");
    assert_eq!(
        err.downcast_ref::<DeadlineTooClose>().map(|e| e.remaining),
        Some(Duration::ZERO)
    );
    assert_eq!(err.to_string(), "call not sent: the deadline has passed");
    // A refusal, as every retrier and breaker of this crate reads errors.
    assert!(matches!(
        refusal_of(err.as_ref()),
        Some(Refusal::DeadlineTooClose(_))
    ));
    // 70 ms - 50 ms = 20 ms: sent.
    let parent = Deadline::after(MS(70), Clock::tokio());
    deadline::scope(parent, client.clone().oneshot(Request::new(())))
        .await
        .expect("sent");

    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_eq!(layer.stats().refused_too_close, 2);
}

#[tokio::test(start_paused = true)]
async fn propagate_reads_extensions_keeps_shorter_timeouts_and_passes_through_without_deadline() {
    let client = PropagateDeadlineLayer::new()
        .with_reserve(Reserve::fixed(MS(100)))
        .with_headers(DeadlineHeaders::new(&[DeadlineHeader::ConnectTimeoutMs]).unwrap())
        .layer(service_fn(|req: Request<()>| async move {
            let mut names: Vec<String> = req
                .headers()
                .iter()
                .map(|(k, v)| format!("{k}={}", v.to_str().unwrap()))
                .collect();
            names.sort();
            Ok::<_, Infallible>(Response::new(names.join(",")))
        }));
    let call = |req| client.clone().oneshot(req);

    // No deadline anywhere: untouched, even a stale header.
    let response = call(request(&[("grpc-timeout", "5S")])).await.unwrap();
    assert_eq!(response.body(), "grpc-timeout=5S");

    // A deadline in the request's extensions; the stale header is replaced.
    let mut req = request(&[("grpc-timeout", "5S")]);
    req.extensions_mut()
        .insert(Deadline::after(MS(1000), Clock::tokio()));
    let response = call(req).await.unwrap();
    assert_eq!(response.body(), "connect-timeout-ms=900");

    // A shorter per-call timeout already on the request wins over the propagated one.
    let req = request(&[("grpc-timeout", "250m")]);
    let parent = Deadline::after(MS(1000), Clock::tokio());
    let response = deadline::scope(parent, call(req)).await.unwrap();
    assert_eq!(response.body(), "connect-timeout-ms=250");

    // Task-local and extension deadline: the earlier one counts.
    let mut req = request(&[]);
    req.extensions_mut()
        .insert(Deadline::after(MS(400), Clock::tokio()));
    let parent = Deadline::after(MS(1000), Clock::tokio());
    let response = deadline::scope(parent, call(req)).await.unwrap();
    assert_eq!(response.body(), "connect-timeout-ms=300");
}

#[cfg(feature = "metrics")]
#[test]
fn metrics_are_emitted_with_their_labels() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let server = DeadlineLayer::new().layer(counting_handler(Arc::default()));
            let _ = server
                .clone()
                .oneshot(request(&[
                    ("grpc-timeout", "0n"),
                    ("connect-timeout-ms", "x"),
                ]))
                .await;
            let client = PropagateDeadlineLayer::new()
                .with_min_call(MS(10))
                .layer(service_fn(|_req: Request<()>| async {
                    Ok::<_, Infallible>(Response::new(()))
                }));
            let parent = Deadline::after(MS(5), Clock::tokio());
            let _ = deadline::scope(parent, client.oneshot(Request::new(()))).await;
        });
    });

    let mut counters: Vec<(String, Vec<String>, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => {
                let key = key.key();
                let labels = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                Some((key.name().to_owned(), labels, n))
            }
            _ => None,
        })
        .collect();
    counters.sort();
    let expected = |name: &str, label: &str| (name.to_owned(), vec![label.to_owned()], 1);
    assert_eq!(
        counters,
        [
            expected(
                stormguard_tower::metric_names::DEADLINE_DROPS,
                "side=client"
            ),
            expected(
                stormguard_tower::metric_names::DEADLINE_DROPS,
                "side=server"
            ),
            expected(
                stormguard_tower::metric_names::DEADLINE_HEADER_ERRORS,
                "header=connect-timeout-ms"
            ),
        ]
    );
}
