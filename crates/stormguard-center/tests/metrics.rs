//! `/metrics`: watchers, versions, publish-to-ACK latency, NACKs and auth failures, in the
//! Prometheus text format (one recorder per process, so one test in this binary).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use serde_json::json;
use stormguard::policy::PolicyFile;
use stormguard_center::{Center, CenterConfig, Role, Store};
use stormguard_tower::client::{CenterWatch, CenterWatchConfig, ClientLayer};
use tokio::time::timeout;

fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(name) && !line.starts_with('#'))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_watchers_versions_acks_nacks_and_auth_failures() {
    let handle = PrometheusBuilder::new().install_recorder().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("sqlite://{}", dir.path().join("c.db").display()))
        .await
        .unwrap();
    let config = CenterConfig {
        metrics: Some(handle),
        ..CenterConfig::default()
    };
    let center = Center::new(store, config).await.unwrap();
    let editor = center
        .create_token("alice", Role::Editor, None)
        .await
        .unwrap();
    let instance = center
        .create_token("pay-instances", Role::Instance, Some("pay"))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(center.clone().serve(listener, std::future::pending()));
    let http = reqwest::Client::new();
    let post = |path: &str, token: &str, body: serde_json::Value| {
        http.post(format!("{base}{path}"))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };

    let policy = "[endpoints.default]\nretry = { max_attempts = 3 }\n";
    let published = post(
        "/v1/services/pay/versions",
        &editor,
        json!({"base": 0, "policy": policy}),
    )
    .await
    .unwrap();
    assert_eq!(published.status(), 201);
    let layer = ClientLayer::from_policy_file(&PolicyFile::from_toml(policy).unwrap()).unwrap();
    let watch = CenterWatch::start(
        layer.policies(),
        CenterWatchConfig::new(&base, "pay", "pay-1", &instance),
    )
    .unwrap();
    timeout(
        Duration::from_secs(30),
        watch.wait_for(|s| s.applied == Some(1)),
    )
    .await
    .unwrap();
    let nack = json!({"instance": "pay-2", "version": 1, "applied": false, "reason": "no"});
    assert_eq!(
        post("/v1/services/pay/acks", &instance, nack)
            .await
            .unwrap()
            .status(),
        204
    );
    assert_eq!(
        http.get(format!("{base}/v1/audit"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );

    let metrics = || async {
        http.get(format!("{base}/metrics"))
            .bearer_auth(&editor)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    // The ACK of pay-1 arrives after it applied the version: wait for its count.
    let text = timeout(Duration::from_secs(30), async {
        loop {
            let text = metrics().await;
            if value(&text, "stormguard_center_publish_to_ack_seconds_count") == Some(1.0) {
                return text;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the ACK was never counted");
    assert_eq!(
        value(&text, "stormguard_center_watchers"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(value(&text, "stormguard_center_versions_total"), Some(1.0));
    assert_eq!(value(&text, "stormguard_center_nacks_total"), Some(1.0));
    assert_eq!(
        value(
            &text,
            "stormguard_center_auth_failures_total{reason=\"missing\"}"
        ),
        Some(1.0)
    );
    drop(watch);
}
