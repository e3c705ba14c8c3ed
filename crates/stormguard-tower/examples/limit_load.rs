//! The server limit layer against real HTTP load on 127.0.0.1: an axum service with a
//! CPU-bound handler of known capacity, driven at 3x that capacity by a bounded open-loop
//! load generator whose clients retry a 503 (or a timeout) once, at once, without a budget.
//!
//! Three servers, one after the other: unprotected; tower's static `ConcurrencyLimit` (with
//! `LoadShed`, answering 503) tuned to the worker count; stormguard's `AdaptiveLimitLayer`
//! (Vegas, behind `DeadlineLayer`). For each: goodput (logical requests answered 200 within
//! their 1 s timeout, per second) and the p50/p99 latency of the attempts that were served.
//!
//! `cargo run --release -p stormguard-tower --example limit_load [-- seconds]`

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::routing::get;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard::limit::LimiterConfig;
use stormguard_tower::DeadlineLayer;
use stormguard_tower::limit::AdaptiveLimitLayer;
use tower::ServiceBuilder;

/// Server worker threads: the handler's parallelism.
const WORKERS: usize = 2;
/// CPU work per request.
const WORK: Duration = Duration::from_millis(2);
/// The clients' per-attempt timeout (sent as `grpc-timeout`).
const TIMEOUT: Duration = Duration::from_secs(1);
/// At most this many requests outstanding in the generator; beyond, arrivals are dropped.
const MAX_OUTSTANDING: u64 = 4000;

async fn handler() -> &'static str {
    let start = Instant::now();
    let mut x = 0u64;
    while start.elapsed() < WORK {
        for i in 0..1000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
    }
    std::hint::black_box(x);
    "done"
}

fn router(mode: &str) -> Router {
    let app = Router::new().route("/work", get(handler));
    match mode {
        "none" => app,
        "tower" => app.layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
                    StatusCode::SERVICE_UNAVAILABLE
                }))
                .load_shed()
                .concurrency_limit(WORKERS),
        ),
        _ => app
            .layer(AdaptiveLimitLayer::new(LimiterConfig::default()).expect("valid"))
            .layer(DeadlineLayer::new()),
    }
}

/// Serves `mode` on its own runtime of `WORKERS` threads.
fn serve(mode: &str) -> (SocketAddr, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .expect("server runtime");
    let app = router(mode);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    runtime.spawn(async move { axum::serve(listener, app).await.expect("serves") });
    (addr, runtime)
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// One attempt: its status (None: timed out or failed) and latency.
async fn attempt(client: &HttpClient, addr: SocketAddr) -> (Option<StatusCode>, Duration) {
    let start = Instant::now();
    let request = http::Request::get(format!("http://{addr}/work"))
        .header("grpc-timeout", format!("{}m", TIMEOUT.as_millis()))
        .body(Empty::new())
        .expect("request");
    let answer = tokio::time::timeout(TIMEOUT, async {
        let response = client.request(request).await.ok()?;
        let status = response.status();
        response.into_body().collect().await.ok()?;
        Some(status)
    })
    .await
    .ok()
    .flatten();
    (answer, start.elapsed())
}

struct Figures {
    goodput: f64,
    p50_ms: f64,
    p99_ms: f64,
    shed: u64,
    timed_out: u64,
    dropped: u64,
}

/// Offers `rate` requests per second for `seconds`; each retries once, at once, after a 503
/// or a timeout.
async fn load(addr: SocketAddr, rate: f64, seconds: u64) -> Figures {
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .build_http();
    let good = Arc::new(AtomicU64::new(0));
    let shed = Arc::new(AtomicU64::new(0));
    let timed_out = Arc::new(AtomicU64::new(0));
    let outstanding = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(std::sync::Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram"),
    ));
    let mut dropped = 0;
    let start = tokio::time::Instant::now();
    let total = (rate * seconds as f64) as u64;
    let mut tasks = Vec::with_capacity(total as usize);
    for k in 0..total {
        tokio::time::sleep_until(start + Duration::from_secs_f64(k as f64 / rate)).await;
        if outstanding.load(Ordering::Relaxed) >= MAX_OUTSTANDING {
            dropped += 1;
            continue;
        }
        outstanding.fetch_add(1, Ordering::Relaxed);
        let (client, good, shed, timed_out, outstanding, latencies) = (
            client.clone(),
            good.clone(),
            shed.clone(),
            timed_out.clone(),
            outstanding.clone(),
            latencies.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..2 {
                let (status, took) = attempt(&client, addr).await;
                match status {
                    Some(StatusCode::OK) => {
                        good.fetch_add(1, Ordering::Relaxed);
                        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
                        if let Ok(mut h) = latencies.lock() {
                            let _ = h.record(micros.max(1));
                        }
                        break;
                    }
                    Some(_) => {
                        shed.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {
                        timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            outstanding.fetch_sub(1, Ordering::Relaxed);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let h = latencies.lock().map(|h| h.clone()).expect("histogram");
    Figures {
        goodput: good.load(Ordering::Relaxed) as f64 / seconds as f64,
        p50_ms: h.value_at_quantile(0.5) as f64 / 1e3,
        p99_ms: h.value_at_quantile(0.99) as f64 / 1e3,
        shed: shed.load(Ordering::Relaxed),
        timed_out: timed_out.load(Ordering::Relaxed),
        dropped,
    }
}

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime");
    // Capacity and unloaded latency: one request at a time, then as many as workers.
    let (addr, server) = serve("none");
    let unloaded = clients.block_on(load(addr, 100.0, 2));
    let capacity = WORKERS as f64 / WORK.as_secs_f64();
    let saturated = clients.block_on(load(addr, capacity * 0.9, 2));
    drop(server);
    println!(
        "handler: {WORK:?} of CPU on {WORKERS} workers: capacity {capacity:.0}/s; \
         unloaded (100/s) p50 {:.2} ms p99 {:.2} ms; at 90 % goodput {:.0}/s p99 {:.2} ms",
        unloaded.p50_ms, unloaded.p99_ms, saturated.goodput, saturated.p99_ms
    );
    let rate = 3.0 * capacity;
    println!("offered {rate:.0}/s for {seconds} s, clients retry a 503 or a timeout once at once:");
    println!(
        "server                          goodput/s  %cap  p50 ms   p99 ms   503s  timeouts  dropped"
    );
    for mode in ["none", "tower", "stormguard"] {
        let (addr, server) = serve(mode);
        let f = clients.block_on(load(addr, rate, seconds));
        drop(server);
        let name = match mode {
            "none" => "unprotected",
            "tower" => "tower ConcurrencyLimit(2)+shed",
            _ => "stormguard AdaptiveLimit",
        };
        println!(
            "{name:<31} {:>9.0} {:>5.0} {:>7.2} {:>8.2} {:>6} {:>9} {:>8}",
            f.goodput,
            100.0 * f.goodput / capacity,
            f.p50_ms,
            f.p99_ms,
            f.shed,
            f.timed_out,
            f.dropped
        );
    }
}
