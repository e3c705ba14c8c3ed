//! A regression guard for the what-if's event loop: two small runs whose whole reports
//! (every figure, every series, the number of events) were saved from the event loop as it
//! was before its speed-up (commit bb7be14), so that a change meant to make the loop cheaper
//! cannot change what it computes unnoticed. The saved reports are outputs of an earlier
//! version of the code under test, kept as expected values; they are not derived by hand.
//!
//! The runs are picked to reach every path of the loop: the benchmark's ten-service graph
//! (budgets of both kinds, per-try and overall timeouts, the don't-retry signal, queues)
//! under an outage, a latency spike and a 503 rate, and Brooker's single-worker server
//! whose histogram latencies make many events fall on the same instant (so the order of
//! ties is pinned too).
//!
//! After a change that is *meant* to change the figures, run
//! `STORMGUARD_BLESS=1 cargo test -p stormguard-sim --test whatif_pinned` to save the new
//! reports, and say why in the commit.

use std::path::PathBuf;
use std::time::Duration;

use stormguard::graph::CallGraph;
use stormguard_sim::progress::NoProgress;
use stormguard_sim::scenario::whatif::{Injection, WhatIfConfig, run};

fn check(name: &str, graph: &str, cfg: &WhatIfConfig) {
    let graph = CallGraph::from_toml(graph).unwrap_or_else(|e| panic!("graph: {e}"));
    let report = run(&graph, cfg, "graph", &mut NoProgress).unwrap_or_else(|e| panic!("run: {e}"));
    let actual = serde_json::to_value(&report).unwrap_or_else(|e| panic!("json: {e}"));
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(format!("{name}.json"));
    if std::env::var_os("STORMGUARD_BLESS").is_some() {
        let text = serde_json::to_string_pretty(&actual).unwrap_or_else(|e| panic!("json: {e}"));
        std::fs::write(&path, text + "\n").unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let expected: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // Field by field first, so that a difference names the service and figure.
    for (i, (a, e)) in actual["services"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(expected["services"].as_array().into_iter().flatten())
        .enumerate()
    {
        assert_eq!(a, e, "{name}: service row {i} differs");
    }
    assert_eq!(actual, expected, "{name}: the report differs");
}

#[test]
fn ten_services_under_three_faults_compute_the_saved_report() {
    let cfg = WhatIfConfig {
        rate: Some(400.0),
        duration: Duration::from_secs(6),
        bin: Duration::from_millis(250),
        injections: [
            "outage:db@1s+1s",
            "latency*20:search@2500ms+1s",
            "503=0.3:auth@4s+1s",
        ]
        .iter()
        .map(|i| Injection::parse(i).unwrap_or_else(|e| panic!("{i}: {e}")))
        .collect(),
        seed: 7,
    };
    check(
        "whatif_ten_services",
        include_str!("../benches/ten_services.toml"),
        &cfg,
    );
}

#[test]
fn brookers_tied_instants_compute_the_saved_report() {
    let graph = r#"
        [[services.client.endpoints."GET /".calls]]
        to = "server"
        endpoint = "GET /work"
        policy = { idempotency = "idempotent", retry = { max_attempts = 3 }, timeouts = { per_try = "15ms" }, backoff = { kind = "fixed", base = "1ms", cap = "1ms", jitter = "none" } }

        [services.server]
        workers = 1
        honours_deadline = false

        [services.server.endpoints."GET /work"]
        latency = { histogram = [{ le = "100us", count = 999 }, { le = "10ms", count = 1 }] }
    "#;
    let mean_ms = 0.999 * 0.1 + 0.001 * 10.0;
    let cfg = WhatIfConfig {
        rate: Some(0.8 / mean_ms * 1000.0),
        duration: Duration::from_secs(3),
        bin: Duration::from_millis(100),
        ..WhatIfConfig::default()
    };
    check("whatif_brooker", graph, &cfg);
}
