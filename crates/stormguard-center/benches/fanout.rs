//! Publish → ACK across many watching instances, in one process: a center on SQLite on
//! 127.0.0.1 and N `CenterWatch` tasks (each with its own client stack and HTTP client).
//!
//! ```text
//! cargo bench -p stormguard-center --bench fanout -- [WATCHERS] [ROUNDS]
//! cargo bench -p stormguard-center --bench fanout -- --idle 10000
//! ```
//!
//! Each round publishes a version and measures, per instance, the time from the publish
//! request to (a) the instance's swap of the version and (b) its ACK recorded by the center
//! (the server's publish-to-ACK histogram, millisecond timestamps). `--idle N` connects N
//! watchers and reports the process's resident memory before and after (center and
//! watchers together).
#![allow(clippy::unwrap_used, missing_docs)]

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use serde_json::json;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::policy::PolicyFile;
use stormguard_center::metric_names::PUBLISH_TO_ACK;
use stormguard_center::{Center, CenterConfig, Role, Store};
use stormguard_tower::client::{CenterWatch, CenterWatchConfig, ClientLayer};

fn policy(attempts: u32) -> String {
    format!("[endpoints.default]\nretry = {{ max_attempts = {attempts} }}\n")
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let idle = args.first().is_some_and(|a| a == "--idle");
    let numbers: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let watchers = numbers
        .first()
        .copied()
        .unwrap_or(if idle { 10_000 } else { 1_000 });
    let rounds = numbers.get(1).copied().unwrap_or(10);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(watchers, rounds, idle));
}

async fn run(watchers: usize, rounds: usize, idle: bool) {
    let seconds = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(PUBLISH_TO_ACK.to_owned()), &seconds)
        .unwrap()
        .install_recorder()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("sqlite://{}", dir.path().join("c.db").display()))
        .await
        .unwrap();
    let config = CenterConfig {
        metrics: Some(handle.clone()),
        ..CenterConfig::default()
    };
    let center = Center::new(store, config).await.unwrap();
    let editor = center
        .create_token("bench", Role::Editor, None)
        .await
        .unwrap();
    let token = center
        .create_token("svc", Role::Instance, Some("svc"))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(center.clone().serve(listener, std::future::pending()));
    let http = reqwest::Client::new();
    let publish = |version: u64| {
        let body = json!({"base": version - 1, "policy": policy(1 + (version % 5) as u32)});
        http.post(format!("{base}/v1/services/svc/versions"))
            .bearer_auth(&editor)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    assert_eq!(publish(1).await.unwrap().status(), 201);

    let before = rss_kib();
    let started = Instant::now();
    let mut stacks = Vec::with_capacity(watchers);
    for i in 0..watchers {
        let layer =
            ClientLayer::from_policy_file(&PolicyFile::from_toml(&policy(2)).unwrap()).unwrap();
        let config = CenterWatchConfig::new(&base, "svc", &format!("svc-{i}"), &token)
            .with_backoff(
                Backoff::exponential(Duration::from_millis(50))
                    .with_cap(Duration::from_secs(2))
                    .with_jitter(Jitter::Full),
            )
            .with_seed(i as u64);
        let watch = CenterWatch::start(layer.policies(), config).unwrap();
        stacks.push((layer, watch));
    }
    for (_, watch) in &stacks {
        watch.wait_for(|s| s.applied == Some(1)).await;
    }
    println!(
        "{watchers} watchers connected and on version 1 in {:.2?}",
        started.elapsed()
    );
    if idle {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = rss_kib();
        println!(
            "resident memory: {} MiB before, {} MiB with {watchers} idle watchers ({:.1} KiB per watcher, center and client together)",
            before / 1024,
            after / 1024,
            (after.saturating_sub(before)) as f64 / watchers as f64
        );
        return;
    }

    let mut applied = Vec::with_capacity(watchers * rounds);
    for round in 0..rounds {
        let version = 2 + round as u64;
        let start = Instant::now();
        assert_eq!(publish(version).await.unwrap().status(), 201);
        let waits = stacks.iter().map(|(_, watch)| async move {
            watch.wait_for(|s| s.applied == Some(version)).await;
            start.elapsed()
        });
        let mut times = futures_util::future::join_all(waits).await;
        times.sort();
        println!(
            "round {round}: applied p50 {:.1?} p99 {:.1?} max {:.1?}",
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            times[times.len() - 1]
        );
        applied.extend(times);
        // Let the ACKs of this round land before the next publish.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    applied.sort();
    println!(
        "publish -> applied, {} samples: p50 {:.1?} p90 {:.1?} p99 {:.1?} max {:.1?}",
        applied.len(),
        percentile(&applied, 0.5),
        percentile(&applied, 0.9),
        percentile(&applied, 0.99),
        applied[applied.len() - 1]
    );
    println!("publish -> ACK recorded by the center (histogram, seconds):");
    for line in handle.render().lines() {
        if line.starts_with(PUBLISH_TO_ACK) {
            println!("  {line}");
        }
    }
}
