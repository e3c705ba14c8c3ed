//! `stormguard center` killed with SIGKILL in the middle of publishes, then started again on
//! the same store: no half version is visible (every version complete, its hash its
//! content's, the release pointing at an existing version, an audit record for each), every
//! publish that was answered 201 is there, and the instances that followed the center kept
//! their last good policy while it was gone and resume when it is back.
//!
//! The center is the real binary, a child process; the kill comes while at least three
//! publishes are on the wire (waited for, not timed). Real time, bounded waits on conditions.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use stormguard::backoff::{Backoff, Jitter};
use stormguard::policy::PolicyFile;
use stormguard_center::content_hash;
use stormguard_tower::client::{CenterWatch, CenterWatchConfig, ClientLayer};
use tokio::time::timeout;

const ADMIN: &str = "sg_center_kill_test_admin_0123456789";
const GIVE_UP: Duration = Duration::from_secs(60);
const SERVICES: [&str; 5] = ["orders", "s1", "s2", "s3", "s4"];

/// The policy of version `v` of any service: 1 to 4 attempts, so each version's content
/// is known from its number.
fn policy(version: u64) -> String {
    format!(
        "[endpoints.default]\nretry = {{ max_attempts = {} }}\n",
        expected_attempts(version)
    )
}

fn expected_attempts(version: u64) -> u32 {
    1 + (version % 4) as u32
}

/// The center child process; killed when dropped (a failing test leaves none behind).
struct CenterProcess(Child);

impl CenterProcess {
    /// Starts a center on `port` (0: any free one) and returns it with the port it bound,
    /// read from the address it prints first (no port picked here and bound there later).
    fn spawn(database_url: &str, port: u16, log: &std::path::Path) -> (CenterProcess, u16) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_stormguard"))
            .args(["center", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--database-url", database_url, "--admin-token", ADMIN])
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("the center starts");
        let stdout = child.stdout.take().expect("piped");
        let center = CenterProcess(child);
        // A child that dies before it binds closes its stdout: the read ends either way.
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        let announced: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the center did not announce its address ({e}): {line:?}"));
        let bound: std::net::SocketAddr = announced["listen"].as_str().unwrap().parse().unwrap();
        (center, bound.port())
    }

    /// SIGKILL, and wait until the process is gone.
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for CenterProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Api {
    base: String,
    client: reqwest::Client,
}

impl Api {
    async fn send(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .client
            .request(method.parse().unwrap(), format!("{}{path}", self.base))
            .bearer_auth(token)
            .timeout(Duration::from_secs(30));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let bytes = response.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// Waits (bounded) until the center answers `/healthz`.
    async fn healthy(&self) {
        timeout(GIVE_UP, async {
            loop {
                let answer = self
                    .client
                    .get(format!("{}/healthz", self.base))
                    .send()
                    .await;
                if answer.is_ok_and(|r| r.status() == 200) {
                    return;
                }
                // The child process is starting: ask again shortly.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the center never answered /healthz");
    }

    async fn token(&self, name: &str, role: &str, service: Option<&str>) -> String {
        let (status, body) = self
            .send(
                "POST",
                "/v1/tokens",
                ADMIN,
                Some(json!({ "name": name, "role": role, "service": service })),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body["token"].as_str().unwrap().to_owned()
    }
}

/// What the publishers saw.
#[derive(Default)]
struct Tally {
    accepted: AtomicUsize,
    in_flight: AtomicUsize,
    /// (service, version) → hash of every 201.
    versions: Mutex<BTreeMap<(String, u64), String>>,
    /// Any answer but 201 and 409.
    unexpected: Mutex<Vec<String>>,
    /// Signalled when a publish starts or is accepted.
    changed: tokio::sync::Notify,
}

/// Publishes on `service` until the center is gone: on 409 it reads the latest version and
/// publishes on that.
async fn publisher(base: String, editor: String, service: &'static str, tally: Arc<Tally>) {
    let client = reqwest::Client::new();
    let mut latest = 1u64;
    loop {
        let version = latest + 1;
        let body = json!({ "base": latest, "policy": policy(version), "message": "storm" });
        tally.in_flight.fetch_add(1, Ordering::SeqCst);
        tally.changed.notify_waiters();
        let answer = async {
            let response = client
                .post(format!("{base}/v1/services/{service}/versions"))
                .bearer_auth(&editor)
                .header("content-type", "application/json")
                .body(body.to_string())
                .timeout(Duration::from_secs(30))
                .send()
                .await?;
            let status = response.status().as_u16();
            Ok::<_, reqwest::Error>((status, response.bytes().await?))
        }
        .await;
        tally.in_flight.fetch_sub(1, Ordering::SeqCst);
        let Ok((status, bytes)) = answer else {
            return; // the center is gone
        };
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        match status {
            201 => {
                latest = body["version"].as_u64().unwrap();
                let hash = body["hash"].as_str().unwrap().to_owned();
                tally
                    .versions
                    .lock()
                    .unwrap()
                    .insert((service.to_owned(), latest), hash);
                tally.accepted.fetch_add(1, Ordering::SeqCst);
                tally.changed.notify_waiters();
            }
            409 => {
                let history = client
                    .get(format!("{base}/v1/services/{service}/versions?limit=1"))
                    .bearer_auth(&editor)
                    .send()
                    .await;
                let Ok(history) = history else { return };
                let Ok(bytes) = history.bytes().await else {
                    return;
                };
                let history: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                match history[0]["version"].as_u64() {
                    Some(v) => latest = v,
                    None => return,
                }
            }
            other => tally
                .unexpected
                .lock()
                .unwrap()
                .push(format!("{service}: {other} {body}")),
        }
    }
}

fn max_attempts(layer: &ClientLayer) -> u32 {
    layer
        .policies()
        .current()
        .endpoint("default")
        .unwrap()
        .retry()
        .max_attempts()
}

async fn killed_in_the_middle_of_publishes(database_url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("center.log");
    let (mut center, port) = CenterProcess::spawn(database_url, 0, &log);
    let api = Api {
        base: format!("http://127.0.0.1:{port}"),
        client: reqwest::Client::new(),
    };
    api.healthy().await;
    let editor = api.token("editor", "editor", None).await;
    let instance = api.token("orders-fleet", "instance", Some("orders")).await;
    for service in SERVICES {
        let body = json!({ "base": 0, "policy": policy(1) });
        let path = format!("/v1/services/{service}/versions");
        assert_eq!(api.send("POST", &path, &editor, Some(body)).await.0, 201);
    }

    // Four instances follow "orders", each with a last-good file.
    let layers: Vec<ClientLayer> = (0..4)
        .map(|_| {
            ClientLayer::from_policy_file(&PolicyFile::from_toml(&policy(0)).unwrap()).unwrap()
        })
        .collect();
    let watches: Vec<CenterWatch> = layers
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let config =
                CenterWatchConfig::new(&api.base, "orders", &format!("orders-{i}"), &instance)
                    .with_last_good(dir.path().join(format!("orders-{i}.json")))
                    .with_backoff(
                        Backoff::exponential(Duration::from_millis(5))
                            .with_cap(Duration::from_millis(50))
                            .with_jitter(Jitter::Full),
                    )
                    .with_seed(i as u64);
            CenterWatch::start(layer.policies(), config).unwrap()
        })
        .collect();
    for watch in &watches {
        timeout(GIVE_UP, watch.wait_for(|s| s.applied == Some(1)))
            .await
            .expect("version 1 applied");
    }

    // Seven publishers: three racing on "orders" (compare-and-set conflicts), one on each
    // other service. SIGKILL once 30 publishes are in and at least 3 are on the wire.
    let tally = Arc::new(Tally::default());
    let publishers: Vec<_> = ["orders", "orders", "orders", "s1", "s2", "s3", "s4"]
        .into_iter()
        .map(|service| {
            tokio::spawn(publisher(
                api.base.clone(),
                editor.clone(),
                service,
                Arc::clone(&tally),
            ))
        })
        .collect();
    let in_flight = timeout(GIVE_UP, async {
        loop {
            // Registered before the check: a change between the two is not missed.
            let changed = tally.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let in_flight = tally.in_flight.load(Ordering::SeqCst);
            if tally.accepted.load(Ordering::SeqCst) >= 30 && in_flight >= 3 {
                return in_flight;
            }
            changed.await;
        }
    })
    .await
    .expect("the publishers never got going");
    center.kill();
    for publisher in publishers {
        publisher.await.unwrap();
    }
    let _ = writeln!(
        std::io::stderr(),
        "killed with {in_flight} publishes in flight, {} accepted",
        tally.accepted.load(Ordering::SeqCst)
    );
    assert!(
        tally.unexpected.lock().unwrap().is_empty(),
        "{:?}",
        tally.unexpected
    );

    // The instances keep the last version they applied, in use and on disk.
    let mut kept = Vec::new();
    for ((watch, layer), i) in watches.iter().zip(&layers).zip(0..) {
        let state = timeout(GIVE_UP, watch.wait_for(|s| !s.connected))
            .await
            .expect("the stream ended with the center");
        let version = state.applied.unwrap();
        assert_eq!(max_attempts(layer), expected_attempts(version), "{state:?}");
        let file = std::fs::read_to_string(dir.path().join(format!("orders-{i}.json"))).unwrap();
        let file: Value = serde_json::from_str(&file).unwrap();
        assert_eq!(file["version"], version);
        kept.push(version);
    }

    // Started again on the same store and port.
    let (mut center, again) = CenterProcess::spawn(database_url, port, &log);
    assert_eq!(again, port);
    api.healthy().await;
    let accepted = tally.versions.lock().unwrap().clone();
    let mut latest = BTreeMap::new();
    for service in SERVICES {
        let (status, history) = api
            .send(
                "GET",
                &format!("/v1/services/{service}/versions?limit=1000"),
                &editor,
                None,
            )
            .await;
        assert_eq!(status, 200);
        let history = history.as_array().unwrap();
        let count = history.len() as u64;
        let numbers: Vec<u64> = history
            .iter()
            .map(|v| v["version"].as_u64().unwrap())
            .collect();
        assert_eq!(
            numbers,
            (1..=count).rev().collect::<Vec<_>>(),
            "{service}: gaps"
        );
        for version in history {
            let number = version["version"].as_u64().unwrap();
            let text = version["policy"].as_str().unwrap();
            assert_eq!(
                version["hash"].as_str().unwrap(),
                content_hash(text),
                "{service} v{number}"
            );
            let file = PolicyFile::from_toml(text).unwrap();
            assert_eq!(
                file.endpoint("default").unwrap().retry().max_attempts(),
                expected_attempts(number),
                "{service} v{number} holds another version's policy"
            );
        }
        let (_, status) = api
            .send(
                "GET",
                &format!("/v1/services/{service}/status"),
                &editor,
                None,
            )
            .await;
        assert_eq!(
            status["stable"], count,
            "{service}: the release points at the latest"
        );
        let (_, audit) = api
            .send(
                "GET",
                &format!("/v1/audit?service={service}&limit=10000"),
                &editor,
                None,
            )
            .await;
        let audited: BTreeSet<u64> = audit
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["action"] == "publish")
            .map(|r| r["version"].as_u64().unwrap())
            .collect();
        assert_eq!(
            audited,
            (1..=count).collect(),
            "{service}: one audit record per version"
        );
        for ((accepted_service, number), hash) in &accepted {
            if accepted_service == service {
                assert!(
                    *number <= count,
                    "{service} v{number} was answered 201 and is gone"
                );
                assert_eq!(history[(count - number) as usize]["hash"], json!(hash));
            }
        }
        latest.insert(service, count);
    }
    for (version, service) in kept.iter().zip(std::iter::repeat("orders")) {
        assert!(*version <= latest[service]);
    }

    // The instances come back on their own and catch up, then follow the next publish.
    let orders = latest["orders"];
    for watch in &watches {
        timeout(
            GIVE_UP,
            watch.wait_for(|s| s.connected && s.connections >= 2 && s.applied == Some(orders)),
        )
        .await
        .unwrap_or_else(|_| panic!("never resumed: {:?}", watch.state()));
    }
    let body = json!({ "base": orders, "policy": policy(orders + 1) });
    let (status, _) = api
        .send("POST", "/v1/services/orders/versions", &editor, Some(body))
        .await;
    assert_eq!(status, 201);
    for (watch, layer) in watches.iter().zip(&layers) {
        timeout(GIVE_UP, watch.wait_for(|s| s.applied == Some(orders + 1)))
            .await
            .expect("the next version applied");
        assert_eq!(max_attempts(layer), expected_attempts(orders + 1));
    }
    center.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_center_killed_in_the_middle_of_publishes_on_sqlite_leaves_no_half_version() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("center.db").display());
    killed_in_the_middle_of_publishes(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_center_killed_in_the_middle_of_publishes_on_postgres_leaves_no_half_version() {
    let url = match std::env::var("STORMGUARD_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            assert!(
                std::env::var("STORMGUARD_REQUIRE_ALL_STORES").as_deref() != Ok("1"),
                "STORMGUARD_TEST_POSTGRES_URL is not set but STORMGUARD_REQUIRE_ALL_STORES=1"
            );
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: center kill -9 on PostgreSQL: STORMGUARD_TEST_POSTGRES_URL not set"
            );
            return;
        }
    };
    killed_in_the_middle_of_publishes(&postgres_schema(&url).await).await;
}

/// A fresh schema on the shared server, and the URL whose connections use it.
async fn postgres_schema(url: &str) -> String {
    use sqlx::Connection as _;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let schema = format!("center_kill_{}_{nanos}", std::process::id());
    let mut admin = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql(&format!("CREATE SCHEMA {schema}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-c%20search_path%3D{schema}")
}
