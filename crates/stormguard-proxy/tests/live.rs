//! Live policy and the admin port: a changed policy file is swapped in by the library's watch
//! (breakers and budgets kept), and the admin port shows the version, breaker states and the
//! library's metrics.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;

use axum::http::StatusCode;
use stormguard_proxy::{PolicySource, ProxyError};

use common::*;

/// Writes `text` to `path` as editors do: a new file renamed over the old one.
fn write(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).expect("write");
    std::fs::rename(&next, path).expect("rename");
}

const ONE_ATTEMPT: &str = r#"
[endpoints."GET /*"]
retry = { max_attempts = 1 }
breaker = { count = 50, minimum_throughput = 50 }
"#;

const THREE_ATTEMPTS: &str = r#"
[endpoints."GET /*"]
idempotency = "idempotent"
retry = { max_attempts = 3 }
backoff = { kind = "fixed", base = "1ms" }
breaker = { count = 50, minimum_throughput = 50 }
"#;

#[tokio::test]
async fn a_changed_policy_file_is_swapped_in_and_shown_on_the_admin_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policies.toml");
    write(&file, ONE_ATTEMPT);
    let up = upstream().await;
    let proxy = egress_with(
        Some(up.addr),
        PolicySource::Watched(file.clone()),
        None,
        Some("127.0.0.1:0".parse().expect("addr")),
    )
    .await;
    let admin = proxy.admin_addr().expect("admin");
    let before = status(admin).await;
    assert_eq!(before["direction"], "egress");
    assert_eq!(before["policy"]["endpoints"][0]["name"], "GET /*");
    assert_eq!(before["policy"]["endpoints"][0]["breaker"], "closed");

    up.script.fail_first.store(1, Ordering::SeqCst);
    let once = send(proxy.local_addr(), get("/a")).await;
    assert_eq!(once.status, StatusCode::SERVICE_UNAVAILABLE, "one attempt");

    write(&file, THREE_ATTEMPTS);
    let old_version = before["policy"]["version"].clone();
    eventually(async || status(admin).await["policy"]["version"] != old_version).await;
    let after = status(admin).await;
    let swaps = |s: &serde_json::Value| s["policy"]["swaps"].as_u64().expect("a count");
    assert_eq!(swaps(&after), swaps(&before) + 1);

    up.script.fail_first.store(1, Ordering::SeqCst);
    let retried = send(proxy.local_addr(), get("/a")).await;
    assert_eq!(retried.status, StatusCode::OK, "the new policy retries");
    assert_eq!(up.script.count(), 3);
}

#[tokio::test]
async fn a_broken_policy_file_keeps_the_last_good_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policies.toml");
    write(&file, THREE_ATTEMPTS);
    let up = upstream().await;
    let proxy = egress_with(
        Some(up.addr),
        PolicySource::Watched(file.clone()),
        None,
        Some("127.0.0.1:0".parse().expect("addr")),
    )
    .await;
    let admin = proxy.admin_addr().expect("admin");

    write(
        &file,
        "[endpoints.\"GET /*\"]\nretry = { max_attempts = 99 }\n",
    );
    // One save may be read more than once: each read of the bad file counts.
    eventually(async || status(admin).await["policy"]["errors"].as_u64() >= Some(1)).await;

    let after = status(admin).await;
    assert!(
        after["policy"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("max_attempts")),
        "{after}"
    );
    up.script.fail_first.store(1, Ordering::SeqCst);
    let retried = send(proxy.local_addr(), get("/a")).await;
    assert_eq!(retried.status, StatusCode::OK, "still the good policy");
}

#[tokio::test]
async fn the_admin_port_serves_the_library_metrics() {
    let up = upstream().await;
    let proxy = egress_with(
        Some(up.addr),
        PolicySource::Fixed(policy(THREE_ATTEMPTS)),
        None,
        Some("127.0.0.1:0".parse().expect("addr")),
    )
    .await;
    up.script.fail_first.store(1, Ordering::SeqCst);
    assert_eq!(
        send(proxy.local_addr(), get("/m")).await.status,
        StatusCode::OK
    );

    let metrics = send(proxy.admin_addr().expect("admin"), get("/metrics")).await;

    assert_eq!(metrics.status, StatusCode::OK);
    let text = String::from_utf8(metrics.body.to_vec()).expect("text");
    assert!(text.contains("stormguard_"), "{text}");
    assert!(text.contains("stormguard_policy_version"), "{text}");
}

/// An admin port that cannot be bound fails the start, and leaves nothing serving: the proxy
/// port is refused afterwards, not answered by a proxy nobody holds. (The proxy port is a
/// port found free and closed again: another test could take it in between, which the
/// error's address check tells apart from this failure.)
#[tokio::test]
async fn an_admin_port_in_use_fails_the_start_and_nothing_is_left_serving() {
    let up = upstream().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");

    let admin = taken.local_addr().expect("addr");
    let config = stormguard_proxy::ProxyConfig {
        listen,
        ..egress_config(
            Some(up.addr),
            PolicySource::Fixed(policy(THREE_ATTEMPTS)),
            None,
            Some(admin),
        )
    };

    let started = stormguard_proxy::Proxy::start(config).await;
    assert!(
        matches!(&started, Err(ProxyError::Bind { addr, .. }) if *addr == admin),
        "the start fails on the admin port: {:?}",
        started.err()
    );
    // A blocking connect, so that no task runs in between: a loopback handshake completes
    // within the call when anything still listens on the port (an accept loop left behind
    // would only close it once polled).
    let connected = std::net::TcpStream::connect(listen);
    assert!(
        connected.is_err(),
        "nothing may serve {listen} after a failed start"
    );
}
