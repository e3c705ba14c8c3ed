//! The client stack's metrics in the Prometheus text format.
//!
//! An axum app with three routes: `GET /inventory` is a flaky downstream (two calls of
//! three answer 503); `GET /order` calls it through a hyper client behind the one client
//! stack ([`ClientLayer`]: 3 attempts, a gRPC-style token bucket, a breaker); `GET /metrics`
//! renders what the stack recorded with `metrics-exporter-prometheus`.
//!
//! ```sh
//! # serve on 127.0.0.1:3000 (then: curl localhost:3000/order; curl localhost:3000/metrics)
//! cargo run -p stormguard-tower --features metrics --example prometheus
//! # send 20 orders, print the stormguard lines of /metrics, exit
//! cargo run -p stormguard-tower --features metrics --example prometheus -- --demo
//! ```
//!
//! In the demo the first orders succeed on their third attempt; each failed attempt costs
//! the bucket a token, so after a few orders it refuses retries (`budget_exhausted`) and
//! the downstream gets at most one attempt per order until successes refill it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use stormguard::backoff::Backoff;
use stormguard::breaker::BreakerConfig;
use stormguard::health::HealthConfig;
use stormguard::policy::{BudgetSpec, EndpointPolicy};
use stormguard::retry::RetryPolicy;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::ClientLayer;
use stormguard_tower::metric_names::{ATTEMPT_DURATION, RETRY_DELAY};
use stormguard_tower::observe::describe_metrics;
use tower::{Layer, ServiceExt};

type RetryingClient =
    stormguard_tower::client::Client<Client<HttpConnector, ReplayBody<Full<Bytes>>>>;

#[derive(Clone)]
struct App {
    client: RetryingClient,
    inventory: String,
    inventory_calls: Arc<AtomicU64>,
}

/// Two calls of three fail.
async fn inventory(State(app): State<App>) -> StatusCode {
    let n = app.inventory_calls.fetch_add(1, Ordering::Relaxed);
    if n % 3 == 2 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// Calls the inventory through the client stack and answers with its status.
async fn order(State(app): State<App>) -> StatusCode {
    let request = match http::Request::get(&app.inventory).body(Full::new(Bytes::new())) {
        Ok(request) => request,
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR,
    };
    match app.client.oneshot(request).await {
        Ok(response) => response.status(),
        Err(_) => StatusCode::BAD_GATEWAY,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = std::env::args().any(|a| a == "--demo");

    let seconds = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(ATTEMPT_DURATION.to_owned()), &seconds)?
        .set_buckets_for_metric(Matcher::Full(RETRY_DELAY.to_owned()), &seconds)?
        .install_recorder()?;
    describe_metrics();

    let listener = tokio::net::TcpListener::bind(if demo {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    })
    .await?;
    let addr = listener.local_addr()?;

    // The one client stack for the inventory dependency: retries with a budget, a breaker,
    // the per-try deadline on the wire.
    let policy = EndpointPolicy::new(
        RetryPolicy::new(3)
            .with_backoff(Backoff::exponential(Duration::from_millis(5)))
            .with_per_try_timeout(Duration::from_millis(500)),
    )
    .with_budget(BudgetSpec::Grpc {
        max_tokens: 10,
        token_ratio: 0.1,
    })
    .with_breaker(BreakerConfig::new(HealthConfig::count(50)).with_minimum_throughput(20));
    let layer = ClientLayer::named("inventory", policy)?;
    let app = App {
        client: layer.layer(Client::builder(TokioExecutor::new()).build_http()),
        inventory: format!("http://{addr}/inventory"),
        inventory_calls: Arc::new(AtomicU64::new(0)),
    };
    let router = Router::new()
        .route("/inventory", get(inventory))
        .route("/order", get(order))
        .route("/metrics", get(move || async move { prometheus.render() }))
        .with_state(app);

    if !demo {
        println!("listening on http://{addr} (/order, /metrics)");
        axum::serve(listener, router).await?;
        return Ok(());
    }

    tokio::spawn(async move { axum::serve(listener, router).await });
    let plain: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let response = plain.get(format!("http://{addr}/order").parse()?).await?;
        statuses.push(response.status().as_u16());
    }
    println!("order statuses: {statuses:?}\n");
    let metrics = plain.get(format!("http://{addr}/metrics").parse()?).await?;
    let text = metrics.into_body().collect().await?.to_bytes();
    for line in String::from_utf8_lossy(&text).lines() {
        if line.contains("stormguard_") && !line.contains("_bucket{") {
            println!("{line}");
        }
    }
    Ok(())
}
