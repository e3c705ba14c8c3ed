//! `simulate policy` (the what-if) reproduces the chain scenario on the same setting and two
//! published results: the SRE book's bimodal deadline case and Brooker's retry collapse.

use std::time::Duration;

use stormguard::graph::CallGraph;
use stormguard_sim::progress::NoProgress;
use stormguard_sim::scenario::chain::{self, ChainConfig, ChainMode};
use stormguard_sim::scenario::whatif::{Injection, WhatIfConfig, WhatIfReport, run};

fn graph(text: &str) -> CallGraph {
    CallGraph::from_toml(text).unwrap_or_else(|e| panic!("graph: {e}"))
}

fn simulate(graph: &CallGraph, cfg: &WhatIfConfig) -> WhatIfReport {
    run(graph, cfg, "graph", &mut NoProgress).unwrap_or_else(|e| panic!("run: {e}"))
}

/// Ten simulated seconds at the graph's own rates, with `injections`.
fn ten_seconds(injections: &[&str]) -> WhatIfConfig {
    WhatIfConfig {
        duration: Duration::from_secs(10),
        injections: injections
            .iter()
            .map(|i| Injection::parse(i).unwrap_or_else(|e| panic!("injection {i}: {e}")))
            .collect(),
        ..WhatIfConfig::default()
    }
}

/// Three layers a → b → c each calling the next with `policy`, c calling the leaf.
fn three_layers(policy: &str, signal: bool) -> CallGraph {
    graph(&format!(
        r#"
        [services.a]
        retry_signal = {signal}
        [[services.a.endpoints."GET /a".calls]]
        to = "b"
        endpoint = "GET /b"
        policy = {policy}

        [services.b]
        retry_signal = {signal}
        [[services.b.endpoints."GET /b".calls]]
        to = "c"
        endpoint = "GET /c"
        policy = {policy}

        [services.c]
        retry_signal = {signal}
        [[services.c.endpoints."GET /c".calls]]
        to = "leaf"
        endpoint = "GET /leaf"
        policy = {policy}

        [services.leaf.endpoints."GET /leaf"]
        latency = {{ histogram = [{{ le = "1ms", count = 1 }}] }}
        "#
    ))
}

const BACKOFF: &str =
    r#"backoff = { kind = "exponential", base = "10ms", cap = "1s", jitter = "full" }"#;

#[test]
fn a_leaf_outage_multiplies_27x_through_three_layers_and_about_1_1x_with_budgets_and_the_signal_as_chain_says()
 {
    let every_layer = three_layers(
        &format!("{{ retry = {{ max_attempts = 3 }}, {BACKOFF} }}"),
        false,
    );
    let budgeted = three_layers(
        &format!(
            r#"{{ retry = {{ max_attempts = 3 }}, {BACKOFF}, budget = {{ kind = "ratio", retry_ratio = 0.1, ttl = "10s", min_retries_per_sec = 0 }} }}"#
        ),
        true,
    );
    let cfg = WhatIfConfig {
        rate: Some(10_000.0),
        duration: Duration::from_secs(1),
        bin: Duration::from_millis(100),
        injections: vec![Injection::parse("outage:leaf@0s+100s").expect("injection")],
        seed: 42,
    };
    let plain = simulate(&every_layer, &cfg);
    let protected = simulate(&budgeted, &cfg);
    let chained = chain::run(
        &ChainConfig {
            modes: vec![ChainMode::EveryLayer, ChainMode::BudgetNack],
            ..ChainConfig::default()
        },
        &mut NoProgress,
    )
    .expect("chain");
    let leaf = |r: &WhatIfReport| r.service("leaf").expect("leaf").amplification;
    // Every layer retrying twice: 3 × 3 × 3 requests at the leaf per entry request.
    assert_eq!(leaf(&plain), 27.0);
    assert_eq!(chained.rows[0].amplification, 27.0);
    for (service, expected) in [("a", 1.0), ("b", 3.0), ("c", 9.0)] {
        assert_eq!(
            plain.service(service).expect("service").amplification,
            expected
        );
    }
    // Budgets and the don't-retry signal: only the lowest layer retries, within 10 %.
    let nack = chained.rows[1].amplification;
    assert!(
        (1.05..=1.15).contains(&leaf(&protected)),
        "{}",
        leaf(&protected)
    );
    assert!(
        (leaf(&protected) - nack).abs() <= 0.02,
        "graph {} vs chain {nack}",
        leaf(&protected)
    );
    assert_eq!(plain.entry_success_rate, 0.0);
    assert_eq!(protected.entry_requests, 10_000);
}

/// The SRE book (ch. 22, "Addressing Cascading Failures", bimodal latency): a frontend of
/// 1,000 threads serves 1,000 requests/s of 100 ms each; 5 % of requests never finish. With
/// a 100 s deadline each of those holds a thread for 100 s: every request needs
/// 0.95 × 0.1 s + 0.05 × 100 s = 5.095 thread-seconds on average, and 1,000 threads serve
/// 1,000 / 5.095 = 196.3 requests/s: 19.6 % of the load (the book's 1,000 / (5,000 + 95)).
/// With a 1 s deadline a request needs 0.145 thread-seconds: 145 threads, everything is
/// served (and 95 % succeed, the 5 % that never finish cannot).
fn bimodal(deadline: &str) -> CallGraph {
    graph(&format!(
        r#"
        [[services.client.endpoints."GET /".calls]]
        to = "frontend"
        endpoint = "GET /work"
        policy = {{ retry = {{ max_attempts = 1 }}, timeouts = {{ overall = "{deadline}" }} }}

        [services.frontend]
        workers = 1000
        queue = 0

        [services.frontend.endpoints."GET /work"]
        latency = {{ histogram = [{{ le = "100ms", count = 95 }}, {{ le = "100000s", count = 5 }}] }}
        "#
    ))
}

#[test]
fn the_sre_books_bimodal_case_serves_19_6_percent_with_a_100s_deadline_and_everything_with_a_sane_one()
 {
    let cfg = WhatIfConfig {
        rate: Some(1000.0),
        duration: Duration::from_secs(600),
        ..WhatIfConfig::default()
    };
    let derived: f64 = 1000.0 / (0.95 * 0.1 + 0.05 * 100.0) / 1000.0;
    assert!((derived - 0.196).abs() < 0.0005);
    let long = simulate(&bimodal("100s"), &cfg);
    let frontend = long.service("frontend").expect("frontend");
    // Steady state: after the first two 100 s generations of stuck threads.
    let steady = 200..600;
    let served: u64 = frontend.served_series[steady.clone()].iter().sum();
    let offered: u64 = frontend.offered_series[steady].iter().sum();
    let share = served as f64 / offered as f64;
    // Tolerance: 1 point (the stuck threads of one 100 s generation free up together).
    assert!(
        (share - derived).abs() < 0.01,
        "served {share}, derived {derived}"
    );
    assert!(frontend.success_rate < 0.25, "{}", frontend.success_rate);

    let sane = simulate(&bimodal("1s"), &cfg);
    let frontend = sane.service("frontend").expect("frontend");
    assert_eq!(frontend.served, 1.0);
    assert!(
        (frontend.success_rate - 0.95).abs() < 0.005,
        "{}",
        frontend.success_rate
    );
}

/// Brooker (2022-2023, "retries and metastability"): one server at utilisation 0.8, where
/// 0.1 % of requests take 10 ms instead of 0.1 ms; clients time out after 15 ms and retry.
/// A slow request holds up the 70-odd behind it for 10 ms; a second one soon after makes
/// queued requests wait past 15 ms; their retries join the queue while the originals are
/// still served (the server does not read deadlines), the load passes capacity and the
/// queue never drains. No other trigger is needed. Without retries the queue after two slow
/// requests drains at the 20 % spare capacity: it stays bounded.
fn brookers(attempts: u32) -> CallGraph {
    graph(&format!(
        r#"
        [[services.client.endpoints."GET /".calls]]
        to = "server"
        endpoint = "GET /work"
        policy = {{ idempotency = "idempotent", retry = {{ max_attempts = {attempts} }}, timeouts = {{ per_try = "15ms" }}, backoff = {{ kind = "fixed", base = "1ms", cap = "1ms", jitter = "none" }} }}

        [services.server]
        workers = 1
        honours_deadline = false

        [services.server.endpoints."GET /work"]
        latency = {{ histogram = [{{ le = "100us", count = 999 }}, {{ le = "10ms", count = 1 }}] }}
        "#
    ))
}

#[test]
fn brookers_retries_keep_the_queue_from_draining_and_without_them_it_stays_bounded() {
    let mean_ms = 0.999 * 0.1 + 0.001 * 10.0;
    let cfg = WhatIfConfig {
        rate: Some(0.8 / mean_ms * 1000.0),
        duration: Duration::from_secs(30),
        ..WhatIfConfig::default()
    };
    let retrying = simulate(&brookers(3), &cfg);
    let server = retrying.service("server").expect("server");
    // The queue grows all run long: by the last second it holds more than the first 10 s.
    assert!(server.queue_at_end > 200_000, "{}", server.queue_at_end);
    let last = server.offered_series.last().copied().unwrap_or(0);
    let served_last = server.served_series.last().copied().unwrap_or(0);
    assert!(
        last > 2 * served_last,
        "offered {last}, served {served_last}"
    );
    assert!(
        retrying.entry_success_rate < 0.5,
        "{}",
        retrying.entry_success_rate
    );
    // The load offered is the clients' three attempts, not their one request.
    assert!(server.amplification > 2.0, "{}", server.amplification);

    let single = simulate(&brookers(1), &cfg);
    let server = single.service("server").expect("server");
    assert!(server.queue_peak < 1_000, "{}", server.queue_peak);
    assert!(server.queue_at_end < 100, "{}", server.queue_at_end);
    assert!(
        single.entry_success_rate > 0.95,
        "{}",
        single.entry_success_rate
    );
    assert_eq!(server.amplification, 1.0);
}

#[test]
fn an_entry_without_traffic_sends_nothing_and_a_too_fine_bin_is_refused() {
    let g = graph(
        r#"
        [services.quiet.endpoints."GET /"]
        requests_per_sec = 0
        [[services.quiet.endpoints."GET /".calls]]
        to = "db"
        endpoint = "GET /q"
        policy = { retry = { max_attempts = 1 } }

        [services.busy.endpoints."GET /"]
        requests_per_sec = 10
        [[services.busy.endpoints."GET /".calls]]
        to = "db"
        endpoint = "GET /q"
        policy = { retry = { max_attempts = 1 } }

        [services.db.endpoints."GET /q"]
        "#,
    );
    let cfg = ten_seconds(&[]);
    let report = simulate(&g, &cfg);
    assert_eq!(report.service("quiet").map(|s| s.requests), Some(0));
    assert_eq!(report.service("busy").map(|s| s.requests), Some(100));
    // A series per service: 10 s in 1 µs bins would be 10 million counts each.
    let fine = WhatIfConfig {
        bin: Duration::from_micros(1),
        ..cfg
    };
    let refused = run(&g, &fine, "graph", &mut NoProgress).expect_err("too many bins");
    assert!(
        refused.to_string().contains("100000 bins per service"),
        "{refused}"
    );
}

#[test]
fn a_breaker_held_open_by_the_policy_sends_nothing_to_the_downstream() {
    let held = |isolated: bool| {
        graph(&format!(
            r#"
            [services.web.endpoints."GET /"]
            requests_per_sec = 10
            [[services.web.endpoints."GET /".calls]]
            to = "cdn"
            endpoint = "GET /img"
            policy = {{ retry = {{ max_attempts = 3 }}, breaker = {{ count = 20, isolated = {isolated} }} }}

            [services.cdn.endpoints."GET /img"]
            "#
        ))
    };
    let cfg = ten_seconds(&[]);
    let open = simulate(&held(true), &cfg);
    assert_eq!(open.service("cdn").map(|s| s.requests), Some(0));
    assert_eq!(open.entry_success_rate, 0.0);
    let closed = simulate(&held(false), &cfg);
    assert_eq!(closed.service("cdn").map(|s| s.requests), Some(100));
    assert_eq!(closed.entry_success_rate, 1.0);
}

#[test]
fn an_answered_attempt_is_not_timed_out_again_while_its_call_waits_to_retry() {
    // mid calls db, which is down, so mid answers 503 at once; web's per-try timer (10 ms,
    // set since mid's answer time is not known when the attempt leaves) is still pending
    // when that answer comes, and the backoff (50 ms) outlasts it. Each of web's calls
    // makes its three attempts, no fewer: the answered attempt does not time out again.
    let g = graph(
        r#"
        [services.web.endpoints."GET /"]
        requests_per_sec = 10
        [[services.web.endpoints."GET /".calls]]
        to = "mid"
        endpoint = "GET /mid"
        policy = { retry = { max_attempts = 3 }, backoff = { kind = "fixed", base = "50ms", jitter = "none" }, timeouts = { per_try = "10ms" } }

        [services.mid]
        [[services.mid.endpoints."GET /mid".calls]]
        to = "db"
        endpoint = "GET /q"
        policy = { retry = { max_attempts = 1 } }

        [services.db.endpoints."GET /q"]
        "#,
    );
    let cfg = ten_seconds(&["outage:db@0s+100s"]);
    let report = simulate(&g, &cfg);
    assert_eq!(report.service("web").map(|s| s.requests), Some(100));
    assert_eq!(report.service("mid").map(|s| s.requests), Some(300));
}

#[test]
fn a_breaker_opened_by_failures_stops_the_calls_to_a_downstream_that_is_down() {
    let to_cdn = |breaker: &str| {
        graph(&format!(
            r#"
            [services.web.endpoints."GET /"]
            requests_per_sec = 10
            [[services.web.endpoints."GET /".calls]]
            to = "cdn"
            endpoint = "GET /img"
            policy = {{ retry = {{ max_attempts = 1 }}{breaker} }}

            [services.cdn.endpoints."GET /img"]
            "#
        ))
    };
    let cfg = ten_seconds(&["outage:cdn@0s+100s"]);
    let without = simulate(&to_cdn(""), &cfg);
    assert_eq!(without.service("cdn").map(|s| s.requests), Some(100));
    // Open after 10 failures (the window's count), for 5 s, then one probe, which fails.
    let with = simulate(
        &to_cdn(r#", breaker = { count = 10, open = "5s", probes = 1 }"#),
        &cfg,
    );
    let sent = with.service("cdn").map_or(0, |s| s.requests);
    assert!((10..=13).contains(&sent), "cdn saw {sent} of 100 calls");
    assert_eq!(with.entry_success_rate, 0.0);
}
