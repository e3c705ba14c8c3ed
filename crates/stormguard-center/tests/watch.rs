//! Instances following the center: the one-stack client fed by `CenterWatch` end to end,
//! a NACK, a start from the last-good copy with the center down, a center restart, a canary.
//!
//! Real servers on 127.0.0.1 and real time: each test waits for what it needs to see (a
//! version applied, an ACK in the status), never for a fixed time, and asserts nothing
//! about durations. Reconnects use a 1–10 ms backoff so a restart is quick.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::policy::PolicyFile;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::{CenterState, CenterWatch, CenterWatchConfig, ClientLayer};
use support::{TestCenter, attempts, client_stack};
use tokio::time::timeout;
use tower::{Layer, ServiceExt};

const GIVE_UP: Duration = Duration::from_secs(30);

fn quick_backoff() -> Backoff {
    Backoff::exponential(Duration::from_millis(1))
        .with_cap(Duration::from_millis(10))
        .with_jitter(Jitter::Full)
}

async fn applied(watch: &CenterWatch, version: u64) -> CenterState {
    timeout(GIVE_UP, watch.wait_for(|s| s.applied == Some(version)))
        .await
        .unwrap_or_else(|_| panic!("version {version} never applied: {:?}", watch.state()))
}

/// Waits until the center's status shows `instance` acknowledged `version` (ACK or NACK).
async fn acknowledged(
    center: &TestCenter,
    service: &str,
    instance: &str,
    version: u64,
) -> serde_json::Value {
    let viewer = center.api(&center.viewer);
    timeout(GIVE_UP, async {
        loop {
            let (_, status) = viewer.get(&format!("/v1/services/{service}/status")).await;
            let found = status["instances"]
                .as_array()
                .and_then(|all| {
                    all.iter()
                        .find(|i| i["instance"] == instance && i["version"] == version)
                })
                .cloned();
            if let Some(found) = found {
                return found;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the acknowledgement never reached the center")
}

/// Retries on 503 with no backoff, and a breaker that opens at six failures of six calls.
fn policy(max_attempts: u32) -> String {
    format!(
        "[endpoints.default]\n\
         retry = {{ max_attempts = {max_attempts} }}\n\
         backoff = {{ kind = \"fixed\", base = \"0\", cap = \"0\", jitter = \"none\" }}\n\
         breaker = {{ count = 100, minimum_throughput = 6, failure_ratio = 0.5, open = \"1h\" }}\n"
    )
}

type Stack = stormguard_tower::client::Client<Client<HttpConnector, ReplayBody<Full<Bytes>>>>;

#[derive(Clone)]
struct Frontend {
    client: Stack,
    inventory: String,
}

async fn order(State(app): State<Frontend>) -> StatusCode {
    let request = http::Request::get(&app.inventory)
        .body(Full::new(Bytes::new()))
        .expect("request");
    match app.client.oneshot(request).await {
        Ok(response) => response.status(),
        Err(_) => StatusCode::BAD_GATEWAY,
    }
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_change_is_in_effect_for_the_next_request_with_the_breaker_carried_over() {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    assert_eq!(editor.publish("orders", 0, &policy(4)).await.0, 201);

    // The inventory always fails; it counts the calls that reach it.
    let calls = Arc::new(AtomicU64::new(0));
    let inventory = serve(
        Router::new().route(
            "/inventory",
            get(|State(calls): State<Arc<AtomicU64>>| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                StatusCode::SERVICE_UNAVAILABLE
            })
            .with_state(Arc::clone(&calls)),
        ),
    )
    .await;

    // The orders service: one client stack, its policies fed by the center.
    let layer = client_stack(2);
    let config = CenterWatchConfig::new(
        &center.url(),
        "orders",
        "orders-1",
        &center.instance_token("orders").await,
    )
    .with_backoff(quick_backoff())
    .with_seed(1);
    let watch = CenterWatch::start(layer.policies(), config).unwrap();
    applied(&watch, 1).await;
    let frontend = serve(
        Router::new()
            .route("/order", get(order))
            .with_state(Frontend {
                client: layer.layer(Client::builder(TokioExecutor::new()).build_http()),
                inventory: format!("{inventory}/inventory"),
            }),
    )
    .await;
    let http = reqwest::Client::new();
    let order = || async {
        http.get(format!("{frontend}/order"))
            .send()
            .await
            .unwrap()
            .status()
    };

    // Version 1: four attempts (three retries) per request.
    assert_eq!(order().await, 503);
    assert_eq!(calls.load(Ordering::SeqCst), 4);

    // Version 2: one attempt, the same breaker (which has seen four failures).
    assert_eq!(editor.publish("orders", 1, &policy(1)).await.0, 201);
    applied(&watch, 2).await;
    assert_eq!(
        acknowledged(&center, "orders", "orders-1", 2).await["applied"],
        true
    );
    assert_eq!(order().await, 503);
    assert_eq!(calls.load(Ordering::SeqCst), 5, "no retry under version 2");
    assert_eq!(order().await, 503);
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    // Six failures of six calls: the breaker, carried over the swap, is open now.
    order().await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        6,
        "the breaker kept its failures across the swap and refuses"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_the_instance_refuses_is_nacked_and_shown_in_status_and_audit() {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    editor.publish("orders", 0, &attempts(3)).await;
    // A stack of one endpoint, "inventory": a version without it (nor a default) is refused.
    let layer = ClientLayer::named(
        "inventory",
        PolicyFile::from_toml(&attempts(2))
            .unwrap()
            .endpoint("default")
            .unwrap()
            .clone(),
    )
    .unwrap();
    let config = CenterWatchConfig::new(
        &center.url(),
        "orders",
        "orders-1",
        &center.instance_token("orders").await,
    )
    .with_backoff(quick_backoff());
    let watch = CenterWatch::start(layer.policies(), config).unwrap();
    applied(&watch, 1).await;
    let before = layer.policies().version();
    editor
        .publish(
            "orders",
            1,
            "[endpoints.\"GET /other\"]\nretry = { max_attempts = 2 }\n",
        )
        .await;
    let status = acknowledged(&center, "orders", "orders-1", 2).await;
    assert_eq!(status["applied"], false);
    assert!(
        status["reason"].as_str().unwrap().contains("inventory"),
        "{status}"
    );
    assert_eq!(
        layer.policies().version(),
        before,
        "the refused version is not in use"
    );
    assert_eq!(watch.state().applied, Some(1));
    let (_, audit) = center
        .api(&center.viewer)
        .get("/v1/audit?service=orders&limit=1")
        .await;
    assert_eq!(
        (&audit[0]["action"], &audit[0]["version"]),
        (&json!("nack"), &json!(2))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_cannot_reach_the_center_starts_from_its_last_good_copy() {
    let dir = tempfile::tempdir().unwrap();
    let last_good = dir.path().join("orders.last-good.json");
    let mut center = TestCenter::sqlite().await;
    center
        .api(&center.editor)
        .publish("orders", 0, &attempts(5))
        .await;
    let token = center.instance_token("orders").await;
    let config = CenterWatchConfig::new(&center.url(), "orders", "orders-1", &token)
        .with_backoff(quick_backoff())
        .with_last_good(&last_good);
    {
        let layer = client_stack(2);
        let watch = CenterWatch::start(layer.policies(), config.clone()).unwrap();
        applied(&watch, 1).await;
    }
    center.stop().await;
    // A new process: the center is down, the stack starts from the last good version.
    let layer = client_stack(2);
    let watch = CenterWatch::start(layer.policies(), config).unwrap();
    let state = applied(&watch, 1).await;
    assert!(!state.connected);
    let in_use = layer.policies().current();
    assert_eq!(
        in_use.endpoint("default").unwrap().retry().max_attempts(),
        5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_reconnect_after_a_center_restart_and_resume_from_their_version() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("center.db").display());
    let mut center = TestCenter::on(&url, None).await;
    let addr = center.addr;
    center
        .api(&center.editor)
        .publish("orders", 0, &attempts(3))
        .await;
    let token = center.instance_token("orders").await;
    let layers: Vec<_> = (0..20).map(|_| client_stack(2)).collect();
    let watches: Vec<_> = layers
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let config =
                CenterWatchConfig::new(&center.url(), "orders", &format!("orders-{i}"), &token)
                    .with_backoff(quick_backoff())
                    .with_seed(i as u64);
            CenterWatch::start(layer.policies(), config).unwrap()
        })
        .collect();
    for watch in &watches {
        applied(watch, 1).await;
    }
    center.stop().await;
    for watch in &watches {
        timeout(GIVE_UP, watch.wait_for(|s| !s.connected))
            .await
            .expect("disconnected");
    }
    // The same database and port: the restarted center.
    let center = TestCenter::on(&url, Some(addr)).await;
    for watch in &watches {
        timeout(
            GIVE_UP,
            watch.wait_for(|s| s.connected && s.connections >= 2),
        )
        .await
        .expect("reconnected");
    }
    let (status, _) = center
        .api(&center.editor)
        .publish("orders", 1, &attempts(1))
        .await;
    assert_eq!(status, 201);
    for watch in &watches {
        applied(watch, 2).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_reaches_the_selected_instances_until_promoted_or_aborted() {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    editor.publish("orders", 0, &attempts(3)).await;
    let token = center.instance_token("orders").await;
    let zones = ["a", "b", "a", "b"];
    let layers: Vec<_> = zones.iter().map(|_| client_stack(2)).collect();
    let watches: Vec<_> = layers
        .iter()
        .zip(zones)
        .enumerate()
        .map(|(i, (layer, zone))| {
            let labels = BTreeMap::from([("zone".to_owned(), zone.to_owned())]);
            let config =
                CenterWatchConfig::new(&center.url(), "orders", &format!("orders-{i}"), &token)
                    .with_backoff(quick_backoff())
                    .with_labels(labels);
            CenterWatch::start(layer.policies(), config).unwrap()
        })
        .collect();
    for watch in &watches {
        applied(watch, 1).await;
    }
    let (status, body) = editor
        .post(
            "/v1/services/orders/versions",
            json!({ "base": 1, "policy": attempts(1), "canary": { "labels": { "zone": "a" } } }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    applied(&watches[0], 2).await;
    applied(&watches[2], 2).await;
    acknowledged(&center, "orders", "orders-2", 2).await;
    let (_, status) = center
        .api(&center.viewer)
        .get("/v1/services/orders/status")
        .await;
    assert_eq!(status["stable"], 1);
    assert_eq!(status["canary"][0], 2);
    let targets: Vec<_> = status["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["target"].as_u64().unwrap())
        .collect();
    assert_eq!(targets, [2, 1, 2, 1]);
    assert_eq!(watches[1].state().applied, Some(1));

    // Abort: the canary instances go back to the stable version.
    assert_eq!(
        editor
            .post("/v1/services/orders/canary/abort", json!({}))
            .await
            .0,
        204
    );
    applied(&watches[0], 1).await;
    applied(&watches[2], 1).await;
    // A new canary, promoted: every instance runs it.
    editor
        .post(
            "/v1/services/orders/versions",
            json!({ "base": 2, "policy": attempts(4), "canary": { "share": 50 } }),
        )
        .await;
    // A step meant for the canary an editor saw (v2, aborted) does not touch the new one.
    let (status, body) = editor
        .post("/v1/services/orders/canary/promote", json!({"version": 2}))
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains("v3 now, not v2"), "{body}");
    assert_eq!(
        editor
            .post(
                "/v1/services/orders/canary/promote",
                json!({"message": "good", "version": 3})
            )
            .await
            .0,
        204
    );
    for watch in &watches {
        applied(watch, 3).await;
    }
    assert_eq!(
        editor
            .post("/v1/services/orders/canary/promote", json!({}))
            .await
            .0,
        404
    );
    let (_, audit) = center
        .api(&center.viewer)
        .get("/v1/audit?service=orders")
        .await;
    let steps: Vec<_> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .filter(|a| a.starts_with("canary") || *a == "publish")
        .map(str::to_owned)
        .collect();
    assert_eq!(
        steps,
        [
            "canary-promote",
            "canary",
            "canary-abort",
            "canary",
            "publish"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_new_watchers_is_admitted_a_few_at_a_time_and_all_get_in() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("center.db").display());
    let config = stormguard_center::CenterConfig {
        watch_admissions: 1,
        ..stormguard_center::CenterConfig::default()
    };
    let center = TestCenter::with_config(&url, None, config).await;
    center
        .api(&center.editor)
        .publish("orders", 0, &attempts(3))
        .await;
    let token = center.instance_token("orders").await;
    let layers: Vec<_> = (0..50).map(|_| client_stack(2)).collect();
    let watches: Vec<_> = layers
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let config =
                CenterWatchConfig::new(&center.url(), "orders", &format!("orders-{i}"), &token)
                    .with_backoff(quick_backoff())
                    .with_seed(i as u64);
            CenterWatch::start(layer.policies(), config).unwrap()
        })
        .collect();
    for watch in &watches {
        applied(watch, 1).await;
    }
}
