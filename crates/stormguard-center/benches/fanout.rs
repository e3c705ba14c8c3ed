//! Publish → ACK across many watching instances, in one process: a center on SQLite on
//! 127.0.0.1 and N `CenterWatch` tasks (each with its own client stack and HTTP client).
//!
//! ```text
//! cargo bench -p stormguard-center --bench fanout -- [WATCHERS] [ROUNDS]
//! cargo bench -p stormguard-center --bench fanout -- --idle 10000
//! cargo bench -p stormguard-center --bench fanout -- --restart 1000
//! ```
//!
//! Each round publishes a version and measures, per instance, the time from the publish
//! request to (a) the instance's swap of the version and (b) its ACK recorded by the center
//! (the server's publish-to-ACK histogram, millisecond timestamps). `--idle N` connects N
//! watchers and reports the process's resident memory before and after (center and
//! watchers together) and the CPU time the process spent while they idled.
//! `--restart N` connects N watchers, stops the center (its streams end), keeps it down for a
//! second, starts it again on the same store and port, and reports when each watcher is
//! connected again: the spread the jittered reconnect backoff gives, and how many never came
//! back (none should).
//!
//! Each watcher holds two sockets (its end and the center's; its ACKs and polls keep no
//! connection open). In one process 10,000 watchers need more than 20,000 file descriptors, so `--idle` runs the watchers in a child process
//! (this bench again, `--watchers-of URL TOKEN N`) and the center alone in this one: its
//! memory and CPU are the center's own. The bench stops, saying so, if `ulimit -n` is too
//! low for what it would open.
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

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().is_some_and(|a| a == "--watchers-of") {
        return watchers_of(&args[1..]);
    }
    let idle = args.first().is_some_and(|a| a == "--idle");
    let restart = args.first().is_some_and(|a| a == "--restart");
    let numbers: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let watchers = numbers
        .first()
        .copied()
        .unwrap_or(if idle { 10_000 } else { 1_000 });
    let rounds = numbers.get(1).copied().unwrap_or(10);
    // Both ends of every watch in this process, except with --idle (the watchers' ends are
    // in the child).
    let needed = if idle { 1 } else { 2 } * watchers as u64 + 256;
    let limit = open_files_limit();
    if limit < needed {
        eprintln!(
            "{watchers} watchers need about {needed} file descriptors; ulimit -n is {limit}: raise it (ulimit -n {needed})"
        );
        std::process::exit(2);
    }
    let mode = if idle {
        Mode::Idle
    } else if restart {
        Mode::Restart
    } else {
        Mode::Fanout
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(watchers, rounds, mode));
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Fanout,
    Idle,
    Restart,
}

/// The child of `--idle`: `--watchers-of URL TOKEN N` starts N watchers on the center at
/// URL, prints `ready` once every one runs version 1, and holds them until its standard
/// input closes.
fn watchers_of(args: &[String]) {
    let (base, token) = (args[0].clone(), args[1].clone());
    let count: usize = args[2].parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let stacks = start_watchers(&base, &token, count);
        for (_, watch) in &stacks {
            watch.wait_for(|s| s.applied == Some(1)).await;
        }
        println!("ready");
        tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut sink);
        })
        .await
        .unwrap();
        drop(stacks);
    });
}

/// `count` watchers of "svc", each with its own client stack.
fn start_watchers(base: &str, token: &str, count: usize) -> Vec<(ClientLayer, CenterWatch)> {
    (0..count)
        .map(|i| {
            let layer =
                ClientLayer::from_policy_file(&PolicyFile::from_toml(&policy(2)).unwrap()).unwrap();
            let config = CenterWatchConfig::new(base, "svc", &format!("svc-{i}"), token)
                .with_backoff(
                    Backoff::exponential(Duration::from_millis(50))
                        .with_cap(Duration::from_secs(2))
                        .with_jitter(Jitter::Full),
                )
                .with_seed(i as u64);
            let watch = CenterWatch::start(layer.policies(), config).unwrap();
            (layer, watch)
        })
        .collect()
}

/// Resident memory (KiB) and CPU time (user + system) of process `pid` (`self` for this
/// one), from /proc.
fn usage(pid: &str) -> (u64, Duration) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0);
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1;
            let fields: Vec<&str> = after.split_whitespace().collect();
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    (rss, Duration::from_millis(ticks * 10))
}

/// The soft limit of open files (`/proc/self/limits`).
fn open_files_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(u64::MAX)
}

/// Serves the center on `addr` until the sender is used (or dropped); the task ends when
/// the listener is closed.
async fn serve(
    center: &Center,
    addr: std::net::SocketAddr,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = stormguard_tower::listen::bind(addr).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(center.clone().serve(listener, async move {
        let _ = stopped.await;
    }));
    (stop, task)
}

/// `--idle`: the watchers in a child process; the memory and CPU of this one, the center
/// alone, and of the child.
async fn idle_center(base: &str, token: &str, watchers: usize) {
    let (before, _) = usage("self");
    let started = Instant::now();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--watchers-of", base, token, &watchers.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        assert_eq!(line.trim(), "ready");
    })
    .await
    .unwrap();
    println!(
        "{watchers} watchers (child process) connected and on version 1 in {:.2?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = child.id().to_string();
    let (center_rss, center_cpu) = usage("self");
    let (child_rss, child_cpu) = usage(&pid);
    println!(
        "center resident memory: {} MiB before, {} MiB with {watchers} idle watchers ({:.1} KiB per watcher); the watchers' process: {} MiB",
        before / 1024,
        center_rss / 1024,
        center_rss.saturating_sub(before) as f64 / watchers as f64,
        child_rss / 1024
    );
    let wall = Instant::now();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let elapsed = wall.elapsed().as_secs_f64();
    let center_used = usage("self").1.saturating_sub(center_cpu);
    let child_used = usage(&pid).1.saturating_sub(child_cpu);
    println!(
        "CPU over {elapsed:.1} s idle (keep-alive comments every 15 s): center {center_used:.2?} ({:.2}% of one core), watchers' process {child_used:.2?} ({:.2}%)",
        100.0 * center_used.as_secs_f64() / elapsed,
        100.0 * child_used.as_secs_f64() / elapsed
    );
    drop(child.stdin.take());
    let _ = child.wait();
}

async fn run(watchers: usize, rounds: usize, mode: Mode) {
    let seconds = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(PUBLISH_TO_ACK.to_owned()), &seconds)
        .unwrap()
        .install_recorder()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("c.db").display());
    let store = Store::open(&url).await.unwrap();
    let config = CenterConfig {
        metrics: Some(handle.clone()),
        ..CenterConfig::default()
    };
    let center = Center::new(store, config.clone()).await.unwrap();
    let editor = center
        .create_token("bench", Role::Editor, None)
        .await
        .unwrap();
    let token = center
        .create_token("svc", Role::Instance, Some("svc"))
        .await
        .unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let base = format!("http://{addr}");
    let (stop, serving) = serve(&center, addr).await;
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

    if mode == Mode::Idle {
        idle_center(&base, &token, watchers).await;
        return;
    }
    let started = Instant::now();
    let stacks = start_watchers(&base, &token, watchers);
    for (_, watch) in &stacks {
        watch.wait_for(|s| s.applied == Some(1)).await;
    }
    println!(
        "{watchers} watchers connected and on version 1 in {:.2?}",
        started.elapsed()
    );
    if mode == Mode::Restart {
        let _ = stop.send(());
        serving.await.unwrap().unwrap();
        for (_, watch) in &stacks {
            watch.wait_for(|s| !s.connected).await;
        }
        println!("center stopped: {watchers} watchers disconnected; down for 1 s");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let store = Store::open(&url).await.unwrap();
        let center = Center::new(store, config).await.unwrap();
        let restarted = Instant::now();
        let _serving = serve(&center, addr).await;
        let waits = stacks.iter().map(|(_, watch)| async move {
            let back = tokio::time::timeout(
                Duration::from_secs(120),
                watch.wait_for(|s| s.connected && s.connections >= 2),
            )
            .await;
            back.ok().map(|_| restarted.elapsed())
        });
        let results = futures_util::future::join_all(waits).await;
        let lost = results.iter().filter(|r| r.is_none()).count();
        let mut times: Vec<Duration> = results.into_iter().flatten().collect();
        times.sort();
        println!(
            "reconnected after the restart: {} of {watchers} ({lost} lost); from the restart: first {:.1?} p10 {:.1?} p50 {:.1?} p90 {:.1?} p99 {:.1?} last {:.1?}",
            times.len(),
            times[0],
            percentile(&times, 0.1),
            percentile(&times, 0.5),
            percentile(&times, 0.9),
            percentile(&times, 0.99),
            times[times.len() - 1]
        );
        let mut per_100ms = std::collections::BTreeMap::<u128, usize>::new();
        for t in &times {
            *per_100ms.entry(t.as_millis() / 100).or_default() += 1;
        }
        println!("reconnects per 100 ms after the restart:");
        for (slot, count) in per_100ms {
            println!("  {:>5} ms  {count}", slot * 100);
        }
        return;
    }
    let _keep_serving = (stop, serving);
    // The ACKs of version 1 (timed from a publish made before the watchers started) are
    // left out: the rounds' histogram is the difference from here, once they have all
    // landed (or 10 s have gone).
    let total = |buckets: &[(String, u64)]| buckets.last().map_or(0, |(_, n)| *n);
    let waited = Instant::now();
    while total(&ack_buckets(&handle.render())) < watchers as u64 && waited.elapsed().as_secs() < 10
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before_rounds = ack_buckets(&handle.render());

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
    // Every round's ACKs counted (or 10 s gone: the missing ones show as a shortfall).
    let expected = total(&before_rounds) + (watchers * rounds) as u64;
    let waited = Instant::now();
    while total(&ack_buckets(&handle.render())) < expected && waited.elapsed().as_secs() < 10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after_rounds = ack_buckets(&handle.render());
    println!("publish -> ACK recorded by the center, the rounds' ACKs (cumulative histogram):");
    for (le, after) in &after_rounds {
        let before = before_rounds
            .iter()
            .find(|(bound, _)| bound == le)
            .map_or(0, |(_, n)| *n);
        println!("  <= {le:>5} s  {}", after - before);
    }
}

/// The publish-to-ACK histogram's cumulative bucket counts, by upper bound, from the
/// exporter's text.
fn ack_buckets(text: &str) -> Vec<(String, u64)> {
    let prefix = format!("{PUBLISH_TO_ACK}_bucket{{le=\"");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once("\"} ")?;
            Some((le.to_owned(), count.trim().parse().ok()?))
        })
        .collect()
}
