//! `HedgeLayer` over in-process services under tokio's paused clock — which requests are
//! hedged, replayed bodies, cancelled losers, fatal and non-fatal statuses, pushback, the
//! deadline, and the tail it cuts over a bimodal `FaultLayer` — and once over real HTTP/1.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline};
use stormguard::fault::{FaultConfig, FaultInjector, Latency};
use stormguard::policy::{BudgetSpec, HedgeDelaySpec, HedgeSpec};
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::Error;
use stormguard_tower::fault::FaultLayer;
use stormguard_tower::hedge::HedgeLayer;
use stormguard_tower::observe::{AttemptStart, CallInfo, Observer};
use tokio::time::{Instant, sleep};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

const MS: Duration = Duration::from_millis(1);

/// What the downstream does for call `n` (1-based): wait, then answer a status with headers.
#[derive(Clone)]
struct Step {
    wait: Duration,
    status: u16,
    headers: Vec<(&'static str, &'static str)>,
}

fn ok(wait_ms: u64) -> Step {
    Step {
        wait: Duration::from_millis(wait_ms),
        status: 200,
        headers: vec![],
    }
}

fn status(wait_ms: u64, status: u16, headers: Vec<(&'static str, &'static str)>) -> Step {
    Step {
        wait: Duration::from_millis(wait_ms),
        status,
        headers,
    }
}

/// What the downstream saw: when each call arrived, its body, and how many were dropped
/// before answering.
#[derive(Default)]
struct Seen {
    arrived: Mutex<Vec<Duration>>,
    bodies: Mutex<Vec<Bytes>>,
    dropped: AtomicU32,
}

/// Counts a call as dropped unless it finished.
struct DropGuard(Arc<Seen>, bool);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

type Body<B> = ReplayBody<B>;

/// A downstream following `script` (the last step repeats), answering `x-call: n`.
fn scripted<B>(
    script: Vec<Step>,
    seen: Arc<Seen>,
) -> impl Service<
    Request<Body<B>>,
    Response = Response<Full<Bytes>>,
    Error = BoxError,
    Future: Send + 'static,
> + Clone
+ Send
+ 'static
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let start = Instant::now();
    let calls = Arc::new(AtomicU32::new(0));
    tower::service_fn(move |req: Request<Body<B>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let step = script[(n as usize - 1).min(script.len() - 1)].clone();
        seen.arrived.lock().unwrap().push(start.elapsed());
        let seen = seen.clone();
        async move {
            let mut guard = DropGuard(seen.clone(), false);
            let body = req.into_body().collect().await?.to_bytes();
            seen.bodies.lock().unwrap().push(body);
            sleep(step.wait).await;
            guard.1 = true;
            let mut response = Response::builder()
                .status(step.status)
                .header("x-call", n.to_string());
            for (name, value) in step.headers {
                response = response.header(name, value);
            }
            Ok::<_, BoxError>(response.body(Full::from("answer"))?)
        }
    })
}

fn spec(max: u32, delay_ms: u64) -> HedgeSpec {
    HedgeSpec {
        max_attempts: max,
        delay: HedgeDelaySpec::Fixed(Duration::from_millis(delay_ms)),
    }
}

fn hedger(max: u32, delay_ms: u64) -> HedgeLayer {
    HedgeLayer::new(spec(max, delay_ms)).unwrap()
}

type Answer = Response<ReplayBody<Full<Bytes>>>;

async fn send<S, B>(svc: &mut S, request: Request<B>) -> Result<Answer, Error>
where
    S: Service<Request<B>, Response = Answer, Error = Error>,
{
    svc.ready().await?.call(request).await
}

fn get() -> Request<Full<Bytes>> {
    Request::get("/item").body(Full::default()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_slow_get_is_hedged_and_the_loser_dropped() {
    let seen = Arc::new(Seen::default());
    let mut svc = ServiceBuilder::new()
        .layer(hedger(2, 20))
        .service(scripted(vec![ok(1000), ok(5)], seen.clone()));
    let start = Instant::now();
    let response = send(&mut svc, get()).await.unwrap();
    assert_eq!(response.headers()["x-call"], "2");
    assert_eq!(start.elapsed(), 25 * MS);
    assert_eq!(*seen.arrived.lock().unwrap(), vec![Duration::ZERO, 20 * MS]);
    assert_eq!(seen.dropped.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn only_safe_replayable_requests_are_hedged() {
    // POST without a key: one call, however slow.
    let seen = Arc::new(Seen::default());
    let mut svc = ServiceBuilder::new()
        .layer(hedger(3, 20))
        .service(scripted(vec![ok(1000), ok(5)], seen.clone()));
    let post = Request::post("/pay").body(Full::from("charge")).unwrap();
    let response = send(&mut svc, post).await.unwrap();
    assert_eq!(response.headers()["x-call"], "1");
    assert_eq!(seen.arrived.lock().unwrap().len(), 1);

    // POST with an Idempotency-Key: hedged, and every attempt carries the same body.
    let seen = Arc::new(Seen::default());
    let mut svc = ServiceBuilder::new()
        .layer(hedger(3, 20))
        .service(scripted(vec![ok(1000), ok(1000), ok(5)], seen.clone()));
    let keyed = Request::post("/pay")
        .header("idempotency-key", "\"order-7\"")
        .body(Full::from("charge"))
        .unwrap();
    let response = send(&mut svc, keyed).await.unwrap();
    assert_eq!(response.headers()["x-call"], "3");
    assert_eq!(*seen.bodies.lock().unwrap(), vec![Bytes::from("charge"); 3]);

    // A body over the limit: not buffered, not hedged.
    let seen = Arc::new(Seen::default());
    let mut svc = ServiceBuilder::new()
        .layer(
            HedgeLayer::builder(spec(3, 20))
                .with_body_limit(4)
                .build()
                .unwrap(),
        )
        .service(scripted(vec![ok(1000), ok(5)], seen.clone()));
    let big = Request::put("/item").body(Full::from("12345")).unwrap();
    send(&mut svc, big).await.unwrap();
    assert_eq!(seen.arrived.lock().unwrap().len(), 1);
    assert_eq!(*seen.bodies.lock().unwrap(), vec![Bytes::from("12345")]);

    // A streaming body of unknown length: passed through, not hedged.
    let seen = Arc::new(Seen::default());
    let mut svc = ServiceBuilder::new()
        .layer(hedger(3, 20))
        .service(scripted(vec![ok(1000), ok(5)], seen.clone()));
    let chunks = futures::stream::iter(vec![
        Ok::<_, Infallible>(Frame::data(Bytes::from("a"))),
        Ok(Frame::data(Bytes::from("b"))),
    ]);
    let streamed = Request::get("/item").body(StreamBody::new(chunks)).unwrap();
    send(&mut svc, streamed).await.unwrap();
    assert_eq!(seen.arrived.lock().unwrap().len(), 1);
    assert_eq!(*seen.bodies.lock().unwrap(), vec![Bytes::from("ab")]);
}

#[tokio::test(start_paused = true)]
async fn a_fatal_status_ends_the_call_a_non_fatal_one_hedges_at_once() {
    let seen = Arc::new(Seen::default());
    let mut svc = ServiceBuilder::new().layer(hedger(3, 20)).service(scripted(
        vec![ok(1000), status(5, 404, vec![]), ok(1)],
        seen.clone(),
    ));
    let start = Instant::now();
    let response = send(&mut svc, get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(start.elapsed(), 25 * MS);
    assert_eq!(seen.arrived.lock().unwrap().len(), 2);
    assert_eq!(
        seen.dropped.load(Ordering::SeqCst),
        1,
        "the original was cancelled"
    );

    let seen = Arc::new(Seen::default());
    let mut svc = ServiceBuilder::new()
        .layer(hedger(3, 100))
        .service(scripted(vec![status(5, 503, vec![]), ok(10)], seen.clone()));
    let response = send(&mut svc, get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(*seen.arrived.lock().unwrap(), vec![Duration::ZERO, 5 * MS]);

    // A reset (an io error) is in doubt: for a safe request, non-fatal.
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let resetting = tower::service_fn(move |_req: Request<Body<Full<Bytes>>>| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::ConnectionReset));
            }
            Ok(Response::new(Full::from("second")))
        }
    });
    let mut svc = ServiceBuilder::new()
        .layer(hedger(2, 100))
        .service(resetting);
    let start = Instant::now();
    let response = send(&mut svc, get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn pushback_postpones_or_stops_hedges() {
    // 503 with Retry-After: 1 postpones the next hedge by a second.
    let seen = Arc::new(Seen::default());
    let mut svc = ServiceBuilder::new().layer(hedger(3, 20)).service(scripted(
        vec![status(5, 503, vec![("retry-after", "1")]), ok(5)],
        seen.clone(),
    ));
    let response = send(&mut svc, get()).await.unwrap();
    assert_eq!(response.headers()["x-call"], "2");
    assert_eq!(
        *seen.arrived.lock().unwrap(),
        vec![Duration::ZERO, 1005 * MS]
    );

    // A negative grpc-retry-pushback-ms stops hedging; the original still answers.
    let seen = Arc::new(Seen::default());
    let mut svc = ServiceBuilder::new().layer(hedger(3, 20)).service(scripted(
        vec![
            ok(100),
            status(5, 503, vec![("grpc-retry-pushback-ms", "-1")]),
            ok(1),
        ],
        seen.clone(),
    ));
    let response = send(&mut svc, get()).await.unwrap();
    assert_eq!(response.headers()["x-call"], "1");
    assert_eq!(seen.arrived.lock().unwrap().len(), 2, "no third attempt");
    assert_eq!(seen.dropped.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_is_a_typed_error() {
    let seen = Arc::new(Seen::default());
    let mut svc = ServiceBuilder::new()
        .layer(hedger(3, 40))
        .service(scripted(vec![ok(1000)], seen.clone()));
    let start = Instant::now();
    let call = send(&mut svc, get());
    let err = deadline::scope(Deadline::after(100 * MS, Clock::tokio()), call)
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), 100 * MS);
    assert!(matches!(err, Error::TimedOut { attempts: 3, .. }), "{err}");
    assert_eq!(seen.dropped.load(Ordering::SeqCst), 3);
}

/// Counts attempts sent.
#[derive(Default)]
struct Sent(AtomicU32);

impl Observer for Sent {
    fn attempt_started(&self, _call: &CallInfo<'_>, _attempt: &AttemptStart) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[tokio::test(start_paused = true)]
async fn over_a_bimodal_fault_layer_p99_drops_within_the_budget() {
    let tail = Latency::Bimodal {
        fast: 10 * MS,
        slow: 500 * MS,
        slow_share: 0.05,
    };
    let faults =
        Arc::new(FaultInjector::new(FaultConfig::new(21).with_latency(1.0, tail)).unwrap());
    let downstream_calls = Arc::new(AtomicU32::new(0));
    let counted = downstream_calls.clone();
    let app = tower::service_fn(move |_req: Request<Body<Full<Bytes>>>| {
        counted.fetch_add(1, Ordering::Relaxed);
        async { Ok::<_, Infallible>(Response::new(Full::from("ok"))) }
    });
    let sent = Arc::new(Sent::default());
    let layer = HedgeLayer::builder(spec(3, 30))
        .with_budget(BudgetSpec::Ratio {
            retry_ratio: 0.1,
            ttl: Duration::from_secs(10),
            min_retries_per_sec: 0,
        })
        .with_observer(sent.clone())
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .layer(FaultLayer::new(faults))
        .service(app);

    let n = 2000;
    let mut run = async |method: Method| {
        let mut latencies = Vec::with_capacity(n);
        for _ in 0..n {
            let request = Request::builder()
                .method(method.clone())
                .uri("/")
                .body(Full::default())
                .unwrap();
            let start = Instant::now();
            send(&mut svc, request).await.unwrap();
            latencies.push(start.elapsed());
        }
        latencies.sort();
        latencies
    };
    // POST (no key) is never hedged: the baseline through the same stack.
    let plain = run(Method::POST).await;
    let before = downstream_calls.load(Ordering::Relaxed) as usize;
    assert_eq!(before, n);
    let hedged = run(Method::GET).await;

    assert_eq!(percentile(&plain, 0.99), 500 * MS);
    assert_eq!(percentile(&hedged, 0.99), 40 * MS);
    // Every call's first attempt is counted, the unhedged POSTs' too.
    let extra = sent.0.load(Ordering::Relaxed) as usize - 2 * n;
    assert!(extra > 50 && extra <= n / 10, "extra attempts {extra}");
    // The injected delay comes before the inner call, so every loser was cancelled while
    // still delayed: the service behind the fault layer saw each request exactly once.
    assert_eq!(downstream_calls.load(Ordering::Relaxed) as usize, 2 * n);
}

#[tokio::test]
async fn over_real_http_the_hedge_answers_first() {
    // The server answers its first request after 5 s and every later one at once.
    let arrivals = Arc::new(AtomicU32::new(0));
    let counted = arrivals.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let counted = counted.clone();
            tokio::spawn(async move {
                let handler = hyper::service::service_fn(move |_req| {
                    let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                    async move {
                        if n == 1 {
                            tokio::time::sleep(Duration::from_secs(5)).await;
                        }
                        let mut response = Response::new(Full::<Bytes>::from("hi"));
                        response
                            .headers_mut()
                            .insert("x-call", n.to_string().parse().unwrap());
                        Ok::<_, Infallible>(response)
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, handler)
                    .await;
            });
        }
    });
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body<Full<Bytes>>>();
    let mut svc = ServiceBuilder::new().layer(hedger(2, 50)).service(client);
    let request = Request::get(format!("http://{addr}/"))
        .body(Full::default())
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(4), async {
        svc.ready().await?.call(request).await
    })
    .await
    .expect("the hedge answered before the slow original")
    .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-call"], "2");
    assert_eq!(arrivals.load(Ordering::SeqCst), 2);
}
