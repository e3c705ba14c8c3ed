//! `simulate policy` at production size: a 10-service graph (13 requests per entry request,
//! every call with timeouts and most with retries and budgets) at 10,000 entry requests per
//! second for 10 simulated minutes, with a 30 s database outage in the middle. The target is
//! under 5 s on one core.
//!
//! Run with `taskset -c 1 cargo bench -p stormguard-sim --bench whatif`. It prints the wall
//! time, the events handled and the requests simulated; nothing here asserts on the
//! wall-clock figure (it depends on the machine and its load). A number as the first
//! argument that is not a flag sets the simulated seconds (for a short run under
//! `valgrind --tool=callgrind`, whose instruction counts do not depend on the load).

use std::time::{Duration, Instant};

use stormguard::graph::CallGraph;
use stormguard_sim::progress::NoProgress;
use stormguard_sim::scenario::whatif::{Injection, WhatIfConfig, run};

const GRAPH: &str = include_str!("ten_services.toml");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let graph = CallGraph::from_toml(GRAPH)?;
    let seconds: u64 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(600);
    let cfg = WhatIfConfig {
        rate: Some(10_000.0),
        duration: Duration::from_secs(seconds),
        injections: vec![Injection::parse(&format!(
            "outage:db@{}s+{}s",
            seconds / 2,
            (seconds / 20).max(1)
        ))?],
        ..WhatIfConfig::default()
    };
    let started = Instant::now();
    let report = run(&graph, &cfg, "graph", &mut NoProgress)?;
    let elapsed = started.elapsed();
    let requests: u64 = report.services.iter().map(|s| s.requests).sum();
    println!(
        "whatif 10 services, 10k/s, {seconds} s: {:.2} s wall, {} events ({:.1} ns/event), {} requests, entry success {:.4}",
        elapsed.as_secs_f64(),
        report.events,
        elapsed.as_secs_f64() * 1e9 / report.events.max(1) as f64,
        requests,
        report.entry_success_rate
    );
    for s in &report.services {
        println!(
            "  {:<10} {:>10.1}/s {:>7.3}x success {:.4} p99 {:?} ms recover {:?} s",
            s.service, s.offered_per_sec, s.amplification, s.success_rate, s.p99_ms, s.recover_s
        );
    }
    Ok(())
}
