//! A Python service behind the ingress proxy and a Python client in front of the egress proxy
//! (standard library only: no stormguard code in Python), over real sockets on 127.0.0.1:
//!
//! ```text
//! client.py ──http_proxy──▶ egress ──▶ ingress ──▶ service.py ──http_proxy──▶ egress ──▶ upstream (Rust)
//! ```
//!
//! The interpreter comes from `STORMGUARD_TEST_PYTHON` (`.ci/run` sets it); without it each
//! test prints `SKIPPED` and passes, unless `STORMGUARD_REQUIRE_PEERS=1`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;
use stormguard_proxy::{IngressConfig, Proxy};

use common::*;

/// The egress routes: reads and the hop are idempotent and retried; `POST /pay` only with a
/// key.
const POLICIES: &str = r#"
[endpoints."GET /*"]
idempotency = "idempotent"
timeouts = { overall = "20s" }
retry = { max_attempts = 3 }
backoff = { kind = "fixed", base = "1ms" }

[endpoints."POST /pay"]
idempotency = "key"
retry = { max_attempts = 3 }
backoff = { kind = "fixed", base = "1ms" }
"#;

fn python(test: &str) -> Option<PathBuf> {
    match std::env::var_os("STORMGUARD_TEST_PYTHON") {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => {
            assert!(
                std::env::var("STORMGUARD_REQUIRE_PEERS").as_deref() != Ok("1"),
                "STORMGUARD_REQUIRE_PEERS=1 but STORMGUARD_TEST_PYTHON is not set"
            );
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: {test}: STORMGUARD_TEST_PYTHON not set (any Python 3; .ci/run sets it)"
            );
            None
        }
    }
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(name)
}

/// The Python service, killed on drop.
struct Service {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_service(python: &Path, egress: SocketAddr, downstream: SocketAddr) -> Service {
    let mut child = Command::new(python)
        .arg(script("service.py"))
        .arg(egress.to_string())
        .arg(downstream.to_string())
        .env_remove("no_proxy")
        .env_remove("NO_PROXY")
        .stdout(Stdio::piped())
        .spawn()
        .expect("python starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the service prints its port");
    let port: u16 = line.trim().parse().expect("a port");
    Service {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    }
}

/// Runs the Python client once (off the runtime's threads) and returns its JSON line.
async fn client(
    python: &Path,
    egress: SocketAddr,
    method: &str,
    url: String,
    headers: &[&str],
) -> Value {
    let mut command = Command::new(python);
    command
        .arg(script("client.py"))
        .arg(egress.to_string())
        .arg(method)
        .arg(url)
        .args(headers)
        .env_remove("no_proxy")
        .env_remove("NO_PROXY");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("joined")
        .expect("python runs");
    assert!(
        output.status.success(),
        "client.py: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON line")
}

async fn egress_proxy() -> Proxy {
    egress(None, POLICIES).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_crosses_the_python_hop() {
    let Some(python) = python("the_deadline_crosses_the_python_hop") else {
        return;
    };
    let up = upstream().await;
    let egress = egress_proxy().await;
    let service = start_service(&python, egress.local_addr(), up.addr);
    let ingress = ingress(service.addr, IngressConfig::default()).await;

    let answer = client(
        &python,
        egress.local_addr(),
        "GET",
        format!("http://{}/hop/data/1", ingress.local_addr()),
        &["grpc-timeout=3S"],
    )
    .await;

    assert_eq!(answer["status"], 200, "{answer}");
    let body: Value = serde_json::from_str(answer["body"].as_str().expect("text")).expect("json");
    let given_ms = body["given_ms"]
        .as_f64()
        .expect("the service was given a deadline");
    assert!(
        given_ms > 0.0 && given_ms < 3000.0,
        "less than the client's 3 s: {given_ms}"
    );
    let seen = up.script.seen();
    let timeout = seen[0].headers["grpc-timeout"].as_bytes();
    let at_upstream = stormguard::deadline::parse_grpc_timeout(timeout).expect("grpc-timeout");
    assert!(
        at_upstream <= Duration::from_secs_f64(given_ms / 1000.0),
        "the upstream got at most what the Python service had left: {at_upstream:?} vs {given_ms} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_one_layer_retries_across_the_python_hop() {
    let Some(python) = python("only_one_layer_retries_across_the_python_hop") else {
        return;
    };
    let up = upstream().await;
    let egress = egress_proxy().await;
    let service = start_service(&python, egress.local_addr(), up.addr);
    let ingress = ingress(service.addr, IngressConfig::default()).await;

    let answer = client(
        &python,
        egress.local_addr(),
        "GET",
        format!("http://{}/hop/down/1", ingress.local_addr()),
        &[],
    )
    .await;

    assert_eq!(answer["status"], 503, "{answer}");
    assert_eq!(answer["headers"]["x-retry-exhausted"], "true");
    assert_eq!(
        up.script.count(),
        3,
        "the egress next to the upstream retried 3 times; the client's egress saw the mark and did not retry (3, not 9)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_post_is_retried_and_an_unkeyed_post_is_not() {
    let Some(python) = python("a_keyed_post_is_retried_and_an_unkeyed_post_is_not") else {
        return;
    };
    let up = upstream().await;
    let egress = egress_proxy().await;
    let url = format!("http://{}/pay", up.addr);

    up.script.fail_first.store(1, Ordering::SeqCst);
    let unkeyed = client(&python, egress.local_addr(), "POST", url.clone(), &[]).await;
    assert_eq!(unkeyed["status"], 503, "{unkeyed}");
    assert_eq!(up.script.count(), 1, "never replayed without a key");

    up.script.fail_first.store(1, Ordering::SeqCst);
    let keyed = client(
        &python,
        egress.local_addr(),
        "POST",
        url,
        &["Idempotency-Key=\"py-1\""],
    )
    .await;
    assert_eq!(keyed["status"], 200, "{keyed}");
    assert_eq!(up.script.count(), 3, "the keyed POST was retried once");
}
