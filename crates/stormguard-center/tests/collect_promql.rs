//! Acceptance: the PromQL path and the scrape path give the same firing on the same
//! traffic.
//!
//! A real test service on 127.0.0.1 (`STORMGUARD_TEST_PROMETHEUS_RULES_TARGET`, which the
//! Prometheus of `.ci/stores.sh` scrapes every second) calls a CDN stand-in that answers
//! 504 through the one client stack (3 attempts) and serves the stack's metrics at
//! `/metrics`. Two centers with the same policy and the same rule are fed by the two
//! collectors: one scrapes the service, the other asks Prometheus
//! (`STORMGUARD_TEST_PROMETHEUS_URL`). Both rules fire, publishing the same change.
//!
//! Prometheus runs in real time, so this test waits for it: it polls Prometheus (every
//! 250 ms, at most 60 s) until the service's samples are in, then reads once. Every series
//! of this run carries a `run` label of its own, so samples of an earlier run are never
//! read. Without the variables the test says SKIPPED (and fails in CI).
#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use serde_json::{Value, json};
use stormguard::rules::Verdict;
use stormguard_center::{
    CollectConfig, Collected, Collector, PrometheusSource, RuleRunner, Source,
};
use stormguard_tower::metric_names::ATTEMPT_DURATION;
use support::{TestCenter, attempts, client_stack};
use tower::{Layer, ServiceExt};

fn servers(test: &str) -> Option<(String, String)> {
    match (
        std::env::var("STORMGUARD_TEST_PROMETHEUS_URL"),
        std::env::var("STORMGUARD_TEST_PROMETHEUS_RULES_TARGET"),
    ) {
        (Ok(url), Ok(target)) if !url.is_empty() && !target.is_empty() => Some((url, target)),
        _ => {
            assert!(
                std::env::var("STORMGUARD_REQUIRE_ALL_STORES").as_deref() != Ok("1"),
                "STORMGUARD_TEST_PROMETHEUS_URL/_RULES_TARGET are not set but STORMGUARD_REQUIRE_ALL_STORES=1"
            );
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: STORMGUARD_TEST_PROMETHEUS_URL and _RULES_TARGET are not set \
                 (source .ci/stores.sh)"
            );
            None
        }
    }
}

/// A center with `web`'s policy (3 attempts) and the rule, fed by a collector of `source`.
async fn center(source: Source) -> (TestCenter, Collector) {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    assert_eq!(editor.publish("web", 0, &attempts(3)).await.0, 201);
    let rule = json!({
        "name": "cdn-504",
        "service": "web",
        "endpoint": "default",
        "when": { "series": "error_ratio", "code": 504, "above": 0.5, "exit_below": 0.1 },
        "actions": [{ "set": "attempts", "max_attempts": 1 }]
    });
    let (status, _) = editor
        .send(
            "PUT",
            "/v1/services/web/rules/cdn-504",
            Some(rule.to_string().into_bytes()),
        )
        .await;
    assert_eq!(status, 204);
    let runner = Arc::new(RuleRunner::new(center.center.clone(), 6));
    let config = CollectConfig {
        source,
        ..CollectConfig::default()
    };
    let collector = Collector::new(center.center.clone(), runner, config);
    (center, collector)
}

async fn serve(router: Router, addr: &str) -> String {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

/// Version 2 of `web` on `center`: its policy, message and changed fields.
async fn version_2(center: &TestCenter) -> (Value, Value, Value) {
    let (status, body) = center
        .api(&center.viewer)
        .get("/v1/services/web/versions/2")
        .await;
    assert_eq!(status, 200, "{body}");
    (
        body["policy"].clone(),
        body["message"].clone(),
        body["diff"].clone(),
    )
}

fn only_firing(collected: &[Collected]) -> (Verdict, Option<u64>, Value) {
    assert_eq!(collected.len(), 1, "{collected:?}");
    let events = collected[0].events.as_ref().unwrap();
    assert_eq!(events.len(), 1, "{collected:?}");
    let detail: Value = serde_json::from_str(&events[0].detail).unwrap();
    (
        events[0].verdict,
        events[0].version,
        detail["observed"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promql_and_scrape_paths_fire_the_same_rule_the_same_way() {
    let Some((prometheus, target)) =
        servers("promql_and_scrape_paths_fire_the_same_rule_the_same_way")
    else {
        return;
    };
    let run = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let seconds = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0];
    let recorder = PrometheusBuilder::new()
        .add_global_label("run", &run)
        .set_buckets_for_metric(Matcher::Full(ATTEMPT_DURATION.to_owned()), &seconds)
        .unwrap()
        .install_recorder()
        .unwrap();
    stormguard_tower::observe::describe_metrics();
    let metrics = serve(
        Router::new().route("/metrics", get(move || async move { recorder.render() })),
        &target,
    )
    .await;

    // The CDN stand-in answers 504; the test service calls it through the client stack,
    // one call every 20 ms, for as long as the test runs.
    let cdn = serve(
        Router::new().route("/img", get(|| async { StatusCode::GATEWAY_TIMEOUT })),
        "127.0.0.1:0",
    )
    .await;
    let stack = client_stack(3);
    let client = stack.layer(Client::builder(TokioExecutor::new()).build_http());
    let call = move || {
        let request = http::Request::get(format!("{cdn}/img"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        client.clone().oneshot(request)
    };
    call().await.unwrap();
    let (calls_tx, mut calls) = tokio::sync::watch::channel(1u64);
    let traffic = tokio::spawn(async move {
        let mut pace = tokio::time::interval(Duration::from_millis(20));
        loop {
            pace.tick().await;
            let _ = call().await;
            calls_tx.send_modify(|n| *n += 1);
        }
    });

    // The scrape path: a baseline, a few more calls, a second scrape.
    let (scraping, scrape) = center(Source::Scrape).await;
    scraping
        .center
        .scrape_targets()
        .add_static("web", "test-service", &format!("{metrics}/metrics"))
        .unwrap();
    assert!(
        scrape.round(Instant::now()).await[0]
            .events
            .as_ref()
            .unwrap()
            .is_empty()
    );
    let seen = *calls.borrow_and_update();
    calls.wait_for(|n| *n >= seen + 5).await.unwrap();
    let scraped = only_firing(&scrape.round(Instant::now()).await);

    // The PromQL path: once Prometheus holds two samples of this run's 504s in the
    // window, one read.
    let selector = format!("job=\"stormguard-rules-test\",run=\"{run}\"");
    let source = PrometheusSource {
        selector: selector.clone(),
        window: Duration::from_secs(5),
        ..PrometheusSource::new(&prometheus)
    };
    let (querying, promql) = center(Source::Prometheus(source)).await;
    let ready =
        format!("count_over_time(stormguard_responses_total{{{selector},code=\"504\"}}[5s]) >= 2");
    let http = reqwest::Client::new();
    let mut poll = tokio::time::interval(Duration::from_millis(250));
    let mut polls = 0;
    loop {
        poll.tick().await;
        let text = http
            .get(format!("{prometheus}/api/v1/query"))
            .query(&[("query", ready.as_str())])
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let answer: Value = serde_json::from_str(&text).unwrap();
        if answer["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
        {
            break;
        }
        polls += 1;
        assert!(
            polls < 240,
            "Prometheus at {prometheus} has no two samples of {metrics}/metrics after 60 s: \
             is {target} in its scrape configuration (source .ci/stores.sh)? {answer}"
        );
    }
    let queried = only_firing(&promql.round(Instant::now()).await);
    traffic.abort();

    // The same verdict, the same version, the same observed value, the same change.
    assert_eq!(scraped.0, Verdict::Fire);
    assert_eq!(scraped.1, Some(2));
    assert_eq!(scraped, queried);
    assert_eq!(scraped.2["error_ratio{code=504}"], json!(1.0));
    assert_eq!(version_2(&scraping).await, version_2(&querying).await);
    let (policy, message, _) = version_2(&querying).await;
    assert!(
        policy.as_str().unwrap().contains("max_attempts = 1"),
        "{policy}"
    );
    assert!(
        message
            .as_str()
            .unwrap()
            .contains("retry.max_attempts 3 -> 1"),
        "{message}"
    );
}

#[tokio::test]
async fn a_selector_prometheus_refuses_is_a_typed_error_naming_the_query() {
    use stormguard_center::collect::PromqlError;

    let Some((prometheus, _)) =
        servers("a_selector_prometheus_refuses_is_a_typed_error_naming_the_query")
    else {
        return;
    };
    let source = PrometheusSource {
        selector: "job=~\"(\"".to_owned(),
        ..PrometheusSource::new(&prometheus)
    };
    let (_center, collector) = center(Source::Prometheus(source)).await;
    let rounds = collector.round(Instant::now()).await;
    match &rounds[0].error {
        Some(PromqlError::Refused {
            query, error_type, ..
        }) => {
            assert!(query.contains("job=~\"(\""), "{query}");
            assert_eq!(error_type, "bad_data");
        }
        other => panic!("{other:?}"),
    }
    assert!(rounds[0].events.as_ref().unwrap().is_empty());
}
