//! The server limit layer against real HTTP load on 127.0.0.1: an axum service with a
//! CPU-bound handler of known capacity, driven at 3x that capacity by a bounded open-loop
//! load generator whose clients retry a 503 (or a timeout) once, at once, without a budget.
//!
//! First the unloaded latency: one request at a time for five seconds (its p99 is the
//! yardstick).
//! Then three servers, one after the other: unprotected; tower's static `ConcurrencyLimit`
//! (with `LoadShed`, answering 503) tuned to the worker count; stormguard's
//! `AdaptiveLimitLayer` with its defaults (Vegas, behind `DeadlineLayer`). For each: goodput
//! (logical requests answered 200 within their 1 s timeout, per second, and as a share of the
//! capacity) and the p50/p99 latency of the admitted attempts (those answered 200) as the
//! clients see it and as the server does (its outermost layer to the response ready: the
//! difference is the client, the connection and the scheduling of both), with the
//! issue's goal checked: goodput at least 90 % of capacity and admitted p99 at most twice the
//! unloaded p99. Below each row, what the server's slowest 1 % of answers were made of (in
//! front of the handler: the limit's queue and the layers; in the CPU pool's queue behind the
//! job ahead, with the hand-off to the pool thread; the work; from the work's end to the
//! response: the handler task's wake-up and the way out through the layers), and the same parts' p50,
//! p90 and p99 over all answers: a tail made of waits behind the worker is the limit's, one
//! made of wake-ups is the machine's.
//!
//! The handler hands its work to a pool of one CPU thread that spins for 2 ms of wall-clock
//! time per request, so the capacity (500/s) holds even
//! when other processes take CPU time; latencies on a shared machine do not, so note the load
//! beside the figures.
//!
//! `cargo run --release -p stormguard-tower --example limit_load [-- seconds]`

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
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
use tokio::sync::oneshot;
use tower::ServiceBuilder;

/// Threads of the handler's CPU pool: its parallelism. One, so that the server's I/O thread
/// and the load generator's thread share the other core of a two-core machine.
const WORKERS: usize = 1;
/// CPU work per request.
const WORK: Duration = Duration::from_millis(2);
/// The clients' per-attempt timeout (sent as `grpc-timeout`).
const TIMEOUT: Duration = Duration::from_secs(1);
/// At most this many requests outstanding in the generator; beyond, arrivals are dropped.
const MAX_OUTSTANDING: u64 = 4000;

/// The handler's CPU: `WORKERS` threads taking jobs in arrival order, each spinning for
/// `WORK`, as a server runs CPU-bound work off its I/O threads (which stay free to accept,
/// parse and shed meanwhile). The queue in front of them is unbounded, as an executor's is;
/// a job whose request was dropped before a thread took it (its connection closed) is
/// skipped.
#[derive(Clone)]
struct CpuPool {
    jobs: mpsc::Sender<oneshot::Sender<Worked>>,
}

/// When a pool thread took a job and when it finished it.
#[derive(Clone, Copy)]
struct Worked {
    started: Instant,
    finished: Instant,
}

impl CpuPool {
    /// Starts the threads; they end when the last `CpuPool` is dropped.
    fn start() -> CpuPool {
        let (jobs, queue) = mpsc::channel::<oneshot::Sender<Worked>>();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..WORKERS {
            let queue = Arc::clone(&queue);
            std::thread::spawn(move || {
                loop {
                    let job = match queue.lock() {
                        Ok(queue) => queue.recv(),
                        Err(_) => return,
                    };
                    let Ok(done) = job else { return };
                    if done.is_closed() {
                        continue;
                    }
                    let started = Instant::now();
                    spin(WORK);
                    let _ = done.send(Worked {
                        started,
                        finished: Instant::now(),
                    });
                }
            });
        }
        CpuPool { jobs }
    }

    /// Runs one job on the pool; `None` if the pool has stopped.
    async fn run(&self) -> Option<Worked> {
        let (done, finished) = oneshot::channel();
        self.jobs.send(done).ok()?;
        finished.await.ok()
    }
}

/// Keeps the CPU busy for `work` of wall-clock time.
fn spin(work: Duration) {
    let start = Instant::now();
    let mut x = 0u64;
    while start.elapsed() < work {
        for i in 0..1000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
    }
    std::hint::black_box(x);
}

/// Where an answered request's time at the server went, carried from the handler to the
/// outermost layer in the response's extensions.
#[derive(Clone, Copy)]
struct Timings {
    /// The handler started: the request was admitted.
    admitted: Instant,
    worked: Worked,
}

async fn handler(State(pool): State<CpuPool>) -> Response {
    let admitted = Instant::now();
    match pool.run().await {
        Some(worked) => {
            let mut response = "done".into_response();
            response
                .extensions_mut()
                .insert(Timings { admitted, worked });
            response
        }
        None => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Counts the values of `layer`'s limit every 10 ms until aborted.
async fn sample_limit(layer: AdaptiveLimitLayer, counts: Arc<Mutex<BTreeMap<u32, u64>>>) {
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    loop {
        tick.tick().await;
        if let Ok(mut counts) = counts.lock() {
            *counts.entry(layer.limiter().limit()).or_default() += 1;
        }
    }
}

/// The 200 answers as the server sees them: their latencies from the request reaching its
/// outermost layer to the response being ready (before it is written), and where that time
/// went.
#[derive(Clone)]
struct ServerView {
    latencies: Histogram<u64>,
    parts: Vec<Parts>,
}

/// One answer's time at the server, in four parts that add up to `total`.
#[derive(Clone, Copy)]
struct Parts {
    total: Duration,
    /// Before the handler: the limit's queue (and the layers' own work).
    limit_queue: Duration,
    /// In the CPU pool's queue, behind the job ahead.
    worker_queue: Duration,
    work: Duration,
    /// From the work done to the response ready: wake-ups of the handler's task.
    after: Duration,
}

type Served = Arc<Mutex<ServerView>>;

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram")
}

fn record(h: &Mutex<Histogram<u64>>, took: Duration) {
    let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    if let Ok(mut h) = h.lock() {
        let _ = h.record(micros.max(1));
    }
}

async fn measure(State(served): State<Served>, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let response = next.run(request).await;
    let end = Instant::now();
    if response.status() == StatusCode::OK
        && let Some(t) = response.extensions().get::<Timings>()
        && let Ok(mut view) = served.lock()
    {
        let micros = u64::try_from((end - start).as_micros()).unwrap_or(u64::MAX);
        let _ = view.latencies.record(micros.max(1));
        view.parts.push(Parts {
            total: end - start,
            limit_queue: t.admitted - start,
            worker_queue: t.worked.started - t.admitted,
            work: t.worked.finished - t.worked.started,
            after: end - t.worked.finished,
        });
    }
    response
}

impl ServerView {
    fn new() -> ServerView {
        ServerView {
            latencies: histogram(),
            parts: Vec::new(),
        }
    }

    /// The mean of each part over the slowest 1 % of the answers: what the p99 is made of.
    fn tail(&self) -> String {
        let mut parts = self.parts.clone();
        parts.sort_by_key(|p| std::cmp::Reverse(p.total));
        let slowest = &parts[..parts.len().div_ceil(100)];
        if slowest.is_empty() {
            return "no answers".to_owned();
        }
        let mean = |f: fn(&Parts) -> Duration| {
            slowest.iter().map(f).sum::<Duration>().as_secs_f64() * 1e3 / slowest.len() as f64
        };
        let quantiles = |f: fn(&Parts) -> Duration| {
            let mut all: Vec<Duration> = parts.iter().map(f).collect();
            all.sort();
            let at = |q: f64| all[((all.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
            format!("{:.2}/{:.2}/{:.2}", at(0.5), at(0.9), at(0.99))
        };
        format!(
            "{} answers, mean {:.2} ms = limit queue {:.2} + worker queue {:.2} + work {:.2} + \
             after {:.2}; over all answers p50/p90/p99: limit queue {}, worker queue {}, after {}",
            slowest.len(),
            mean(|p| p.total),
            mean(|p| p.limit_queue),
            mean(|p| p.worker_queue),
            mean(|p| p.work),
            mean(|p| p.after),
            quantiles(|p| p.limit_queue),
            quantiles(|p| p.worker_queue),
            quantiles(|p| p.after)
        )
    }
}

fn router(mode: &str, layer: &AdaptiveLimitLayer, served: Served) -> Router {
    let app = Router::new()
        .route("/work", get(handler))
        .with_state(CpuPool::start());
    let app = match mode {
        "none" => app,
        "tower" => app.layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
                    StatusCode::SERVICE_UNAVAILABLE
                }))
                .load_shed()
                .concurrency_limit(WORKERS),
        ),
        _ => app.layer(layer.clone()).layer(DeadlineLayer::new()),
    };
    app.layer(from_fn_with_state(served, measure))
}

/// Serves `mode` on its own runtime of one I/O thread, with its own CPU pool; the histogram
/// fills with the server's view of the 200 answers.
fn serve(mode: &str, layer: &AdaptiveLimitLayer) -> (SocketAddr, tokio::runtime::Runtime, Served) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("server runtime");
    let served = Arc::new(Mutex::new(ServerView::new()));
    let app = router(mode, layer, Arc::clone(&served));
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    runtime.spawn(async move { axum::serve(listener, app).await.expect("serves") });
    (addr, runtime, served)
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
    /// The client's view of the attempts answered 200.
    latencies: Histogram<u64>,
    shed: u64,
    timed_out: u64,
    dropped: u64,
}

/// The `q` quantile of `h`, in milliseconds.
fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1e3
}

/// Latency with no load: one request after the other for `length`.
async fn one_at_a_time(addr: SocketAddr, length: Duration) -> Figures {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let latencies = Mutex::new(histogram());
    let mut good = 0u64;
    let start = Instant::now();
    while start.elapsed() < length {
        if let (Some(StatusCode::OK), took) = attempt(&client, addr).await {
            good += 1;
            record(&latencies, took);
        }
    }
    Figures {
        goodput: good as f64 / length.as_secs_f64(),
        latencies: latencies.into_inner().expect("histogram"),
        shed: 0,
        timed_out: 0,
        dropped: 0,
    }
}

/// Offers `rate` requests per second for `seconds`; each retries once, at once, after a 503
/// or a timeout.
///
/// The arrivals are paced by a thread of their own, which sleeps to each one's instant and
/// hands it to the runtime: tokio's timers count whole milliseconds and a runtime thread
/// woken by a response runs every timer due, so arrivals paced by them come in bursts just
/// after each response, in step with the server (a load that no set of independent clients
/// makes).
async fn load(addr: SocketAddr, rate: f64, seconds: u64) -> Figures {
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .build_http();
    let good = Arc::new(AtomicU64::new(0));
    let shed = Arc::new(AtomicU64::new(0));
    let timed_out = Arc::new(AtomicU64::new(0));
    let outstanding = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(histogram()));
    let runtime = tokio::runtime::Handle::current();
    let pacer = {
        let (good, shed, timed_out, outstanding, latencies) = (
            good.clone(),
            shed.clone(),
            timed_out.clone(),
            outstanding.clone(),
            latencies.clone(),
        );
        std::thread::spawn(move || {
            let start = Instant::now();
            let total = (rate * seconds as f64) as u64;
            let mut tasks = Vec::with_capacity(total as usize);
            let mut dropped = 0;
            for k in 0..total {
                let at = start + Duration::from_secs_f64(k as f64 / rate);
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
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
                tasks.push(runtime.spawn(async move {
                    for _ in 0..2 {
                        let (status, took) = attempt(&client, addr).await;
                        match status {
                            Some(StatusCode::OK) => {
                                good.fetch_add(1, Ordering::Relaxed);
                                record(&latencies, took);
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
            (tasks, dropped)
        })
    };
    let (tasks, dropped) = tokio::task::spawn_blocking(move || pacer.join())
        .await
        .expect("pacer")
        .expect("pacer");
    for t in tasks {
        let _ = t.await;
    }
    let latencies = latencies.lock().map(|h| h.clone()).expect("histogram");
    Figures {
        goodput: good.load(Ordering::Relaxed) as f64 / seconds as f64,
        latencies,
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
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("client runtime");
    // Capacity and unloaded latency: one request at a time, then 90 % of capacity.
    let layer = || AdaptiveLimitLayer::new(LimiterConfig::default()).expect("valid");
    let (addr, server, served) = serve("none", &layer());
    let unloaded = clients.block_on(one_at_a_time(addr, Duration::from_secs(5)));
    let unloaded_server = served
        .lock()
        .map(|v| v.latencies.clone())
        .expect("histogram");
    let capacity = WORKERS as f64 / WORK.as_secs_f64();
    let saturated = clients.block_on(load(addr, capacity * 0.9, 2));
    drop(server);
    let unloaded_p99 = ms(&unloaded.latencies, 0.99);
    println!(
        "handler: {WORK:?} of CPU on {WORKERS} workers: capacity {capacity:.0}/s; \
         unloaded (one at a time) p50 {:.2} ms p99 {unloaded_p99:.2} ms (at the server p99 \
         {:.2} ms); at 90 % of capacity goodput {:.0}/s p99 {:.2} ms",
        ms(&unloaded.latencies, 0.5),
        ms(&unloaded_server, 0.99),
        saturated.goodput,
        ms(&saturated.latencies, 0.99)
    );
    let rate = 3.0 * capacity;
    println!("offered {rate:.0}/s for {seconds} s, clients retry a 503 or a timeout once at once:");
    println!(
        "latencies of the attempts answered 200: at the client, and at the server (request in \
         its outermost layer to response ready)"
    );
    println!(
        "server                          goodput/s  %cap  p50 ms   p99 ms  p99/unloaded  \
         server p50  server p99   503s  timeouts  dropped  goal"
    );
    for mode in ["none", "tower", "stormguard"] {
        let limit = layer();
        let (addr, server, served) = serve(mode, &limit);
        let limits = Arc::new(Mutex::new(BTreeMap::new()));
        // Only the stormguard server uses `limit`; the others have nothing to sample.
        let sampler = (mode == "stormguard")
            .then(|| clients.spawn(sample_limit(limit.clone(), Arc::clone(&limits))));
        let f = clients.block_on(load(addr, rate, seconds));
        if let Some(sampler) = sampler {
            sampler.abort();
        }
        drop(server);
        let at_server = served.lock().map(|v| v.clone()).expect("histogram");
        let name = match mode {
            "none" => "unprotected",
            "tower" => "tower ConcurrencyLimit+LoadShed",
            _ => "stormguard AdaptiveLimit",
        };
        let share = f.goodput / capacity;
        let p99 = ms(&f.latencies, 0.99);
        let ratio = p99 / unloaded_p99;
        let goal = if share >= 0.9 && ratio <= 2.0 {
            "met"
        } else {
            "missed"
        };
        println!(
            "{name:<31} {:>9.0} {:>5.0} {:>7.2} {p99:>8.2} {ratio:>13.2} {:>11.2} {:>11.2} {:>6} \
             {:>9} {:>8}  {goal}",
            f.goodput,
            100.0 * share,
            ms(&f.latencies, 0.5),
            ms(&at_server.latencies, 0.5),
            ms(&at_server.latencies, 0.99),
            f.shed,
            f.timed_out,
            f.dropped
        );
        println!("  the server's slowest 1 %: {}", at_server.tail());
        if mode == "stormguard" {
            let stats = limit.stats();
            let limiter = limit.limiter();
            let show = |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{d:.2?}"));
            let limits = limits.lock().map(|l| l.clone()).expect("samples");
            let samples: u64 = limits.values().sum();
            let shares: Vec<String> = limits
                .iter()
                .map(|(limit, n)| format!("{limit}: {:.1} %", 100.0 * *n as f64 / samples as f64))
                .collect();
            println!(
                "  the limit's values over the run (sampled every 10 ms): {}",
                shares.join(", ")
            );
            println!(
                "  the layer: limit {} at the end (round trip {}, no-load {}), admitted {} ({} \
                 after queueing), shed {} (deadline {}, queue full {}, queue timeout {})",
                limiter.limit(),
                show(limiter.expected_rtt()),
                show(limiter.no_load_rtt()),
                stats.admitted,
                stats.queued,
                stats.shed(),
                stats.shed_deadline,
                stats.shed_queue_full,
                stats.shed_queue_timeout
            );
        }
    }
}
