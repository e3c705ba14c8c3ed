//! Reload under load: eight tasks call through the stack while the watched file is rewritten
//! 1,000 times, valid and invalid in turn.
//!
//! The file is watched through the operating system, so this test runs on real time: it
//! waits for each rewrite to be seen (never for a fixed time) and asserts nothing about
//! durations.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use stormguard::policy::PolicyFile;
use tower::{Layer, ServiceExt, service_fn};

use crate::body::ReplayBody;
use crate::client::ClientLayer;

const ROUTE: &str = "GET /x";

/// Two valid policies that differ in every field a call reads, with the same breaker.
fn policy(per_try_ms: u64, attempts: u32) -> String {
    format!(
        "[endpoints.\"{ROUTE}\"]\nidempotency = \"idempotent\"\n\
         timeouts = {{ per_try = \"{per_try_ms}ms\" }}\nretry = {{ max_attempts = {attempts} }}\n\
         backoff = {{ kind = \"fixed\", base = \"0\", cap = \"0\", jitter = \"none\" }}\n\
         breaker = {{ count = 1000, minimum_throughput = 1000, failure_ratio = 1.0 }}\n"
    )
}

const INVALID: [&str; 3] = [
    "[endpoints.\"GET /x\"]\nretry = { max_attempts = 0 }\n",
    "[endpoints.\"GET /x\"]\nretry = { max_attempts = 3, typo = 1 }\n",
    "[endpoints.\"GET /x\"\nthis is not toml",
];

/// Writes `text` as tools do: a new file renamed over the old one.
fn replace(path: &Path, text: &str) {
    let temp = path.with_extension("toml.tmp");
    std::fs::write(&temp, text).expect("write");
    std::fs::rename(&temp, path).expect("rename");
}

/// Waits (polling, never a fixed time) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < give_up, "the watcher never saw: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_rewrites_under_load_fail_no_call_and_mix_no_policies() {
    let dir = std::env::temp_dir().join(format!("stormguard-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("policies.toml");
    let (a, b) = (policy(200, 3), policy(300, 4));
    replace(&path, &a);

    let layer =
        ClientLayer::from_policy_file(&PolicyFile::from_toml(&a).expect("valid")).expect("stack");
    let policies = layer.policies().clone();
    let version_a = policies.version();
    let _watcher = policies
        .watch(&path, Duration::from_millis(5))
        .expect("watch");
    let breaker = policies.breaker_of(ROUTE).expect("a breaker");

    // The downstream fails the first two attempts of each call and records the deadline each
    // attempt carried.
    let seen: Arc<Mutex<HashMap<u64, Vec<String>>>> = Arc::default();
    let downstream = {
        let seen = Arc::clone(&seen);
        service_fn(move |req: Request<ReplayBody<Full<Bytes>>>| {
            let id: u64 = req.headers()["x-call"]
                .to_str()
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX);
            let timeout = req.headers()["grpc-timeout"]
                .to_str()
                .unwrap_or("")
                .to_owned();
            let attempts = {
                let mut seen = seen.lock().expect("lock");
                let attempts = seen.entry(id).or_default();
                attempts.push(timeout);
                attempts.len()
            };
            let status = if attempts < 3 {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            };
            async move {
                Response::builder()
                    .status(status)
                    .body(Full::new(Bytes::new()))
            }
        })
    };
    let client = layer.layer(downstream);

    let stop = Arc::new(AtomicBool::new(false));
    let next_id = Arc::new(AtomicU64::new(0));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (client, stop, next_id) = (client.clone(), Arc::clone(&stop), Arc::clone(&next_id));
            tokio::spawn(async move {
                let mut calls = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let id = next_id.fetch_add(1, Ordering::Relaxed);
                    let request = Request::get("http://svc/x")
                        .header("x-call", id)
                        .body(Full::new(Bytes::new()))
                        .expect("request");
                    let response = client.clone().oneshot(request).await;
                    match response {
                        Ok(r) if r.status() == StatusCode::OK => calls += 1,
                        Ok(r) => panic!("call {id} failed: {}", r.status()),
                        Err(e) => panic!("call {id} failed: {e}"),
                    }
                    tokio::task::yield_now().await;
                }
                calls
            })
        })
        .collect();

    let mut version_b = None;
    for i in 0..1000 {
        let before = policies.status();
        if i % 2 == 1 {
            replace(&path, INVALID[(i / 2) % INVALID.len()]);
            until("an invalid file", || {
                policies.status().errors > before.errors
            })
            .await;
            let after = policies.status();
            assert_eq!(
                after.version, before.version,
                "an invalid file changed the policies"
            );
            assert!(after.last_error.is_some());
        } else {
            let (text, expected) = if i % 4 == 0 {
                (&b, version_b)
            } else {
                (&a, Some(version_a))
            };
            replace(&path, text);
            until("a valid file", || {
                let status = policies.status();
                status.swaps > before.swaps && expected.is_none_or(|v| status.version == v)
            })
            .await;
            if i % 4 == 0 {
                version_b = Some(policies.version());
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut calls = 0;
    for caller in callers {
        calls += caller.await.expect("no caller panicked");
    }

    let status = policies.status();
    assert!(status.errors >= 500, "{status:?}");
    assert!(status.swaps >= 500, "{status:?}");
    assert_ne!(Some(version_a), version_b);
    assert!(
        Arc::ptr_eq(&breaker, &policies.breaker_of(ROUTE).expect("a breaker")),
        "the breaker was rebuilt though its configuration never changed"
    );
    // Every call ran three attempts under one policy: the same per-try deadline on each.
    let seen = seen.lock().expect("lock");
    assert!(calls > 0 && seen.len() as u64 >= calls);
    let policy_deadlines = ["200m", "300m", "200000u", "300000u"];
    for (id, attempts) in seen.iter() {
        assert_eq!(attempts.len(), 3, "call {id}: {attempts:?}");
        assert!(
            attempts.iter().all(|t| t == &attempts[0]),
            "call {id} mixed two policies: {attempts:?}"
        );
        assert!(
            policy_deadlines.contains(&attempts[0].as_str()),
            "call {id}: {attempts:?}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
