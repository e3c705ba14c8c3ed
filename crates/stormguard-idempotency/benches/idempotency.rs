//! Loopback HTTP benchmark of the idempotency layer on each store.
//!
//! ```text
//! STORMGUARD_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! STORMGUARD_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test \
//! STORMGUARD_TEST_REDIS_URL=redis://127.0.0.1:6379/ \
//! cargo bench --all-features --bench idempotency
//! ```
//!
//! For each store (and the same axum handler without the layer as the baseline):
//!
//! - latency: `SEQ` sequential requests on one keep-alive connection, p50/p99 per request and
//!   the p50/p99 *added* over the baseline, for fresh keys (insert + complete) and for replays
//!   of one completed key;
//! - throughput: `TOTAL` requests from `CONC` concurrent clients, requests/s;
//! - the wall time of 200 concurrent requests with one key (median of 5 runs).
//!
//! Stores whose URL is not set are skipped (printed). Figures on a shared 2-core machine are
//! noisy; compare within one run.

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use stormguard_idempotency::IdempotencyLayer;
use support::{Backend, Http};

const SEQ: usize = 2_000;
const TOTAL: usize = 6_000;
const CONC: usize = 32;

fn app(layer: Option<IdempotencyLayer>) -> Router {
    let router = Router::new().route(
        "/pay",
        post(|| async {
            (
                StatusCode::CREATED,
                [
                    ("content-type", "application/json"),
                    ("location", "/payments/1"),
                ],
                r#"{"id":"pay_1","amount":1250,"currency":"EUR","status":"captured"}"#,
            )
                .into_response()
        }),
    );
    match layer {
        Some(layer) => router.route_layer(layer),
        None => router,
    }
}

static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

fn fresh_key() -> String {
    format!(
        "bench-{}-{}",
        std::process::id(),
        NEXT_KEY.fetch_add(1, Ordering::Relaxed)
    )
}

async fn one(client: &Http, key: &str) -> Duration {
    let t = Instant::now();
    let r = client
        .post("/pay", key, r#"{"amount":1250,"currency":"EUR"}"#)
        .await;
    let took = t.elapsed();
    assert!(
        r.status == StatusCode::CREATED || r.status == StatusCode::CONFLICT,
        "unexpected {:?}",
        r
    );
    took
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Lat {
    p50: Duration,
    p99: Duration,
}

async fn latency(client: &Http, replay: bool) -> Lat {
    let replay_key = fresh_key();
    if replay {
        one(client, &replay_key).await;
    }
    // Warm up connections and statement caches.
    for _ in 0..200 {
        let k = if replay {
            replay_key.clone()
        } else {
            fresh_key()
        };
        one(client, &k).await;
    }
    let mut v = Vec::with_capacity(SEQ);
    for _ in 0..SEQ {
        let k = if replay {
            replay_key.clone()
        } else {
            fresh_key()
        };
        v.push(one(client, &k).await);
    }
    v.sort();
    Lat {
        p50: pct(&v, 0.50),
        p99: pct(&v, 0.99),
    }
}

async fn throughput(client: &Http, replay: bool) -> f64 {
    let replay_key = Arc::new(fresh_key());
    if replay {
        one(client, &replay_key).await;
    }
    let left = Arc::new(AtomicU64::new(TOTAL as u64));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONC {
        let (client, left, replay_key) =
            (client.clone(), Arc::clone(&left), Arc::clone(&replay_key));
        tasks.spawn(async move {
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                let k = if replay {
                    (*replay_key).clone()
                } else {
                    fresh_key()
                };
                one(&client, &k).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    TOTAL as f64 / start.elapsed().as_secs_f64()
}

async fn duplicates_wall(client: &Http) -> Duration {
    let mut runs = Vec::new();
    for _ in 0..5 {
        let key = Arc::new(fresh_key());
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..200 {
            let (client, key) = (client.clone(), Arc::clone(&key));
            tasks.spawn(async move { one(&client, &key).await });
        }
        while tasks.join_next().await.is_some() {}
        runs.push(start.elapsed());
    }
    runs.sort();
    runs[runs.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn added(d: Duration, base: Duration) -> String {
    let a = d.as_secs_f64() - base.as_secs_f64();
    format!("{:+.3}", a * 1e3)
}

async fn serve(layer: Option<IdempotencyLayer>) -> SocketAddr {
    support::serve(app(layer)).await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects stores by name.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));

    let base = Http::new(serve(None).await);
    let base_lat = latency(&base, false).await;
    let base_rps = throughput(&base, false).await;
    println!(
        "{:<14} {:>9} {:>9} {:>9} {:>9} {:>10} | {:>9} {:>9} {:>9} {:>9} {:>10} | {:>10}",
        "store",
        "new p50",
        "p99",
        "+p50",
        "+p99",
        "new req/s",
        "rep p50",
        "p99",
        "+p50",
        "+p99",
        "rep req/s",
        "200 dup"
    );
    println!(
        "{:<14} {:>9} {:>9} {:>9} {:>9} {:>10.0} | {:>9} {:>9} {:>9} {:>9} {:>10} | {:>10}",
        "no layer",
        ms(base_lat.p50),
        ms(base_lat.p99),
        "",
        "",
        base_rps,
        "",
        "",
        "",
        "",
        "",
        ""
    );
    for backend in [
        Backend::SqliteFile,
        Backend::SqliteMemory,
        Backend::Postgres,
        Backend::MySql,
        Backend::Redis,
    ] {
        let name = format!("{backend:?}");
        if !wanted(&name.to_lowercase()) {
            continue;
        }
        let Some(env) = backend.open("bench").await else {
            continue;
        };
        let client = Http::new(serve(Some(IdempotencyLayer::from_arc(env.store()))).await);
        let new_lat = latency(&client, false).await;
        let new_rps = throughput(&client, false).await;
        let rep_lat = latency(&client, true).await;
        let rep_rps = throughput(&client, true).await;
        let dup = duplicates_wall(&client).await;
        println!(
            "{:<14} {:>9} {:>9} {:>9} {:>9} {:>10.0} | {:>9} {:>9} {:>9} {:>9} {:>10.0} | {:>8}ms",
            name,
            ms(new_lat.p50),
            ms(new_lat.p99),
            added(new_lat.p50, base_lat.p50),
            added(new_lat.p99, base_lat.p99),
            new_rps,
            ms(rep_lat.p50),
            ms(rep_lat.p99),
            added(rep_lat.p50, base_lat.p50),
            added(rep_lat.p99, base_lat.p99),
            rep_rps,
            ms(dup),
        );
        env.cleanup().await;
    }
    println!(
        "(latencies in ms per request on loopback; {SEQ} sequential requests; throughput {TOTAL} requests from {CONC} clients)"
    );
}
