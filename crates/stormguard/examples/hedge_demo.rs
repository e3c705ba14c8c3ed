//! What hedging does to tail latency, and what it costs, on a virtual clock.
//!
//! The downstream answers every call, but with a bimodal latency drawn by a seeded
//! `FaultInjector`: 95 % of calls take 10 ms, 5 % take 500 ms. Requests are sent one after
//! another; for each policy the demo prints the latency percentiles a caller sees, the
//! attempts sent per request (the extra load) and how often the retry budget refused a hedge.
//!
//! Time is tokio's paused clock, so the run takes no wall time and prints the same figures
//! every time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use stormguard::budget::RatioBudget;
use stormguard::classify::ByErrorClass;
use stormguard::clock::Clock;
use stormguard::fault::{Abort, FaultConfig, FaultInjector, Latency};
use stormguard::hedge::{HedgeDelay, HedgeObserver, HedgePolicy, Hedger, HedgingStopped};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);
const REQUESTS: usize = 10_000;
const SEED: u64 = 2013;

/// Counts attempts sent and hedges refused by the budget.
#[derive(Default)]
struct Load {
    sent: AtomicU64,
    refused: AtomicU64,
}

impl HedgeObserver for Load {
    fn attempt_sent(&self, _attempt: u32) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }
    fn hedging_stopped(&self, _sent: u32, why: HedgingStopped) {
        if why == HedgingStopped::Budget {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Sends `REQUESTS` requests through a hedger and prints one table row.
async fn row(label: &str, delay: Option<Duration>, retry_ratio: f64) {
    let faults = FaultInjector::new(FaultConfig::new(SEED).with_latency(
        1.0,
        Latency::Bimodal {
            fast: 10 * MS,
            slow: 500 * MS,
            slow_share: 0.05,
        },
    ))
    .expect("valid fault config");
    let budget = RatioBudget::new(retry_ratio, Duration::from_secs(10), 0, Clock::tokio())
        .expect("valid budget");
    let load = Arc::new(Load::default());
    let policy = HedgePolicy::new(3, HedgeDelay::Fixed(delay.unwrap_or(Duration::ZERO)))
        // Without a delay the row is the baseline: calls are not idempotent, so not hedged.
        .with_idempotent(delay.is_some());
    let hedger = Hedger::new(policy)
        .expect("a valid policy")
        .with_budget(budget)
        .with_observer(Arc::clone(&load));

    let mut latencies = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let start = Instant::now();
        hedger
            .run(
                |_| faults.wrap(async { Ok::<&str, Abort>("ok") }),
                ByErrorClass,
            )
            .await
            .expect("the downstream always answers");
        latencies.push(start.elapsed());
    }
    latencies.sort();
    let ms = |d: Duration| d.as_millis();
    println!(
        "{label:<28} {:>6} {:>6} {:>8} {:>12.3} {:>8}",
        ms(percentile(&latencies, 0.50)),
        ms(percentile(&latencies, 0.99)),
        ms(percentile(&latencies, 0.999)),
        load.sent.load(Ordering::Relaxed) as f64 / REQUESTS as f64,
        load.refused.load(Ordering::Relaxed),
    );
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    println!(
        "{REQUESTS} sequential requests; downstream latency 10 ms (95 %) or 500 ms (5 %), seed {SEED}"
    );
    println!("hedging: up to 3 attempts, budget = share of requests over 10 s (Finagle ratio)\n");
    println!(
        "{:<28} {:>6} {:>6} {:>8} {:>12} {:>8}",
        "policy", "p50 ms", "p99 ms", "p99.9 ms", "attempts/req", "refused"
    );
    row("no hedging", None, 0.1).await;
    row("hedge after 15 ms, 10 %", Some(15 * MS), 0.1).await;
    row("hedge after 30 ms, 10 %", Some(30 * MS), 0.1).await;
    row("hedge after 100 ms, 10 %", Some(100 * MS), 0.1).await;
    row("hedge after 30 ms, 2 %", Some(30 * MS), 0.02).await;
    println!(
        "\nA hedge after about the p95 cuts p99 from 500 ms to the delay plus one fast call, for \
         ~5 % more attempts.\nA budget smaller than the slow share caps the extra load, and the \
         tail comes back."
    );
}
