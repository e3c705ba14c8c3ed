//! `stormguard center` collects the numbers its rules read: with `--scrape`, the real
//! binary (a child process) scrapes a test instance's `/metrics` on 127.0.0.1 every
//! `--collect-interval` and its rule fires, publishing a version by `rule:cdn-504`; bad
//! collection flags are usage errors (exit 2) named before anything opens the store.
//!
//! Real time: the child's collector runs on its own clock, so the test waits (bounded, on
//! the condition) for the version to appear.
#![allow(clippy::unwrap_used)]

#[path = "support/run.rs"]
mod run;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use run::{stderr, stormguard, temp_path};
use serde_json::{Value, json};

const ADMIN: &str = "sg_center_collect_test_admin_0123456789";

#[test]
fn bad_collection_flags_are_usage_errors() {
    for (args, what) in [
        (vec!["--collect-interval", "0s"], "--collect-interval"),
        (vec!["--scrape", "web"], "expected SERVICE=INSTANCE=URL"),
        (
            vec!["--scrape", "web=a=ftp://h/metrics"],
            "not http or https",
        ),
        (vec!["--prometheus", "nowhere"], "--prometheus"),
        (
            vec![
                "--prometheus",
                "http://h:9090",
                "--scrape",
                "web=a=http://h/m",
            ],
            "choose one source",
        ),
    ] {
        let database = temp_path("center-collect", "never.db");
        let url = format!("sqlite://{}", database.display());
        let mut all = vec!["center", "--database-url", &url, "--admin-token", ADMIN];
        all.extend(args.iter().copied());
        let out = stormguard(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(what), "{args:?}: {}", stderr(&out));
        assert!(!database.exists(), "{args:?} opened the store");
    }
}

/// The center child process; killed when dropped.
struct CenterProcess(Child);

impl Drop for CenterProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_center_scrapes_an_instance_and_its_rule_fires() {
    // The instance: every scrape shows ten more calls, all answered 504.
    let scrapes = Arc::new(AtomicU64::new(0));
    let counted = scrapes.clone();
    let router = Router::new().route(
        "/metrics",
        get(move || {
            let n = 10 * counted.fetch_add(1, Ordering::SeqCst);
            async move {
                format!(
                    "stormguard_requests_total{{endpoint=\"default\",outcome=\"attempts_exhausted\"}} {n}\n\
                     stormguard_responses_total{{endpoint=\"default\",code=\"504\"}} {n}\n"
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let instance = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });

    let database = temp_path("center-collect", "center.db");
    let _ = std::fs::remove_file(&database);
    let log = std::fs::File::create(temp_path("center-collect", "center.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stormguard"))
        .args(["center", "--listen", "127.0.0.1:0", "--admin-token", ADMIN])
        .args([
            "--database-url",
            &format!("sqlite://{}", database.display()),
        ])
        .args(["--collect-interval", "100ms"])
        .args(["--scrape", &format!("web=web-1=http://{instance}/metrics")])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _center = CenterProcess(child);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    let announced: Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("the center did not announce its address ({e}): {line:?}"));
    let base = format!("http://{}", announced["listen"].as_str().unwrap());

    let client = reqwest::Client::new();
    let send = |method: &str, path: &str, body: Value| {
        client
            .request(method.parse().unwrap(), format!("{base}{path}"))
            .bearer_auth(ADMIN)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let published = send(
        "POST",
        "/v1/services/web/versions",
        json!({ "base": 0, "policy": "[endpoints.default]\nretry = { max_attempts = 3 }\n" }),
    )
    .await
    .unwrap();
    assert_eq!(published.status(), 201);
    let rule = json!({
        "name": "cdn-504",
        "service": "web",
        "endpoint": "default",
        "when": { "series": "error_ratio", "code": 504, "above": 0.5, "exit_below": 0.1 },
        "actions": [{ "set": "attempts", "max_attempts": 1 }]
    });
    let put = send("PUT", "/v1/services/web/rules/cdn-504", rule)
        .await
        .unwrap();
    assert_eq!(put.status(), 204);

    let fired = tokio::time::timeout(Duration::from_secs(60), async {
        let mut ticks = tokio::time::interval(Duration::from_millis(50));
        loop {
            ticks.tick().await;
            let answer = client
                .get(format!("{base}/v1/services/web/versions/2"))
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap();
            if answer.status() == 200 {
                return serde_json::from_str::<Value>(&answer.text().await.unwrap()).unwrap();
            }
        }
    })
    .await
    .expect("no firing within 60 s");
    assert_eq!(fired["author"], "rule:cdn-504", "{fired}");
    assert!(
        fired["policy"]
            .as_str()
            .unwrap()
            .contains("max_attempts = 1"),
        "{fired}"
    );
    assert!(scrapes.load(Ordering::SeqCst) >= 2);
}
