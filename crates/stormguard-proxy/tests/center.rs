//! An egress proxy following a real policy center (in-process, on a SQLite file, on
//! 127.0.0.1): a published version takes effect for the next request, through the same swap
//! as a file reload, and the admin port shows the version applied.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use http_body_util::{BodyExt, Full};
use stormguard::backoff::{Backoff, Jitter};
use stormguard_center::{Center, CenterConfig, Role, Store};
use stormguard_proxy::{CenterSource, CenterWatchConfig, PolicySource};

use common::*;

const ONE_ATTEMPT: &str = "[endpoints.\"GET /*\"]\nretry = { max_attempts = 1 }\n";
const THREE_ATTEMPTS: &str = "[endpoints.\"GET /*\"]\nretry = { max_attempts = 3 }\n\
                              backoff = { kind = \"fixed\", base = \"1ms\" }\n";

/// Publishes `policy` for `service` on top of version `base`; the center's status code.
async fn publish(center: &str, token: &str, service: &str, base: u64, policy: &str) -> u16 {
    let body = serde_json::json!({ "base": base, "policy": policy, "message": "test" });
    let request = http::Request::post(format!("{center}/v1/services/{service}/versions"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let response = client().request(request).await.expect("the center answers");
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    status
}

#[tokio::test]
async fn a_version_published_at_the_center_takes_effect_and_shows_on_the_admin_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("center.db").display());
    let center = Center::new(
        Store::open(&url).await.expect("store"),
        CenterConfig::default(),
    )
    .await
    .expect("center");
    let editor = center
        .create_token("alice", Role::Editor, None)
        .await
        .expect("token");
    let instance = center
        .create_token("orders-proxies", Role::Instance, Some("orders"))
        .await
        .expect("token");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let center_url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(center.clone().serve(listener, std::future::pending()));
    assert_eq!(
        publish(&center_url, &editor, "orders", 0, ONE_ATTEMPT).await,
        201
    );

    let up = upstream().await;
    let watch = CenterWatchConfig::new(&center_url, "orders", "orders-proxy-1", &instance)
        .with_backoff(
            Backoff::exponential(Duration::from_millis(1))
                .with_cap(Duration::from_millis(10))
                .with_jitter(Jitter::Full),
        )
        .with_last_good(dir.path().join("last-good.json"))
        .with_seed(1);
    let proxy = egress_with(
        Some(up.addr),
        PolicySource::Center(Box::new(CenterSource {
            watch,
            initial: None,
        })),
        None,
        Some("127.0.0.1:0".parse().expect("addr")),
    )
    .await;
    let following = proxy.center().expect("a center watch");
    let applied = |version: u64| {
        tokio::time::timeout(
            Duration::from_secs(30),
            following.wait_for(move |s| s.applied == Some(version)),
        )
    };
    applied(1).await.expect("version 1 applied");

    up.script.fail_first.store(1, Ordering::SeqCst);
    let once = send(proxy.local_addr(), get("/a")).await;
    assert_eq!(
        once.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "version 1: one attempt"
    );

    assert_eq!(
        publish(&center_url, &editor, "orders", 1, THREE_ATTEMPTS).await,
        201
    );
    applied(2).await.expect("version 2 applied");

    up.script.fail_first.store(1, Ordering::SeqCst);
    let retried = send(proxy.local_addr(), get("/a")).await;
    assert_eq!(retried.status, StatusCode::OK, "version 2 retries");
    assert_eq!(up.script.count(), 3);
    let status = status(proxy.admin_addr().expect("admin")).await;
    assert_eq!(status["center"]["applied"], 2, "{status}");
    assert_eq!(status["center"]["connected"], true, "{status}");
    assert_eq!(
        status["policy"]["endpoints"][0]["name"], "GET /*",
        "{status}"
    );
}
