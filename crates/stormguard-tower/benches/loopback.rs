//! Loopback load generator: what the tower layers add to a real HTTP round trip.
//!
//! Micro-benchmarks of a retrier say what one decision costs; they do not say what a request
//! pays once the layers sit on both ends of a hyper connection (a header encoded and parsed,
//! a task-local deadline, a timer per attempt, a request cloned for a possible retry). This
//! starts an axum "hello" server on 127.0.0.1:0 and drives it with N concurrent keep-alive
//! hyper clients, once with the bare stacks and once with the layered ones, and prints
//! throughput and p50/p99 latency side by side.
//!
//! ```sh
//! cargo bench -p stormguard-tower --bench loopback
//! LOOPBACK_SECS=1 LOOPBACK_ROUNDS=1 cargo bench -p stormguard-tower --bench loopback   # smoke
//! ```
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `LOOPBACK_SECS` | 5 | measured seconds per variant and round (fractions allowed) |
//! | `LOOPBACK_ROUNDS` | 3 | rounds; each runs bare then layers, and the figures pool them |
//! | `LOOPBACK_CONNECTIONS` | 16 | concurrent clients, one request in flight each |
//! | `LOOPBACK_WARMUP_MS` | 500 | unmeasured lead-in per run (connections, caches) |
//! | `LOOPBACK_SERVER_THREADS` | 1 | tokio worker threads of the server |
//! | `LOOPBACK_CLIENT_THREADS` | 1 | tokio worker threads of the load generator |
//!
//! Server and clients share the machine, so the figures are relative: compare the two rows
//! of one run, not runs on different machines. Both variants box their stacks the same way
//! (one allocation per request on each side), so the difference is the layers'.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use stormguard::breaker::BreakerConfig;
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline, Reserve};
use stormguard::health::HealthConfig;
use stormguard::policy::{BudgetSpec, EndpointPolicy, Propagation};
use stormguard::retry::RetryPolicy;
use stormguard_tower::DeadlineLayer;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::ClientLayer;
use tower::util::BoxCloneService;
use tower::{Service, ServiceBuilder, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// What the load generator sends.
type ClientRequest = Request<Empty<Bytes>>;
/// The client stack as the load generator sees it: a request in, the status out once the
/// response body has been read to its end.
type ClientSvc = BoxCloneService<ClientRequest, StatusCode, BoxError>;
/// The server stack as the accept loop sees it.
type ServerSvc = BoxCloneService<Request<Incoming>, Response<axum::body::Body>, BoxError>;

// ==========================================================================================
// THE STACKS UNDER TEST: the server behind DeadlineLayer; the client behind the one client
// stack (3 attempts, 500 ms per try, a gRPC token bucket, a circuit breaker, 10 % hop
// reserve), each request under a 1 s caller deadline: every attempt writes its deadline,
// min(per-try, left) − reserve, in `grpc-timeout`, and the server reads it and runs the
// handler under it.
// ==========================================================================================

/// The server stack of the "layers" variant.
fn layered_server(app: Router) -> ServerSvc {
    let deadline = DeadlineLayer::new()
        .with_max(Duration::from_secs(30))
        .validate()
        .expect("valid deadline layer");
    server_service(ServiceBuilder::new().layer(deadline).service(app))
}

/// The client stack of the "layers" variant: 500 ms per try, each attempt under a timer.
fn layered_client(connector: HttpConnector, connections: usize) -> ClientSvc {
    client_stack(connector, connections, Some(Duration::from_millis(500)))
}

/// The same stack without a per-try timeout: the deadline alone bounds the call (the retrier
/// checks it before each retry and the server cuts the handler), so no client timer is armed.
fn layered_client_deadline_only(connector: HttpConnector, connections: usize) -> ClientSvc {
    client_stack(connector, connections, None)
}

/// The one client stack over hyper's pool, each request under a 1 s caller deadline.
fn client_stack(
    connector: HttpConnector,
    connections: usize,
    per_try: Option<Duration>,
) -> ClientSvc {
    let pool: Client<HttpConnector, ReplayBody<Empty<Bytes>>> =
        Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(connections)
            .build(connector);
    let mut retry = RetryPolicy::new(3);
    if let Some(per_try) = per_try {
        retry = retry.with_per_try_timeout(per_try);
    }
    let policy = EndpointPolicy::new(retry)
        .with_budget(BudgetSpec::Grpc {
            max_tokens: 100,
            token_ratio: 0.1,
        })
        .with_breaker(BreakerConfig::new(HealthConfig::time(
            Duration::from_secs(10),
            10,
        )))
        .with_propagation(Propagation {
            reserve: Reserve::fraction(0.1).expect("valid reserve"),
            ..Propagation::default()
        });
    let stack = ServiceBuilder::new()
        .layer(ClientLayer::new(policy).expect("valid policy"))
        .service(pool);
    client_service(stack.map_future(|attempts| {
        deadline::scope(
            Deadline::after(Duration::from_secs(1), Clock::tokio()),
            attempts,
        )
    }))
}

/// The server stack of the "bare" variant: the router alone.
fn bare_server(app: Router) -> ServerSvc {
    server_service(app)
}

/// The client stack of the "bare" variant: hyper's pool alone.
fn bare_client(connector: HttpConnector, connections: usize) -> ClientSvc {
    let pool: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(connections)
        .build(connector);
    client_service(pool)
}

// ==========================================================================================

/// Boxes any server stack into the one type the accept loop serves.
fn server_service<S, B>(service: S) -> ServerSvc
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    BoxCloneService::new(
        service
            .map_response(|response: Response<B>| response.map(axum::body::Body::new))
            .map_err(Into::into),
    )
}

/// Boxes any client stack into the one type the load generator drives; reads the body.
fn client_service<S, B>(service: S) -> ClientSvc
where
    S: Service<ClientRequest, Response = Response<B>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    BoxCloneService::new(
        service
            .map_err(Into::into)
            .and_then(|response: Response<B>| async move {
                let status = response.status();
                response.into_body().collect().await.map_err(Into::into)?;
                Ok(status)
            }),
    )
}

/// One variant's pooled figures.
struct Sample {
    requests: u64,
    errors: u64,
    measured: Duration,
    latency_us: Histogram<u64>,
}

impl Sample {
    fn new() -> Self {
        Sample {
            requests: 0,
            errors: 0,
            measured: Duration::ZERO,
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
        }
    }

    fn add(&mut self, other: &Sample) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.measured += other.measured;
        self.latency_us.add(&other.latency_us).expect("same bounds");
    }

    fn throughput(&self) -> f64 {
        self.requests as f64 / self.measured.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn quantile_us(&self, q: f64) -> u64 {
        self.latency_us.value_at_quantile(q)
    }
}

struct Settings {
    secs: f64,
    rounds: u32,
    connections: usize,
    warmup: Duration,
    server_threads: usize,
    client_threads: usize,
}

impl Settings {
    fn from_env() -> Result<Settings, String> {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
            match std::env::var(name) {
                Ok(text) => text
                    .parse()
                    .map_err(|_| format!("{name}={text:?} is not a valid number")),
                Err(_) => Ok(default),
            }
        }
        let settings = Settings {
            secs: var("LOOPBACK_SECS", 5.0)?,
            rounds: var("LOOPBACK_ROUNDS", 3)?,
            connections: var("LOOPBACK_CONNECTIONS", 16)?,
            warmup: Duration::from_millis(var("LOOPBACK_WARMUP_MS", 500)?),
            server_threads: var("LOOPBACK_SERVER_THREADS", 1)?,
            client_threads: var("LOOPBACK_CLIENT_THREADS", 1)?,
        };
        if !(settings.secs.is_finite() && settings.secs > 0.0 && settings.secs < 3600.0) {
            return Err(format!(
                "LOOPBACK_SECS must be above 0 and below 3600, got {}",
                settings.secs
            ));
        }
        for (name, value) in [
            ("LOOPBACK_ROUNDS", settings.rounds as usize),
            ("LOOPBACK_CONNECTIONS", settings.connections),
            ("LOOPBACK_SERVER_THREADS", settings.server_threads),
            ("LOOPBACK_CLIENT_THREADS", settings.client_threads),
        ] {
            if value == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        Ok(settings)
    }
}

/// A runtime whose threads are named `name` (so a profile can tell client from server).
fn runtime(threads: usize, name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

async fn hello() -> &'static str {
    "hello"
}

/// Serves `service` on 127.0.0.1:0 (HTTP/1.1, keep-alive) until the runtime is dropped.
async fn start_server(service: ServerSvc) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let service = service.clone();
            tokio::spawn(async move {
                // A concrete error type: hyper's bounds trip over a boxed one here.
                let hyper_service = hyper::service::service_fn(move |req| {
                    let call = service.clone().oneshot(req);
                    async move { call.await.map_err(std::io::Error::other) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper_service)
                    .await;
            });
        }
    });
    addr
}

/// Drives `client` with `connections` concurrent loops: `warmup` unmeasured, then `measure`.
async fn load(
    client: ClientSvc,
    uri: Uri,
    connections: usize,
    warmup: Duration,
    measure: Duration,
) -> Sample {
    let measure_from = Instant::now() + warmup;
    let end = measure_from + measure;
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let mut client = client.clone();
            let uri = uri.clone();
            tokio::spawn(async move {
                let mut sample = Sample::new();
                loop {
                    let started = Instant::now();
                    if started >= end {
                        break;
                    }
                    let request = Request::get(uri.clone())
                        .body(Empty::new())
                        .expect("valid request");
                    let result = match client.ready().await {
                        Ok(ready) => ready.call(request).await,
                        Err(err) => Err(err),
                    };
                    if started < measure_from {
                        continue;
                    }
                    match result {
                        Ok(status) if status.is_success() => {
                            let micros =
                                u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                            sample.latency_us.saturating_record(micros.max(1));
                            sample.requests += 1;
                        }
                        Ok(_) | Err(_) => sample.errors += 1,
                    }
                }
                sample
            })
        })
        .collect();
    let mut total = Sample::new();
    for worker in workers {
        total.add(&worker.await.expect("load worker"));
    }
    total.measured = end.saturating_duration_since(measure_from);
    total
}

/// One run of one variant on fresh runtimes, so nothing carries over between runs.
fn run(
    settings: &Settings,
    server: fn(Router) -> ServerSvc,
    client: fn(HttpConnector, usize) -> ClientSvc,
) -> Sample {
    let server_rt = runtime(settings.server_threads, "lb-server");
    let app = Router::new().route("/", get(hello));
    let addr = server_rt.block_on(start_server(server(app)));
    let client_rt = runtime(settings.client_threads, "lb-client");
    let sample = client_rt.block_on(async {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let uri: Uri = format!("http://{addr}/").parse().expect("valid uri");
        load(
            client(connector, settings.connections),
            uri,
            settings.connections,
            settings.warmup,
            Duration::from_secs_f64(settings.secs),
        )
        .await
    });
    client_rt.shutdown_background();
    server_rt.shutdown_background();
    sample
}

fn main() -> ExitCode {
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(message) => {
            eprintln!("loopback: {message}");
            return ExitCode::from(2);
        }
    };
    println!(
        "loopback: {} connections, {} s x {} round(s) per variant, warm-up {} ms, \
         server {} thread(s), client {} thread(s)",
        settings.connections,
        settings.secs,
        settings.rounds,
        settings.warmup.as_millis(),
        settings.server_threads,
        settings.client_threads,
    );
    let mut bare = Sample::new();
    let mut layers = Sample::new();
    // Where the cost is: the server's layer alone, then the client's alone.
    let mut server_only = Sample::new();
    let mut client_only = Sample::new();
    let mut deadline_only = Sample::new();
    for _ in 0..settings.rounds {
        bare.add(&run(&settings, bare_server, bare_client));
        layers.add(&run(&settings, layered_server, layered_client));
        server_only.add(&run(&settings, layered_server, bare_client));
        client_only.add(&run(&settings, bare_server, layered_client));
        deadline_only.add(&run(
            &settings,
            layered_server,
            layered_client_deadline_only,
        ));
    }
    println!(
        "{:<12} {:>10} {:>10} {:>8} {:>8} {:>9} {:>7}",
        "variant", "requests", "req/s", "p50 µs", "p99 µs", "p99.9 µs", "errors"
    );
    for (name, sample) in [
        ("bare", &bare),
        ("layers", &layers),
        ("server only", &server_only),
        ("client only", &client_only),
        ("no per-try", &deadline_only),
    ] {
        println!(
            "{:<12} {:>10} {:>10.0} {:>8} {:>8} {:>9} {:>7}",
            name,
            sample.requests,
            sample.throughput(),
            sample.quantile_us(0.50),
            sample.quantile_us(0.99),
            sample.quantile_us(0.999),
            sample.errors,
        );
    }
    let signed = |a: u64, b: u64| i128::from(a) - i128::from(b);
    println!(
        "layers/bare throughput {:.3}x; added p50 {:+} µs; added p99 {:+} µs",
        layers.throughput() / bare.throughput().max(f64::MIN_POSITIVE),
        signed(layers.quantile_us(0.50), bare.quantile_us(0.50)),
        signed(layers.quantile_us(0.99), bare.quantile_us(0.99)),
    );
    if bare.errors + layers.errors > 0 {
        eprintln!("loopback: some requests failed; the figures above count only successes");
    }
    if bare.requests == 0 || layers.requests == 0 {
        eprintln!("loopback: a variant completed no request");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
