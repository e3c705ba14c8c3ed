//! Deadlines across a real gRPC peer not written here: Python `grpcio`, as the client calling
//! a tonic server behind `DeadlineLayer`, and as the downstream server called by a tonic client
//! behind `PropagateDeadlineLayer`.
//!
//! The Python interpreter (with `grpcio` and `grpcio-tools`) comes from
//! `STORMGUARD_TEST_PYTHON`; without it every test prints `SKIPPED` and passes, unless
//! `STORMGUARD_REQUIRE_PEERS=1` (as in `.ci/run`), which makes a missing peer a failure. The
//! stubs for `proto/relay.proto` are generated at test time with `grpc_tools.protoc`.
//!
//! Real time, real sockets on 127.0.0.1: budgets are compared as values (what one side sent
//! against what the other side saw), with a tolerance ([`TOLERANCE_MS`]) for the time in
//! between. These tests cannot run under paused time: the peer is another process, and
//! grpcio measures the time left with its own real clock (the Python client's deadline timer,
//! the Python server's `time_remaining()`), which a paused tokio clock does not stop. Exact
//! figures for our own layers, over real sockets under paused time, are in
//! `crates/stormguard-tower/tests/deadline_http.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use grpc_hop::pb::relay_server::Relay;
use grpc_hop::pb::{HopReply, HopRequest};
use grpc_hop::{Hop, client, next_hop_status, serve};
use serde_json::Value;
use stormguard::admission::DeadlineTooClose;
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline, Reserve, parse_grpc_timeout};
use stormguard_tower::deadline::{DeadlineLayer, PropagateDeadlineLayer};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::TcpListener;
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::mpsc;

/// Generous bound on any single step, so a broken test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(30);
/// How much less a receiver may see than the sender handed on: time in flight, thread hand-offs
/// and scheduling in a Python server.
const TOLERANCE_MS: f64 = 50.0;

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Python interpreter, or `None` after printing `SKIPPED` (to the real stderr, past the
/// test harness's capture) when it is not configured.
fn python(test: &str) -> Option<PathBuf> {
    match std::env::var_os("STORMGUARD_TEST_PYTHON") {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => {
            assert!(
                std::env::var("STORMGUARD_REQUIRE_PEERS").as_deref() != Ok("1"),
                "STORMGUARD_REQUIRE_PEERS=1 but STORMGUARD_TEST_PYTHON is not set: \
                 the gRPC peer tests cannot run"
            );
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: {test}: STORMGUARD_TEST_PYTHON not set (a Python with grpcio and \
                 grpcio-tools; .ci/run makes one in target/peer-venv)"
            );
            None
        }
    }
}

/// Generates the Python stubs for `relay.proto` once per test binary; returns their folder.
fn stubs(python: &Path) -> PathBuf {
    static STUBS: OnceLock<PathBuf> = OnceLock::new();
    STUBS
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("grpc-hop-peer-stubs-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let proto = manifest_dir().join("proto");
            let status = std::process::Command::new(python)
                .args(["-m", "grpc_tools.protoc"])
                .arg(format!("-I{}", proto.display()))
                .arg(format!("--python_out={}", dir.display()))
                .arg(format!("--grpc_python_out={}", dir.display()))
                .arg(proto.join("relay.proto"))
                .status()
                .expect("run grpc_tools.protoc");
            assert!(status.success(), "grpc_tools.protoc failed: {status}");
            dir
        })
        .clone()
}

fn peer_command(python: &Path) -> Command {
    let mut command = Command::new(python);
    command
        .arg(manifest_dir().join("tests/peer/peer.py"))
        .env("PYTHONPATH", stubs(python))
        .kill_on_drop(true);
    command
}

/// The Python `Relay` server: its port, and the lines it prints per call.
struct PythonServer {
    _child: Child,
    uri: String,
    lines: Lines<BufReader<ChildStdout>>,
}

impl PythonServer {
    async fn start(python: &Path) -> PythonServer {
        let mut child = peer_command(python)
            .arg("server")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the Python server");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("the Python server printed its port in time")
            .unwrap()
            .expect("a PORT line");
        let port: u16 = first.strip_prefix("PORT ").unwrap().parse().unwrap();
        PythonServer {
            _child: child,
            uri: format!("http://127.0.0.1:{port}"),
            lines,
        }
    }

    /// The budget the server reported for its next call.
    async fn next_call(&mut self) -> f64 {
        let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("a call line in time")
            .unwrap()
            .expect("a CALL line");
        line.strip_prefix("CALL ").unwrap().parse().unwrap()
    }
}

/// Runs the Python client against `addr` and returns its JSON outcome.
async fn python_call(python: &Path, addr: &str, timeout_s: Option<f64>, work_ms: u32) -> Value {
    let mut command = peer_command(python);
    command
        .args(["client", addr, "--work-ms", &work_ms.to_string()])
        .stdout(Stdio::piped());
    if let Some(t) = timeout_s {
        command.args(["--timeout", &t.to_string()]);
    }
    let output = tokio::time::timeout(PATIENCE, command.output())
        .await
        .expect("the Python client finished in time")
        .unwrap();
    assert!(output.status.success(), "python client: {output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

async fn listen() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

fn budget(reply: &Value) -> f64 {
    reply["budget_ms"].as_f64().unwrap()
}

/// The `grpc-timeout` a hop received, in milliseconds. Compared with what the hop saw rather
/// than with the timeout given to grpcio, because gRPC's C core may round the timeout it
/// encodes up (to fewer significant digits): a 1 s timeout can arrive as a little more.
fn sent_ms(reply: &Value) -> f64 {
    assert_eq!(reply["via"], "grpc-timeout");
    let value = reply["header_value"].as_str().unwrap();
    parse_grpc_timeout(value.as_bytes()).unwrap().as_secs_f64() * 1e3
}

#[tokio::test]
async fn python_client_deadline_reaches_the_tonic_server() {
    let Some(python) = python("python_client_deadline_reaches_the_tonic_server") else {
        return;
    };
    let (listener, addr) = listen().await;
    tokio::spawn(serve(
        listener,
        Hop::new("tonic", None),
        DeadlineLayer::new(),
    ));

    let outcome = python_call(&python, &addr, Some(1.0), 0).await;
    assert_eq!(outcome["ok"], true, "{outcome}");
    let reply = &outcome["reply"];
    assert_eq!(reply["hop"], "tonic");
    assert_eq!(reply["via"], "grpc-timeout");
    let seen = budget(reply);
    let sent = sent_ms(reply);
    assert!(
        seen <= sent && seen > sent - TOLERANCE_MS,
        "the tonic handler saw {seen} ms of the {sent} ms Python sent"
    );
}

#[tokio::test]
async fn tonic_client_hands_the_python_server_its_deadline_minus_the_reserve() {
    let Some(python) =
        python("tonic_client_hands_the_python_server_its_deadline_minus_the_reserve")
    else {
        return;
    };
    let mut server = PythonServer::start(&python).await;
    let reserve = Reserve::fixed(Duration::from_millis(100));
    let propagate = PropagateDeadlineLayer::new().with_reserve(reserve);
    let mut to_python = client(&server.uri, &propagate).unwrap();

    // Connect first (a call without a deadline passes through untouched).
    to_python.hop(HopRequest { work_ms: 0 }).await.unwrap();
    assert_eq!(server.next_call().await, 0.0, "no deadline, no budget");

    let (handed_ms, reply) = deadline::scope(
        Deadline::after(Duration::from_millis(1000), Clock::tokio()),
        async {
            let left = deadline::current().unwrap().remaining();
            let handed = left.saturating_sub(reserve.kept_from(left));
            let reply = to_python.hop(HopRequest { work_ms: 0 }).await.unwrap();
            (handed.as_secs_f64() * 1e3, reply.into_inner())
        },
    )
    .await;
    let seen = reply.budget_ms;
    assert_eq!(server.next_call().await, (seen * 1e3).round() / 1e3);
    assert!(
        seen <= handed_ms && seen > handed_ms - TOLERANCE_MS,
        "Python saw {seen} ms; the client handed on {handed_ms} ms (1000 ms - 100 ms reserve)"
    );
}

#[tokio::test]
async fn chain_python_client_to_tonic_hop_to_python_server() {
    let Some(python) = python("chain_python_client_to_tonic_hop_to_python_server") else {
        return;
    };
    let server = PythonServer::start(&python).await;
    let propagate = PropagateDeadlineLayer::new().with_reserve(Reserve::fraction(0.1).unwrap());
    let next = client(&server.uri, &propagate).unwrap();
    let (listener, addr) = listen().await;
    tokio::spawn(serve(
        listener,
        Hop::new("tonic", Some(next)),
        DeadlineLayer::new(),
    ));

    let outcome = python_call(&python, &addr, Some(1.0), 0).await;
    assert_eq!(outcome["ok"], true, "{outcome}");
    let hop = budget(&outcome["reply"]);
    let downstream = budget(&outcome["reply"]["downstream"]);
    assert_eq!(outcome["reply"]["downstream"]["hop"], "python");
    let sent = sent_ms(&outcome["reply"]);
    assert!(
        hop <= sent && hop > sent - TOLERANCE_MS,
        "hop saw {hop} of {sent} ms"
    );
    // The hop keeps 10 % of what it has when it calls (a little less than `hop`).
    let handed_at_most = hop * 0.9;
    assert!(
        downstream <= handed_at_most && downstream > handed_at_most - TOLERANCE_MS,
        "Python downstream saw {downstream} ms; the hop had {hop} ms and keeps 10 %"
    );
}

/// Sends on its channel when dropped.
struct DropGuard(mpsc::UnboundedSender<()>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// A handler that would work for 10 minutes, holding a guard while it does.
struct Slow {
    dropped: mpsc::UnboundedSender<()>,
    finished: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl Relay for Slow {
    async fn hop(
        &self,
        _request: tonic::Request<HopRequest>,
    ) -> Result<tonic::Response<HopReply>, tonic::Status> {
        let _guard = DropGuard(self.dropped.clone());
        tokio::time::sleep(Duration::from_secs(600)).await;
        self.finished.fetch_add(1, Ordering::SeqCst);
        Ok(tonic::Response::new(HopReply::default()))
    }
}

#[tokio::test]
async fn tonic_server_cancels_at_its_maximum_and_python_sees_deadline_exceeded() {
    let Some(python) =
        python("tonic_server_cancels_at_its_maximum_and_python_sees_deadline_exceeded")
    else {
        return;
    };
    let (dropped_tx, mut dropped_rx) = mpsc::unbounded_channel();
    let finished = Arc::new(AtomicUsize::new(0));
    let layer = DeadlineLayer::new()
        .with_max(Duration::from_millis(200))
        .validate()
        .unwrap();
    let (listener, addr) = listen().await;
    let slow = Slow {
        dropped: dropped_tx,
        finished: Arc::clone(&finished),
    };
    tokio::spawn(serve(listener, slow, layer.clone()));

    // Python would wait 20 s; the server's maximum of 200 ms ends the call.
    let outcome = python_call(&python, &addr, Some(20.0), 0).await;
    assert_eq!(outcome["ok"], false, "{outcome}");
    assert_eq!(outcome["code"], "DEADLINE_EXCEEDED");
    // The layer's own message, so the server answered (not the Python client's timer).
    assert_eq!(outcome["details"], "deadline exceeded");
    let dropped = tokio::time::timeout(PATIENCE, dropped_rx.recv()).await;
    assert_eq!(dropped.expect("handler dropped in time"), Some(()));
    assert_eq!(finished.load(Ordering::SeqCst), 0);
    assert_eq!(layer.stats().cancelled, 1);
}

#[tokio::test]
async fn tonic_client_does_not_call_python_below_the_minimum_useful_time() {
    let Some(python) = python("tonic_client_does_not_call_python_below_the_minimum_useful_time")
    else {
        return;
    };
    let mut server = PythonServer::start(&python).await;
    let propagate = PropagateDeadlineLayer::new()
        .with_reserve(Reserve::fixed(Duration::from_millis(100)))
        .with_min_call(Duration::from_millis(500));
    let to_python = Arc::new(Mutex::new(client(&server.uri, &propagate).unwrap()));
    let call = |budget_ms: u64| {
        let mut to_python = to_python.lock().unwrap().clone();
        deadline::scope(
            Deadline::after(Duration::from_millis(budget_ms), Clock::tokio()),
            async move { to_python.hop(HopRequest { work_ms: 0 }).await },
        )
    };

    // 300 ms - 100 ms = 200 ms < 500 ms: not sent.
    let status = call(300).await.expect_err("refused");
    let too_close = std::error::Error::source(&status)
        .and_then(|e| e.downcast_ref::<DeadlineTooClose>())
        .copied()
        .expect("the typed error is the status's source");
    assert_eq!(too_close.min_call, Duration::from_millis(500));
    assert_eq!(
        next_hop_status(status).code(),
        tonic::Code::DeadlineExceeded
    );
    assert_eq!(propagate.stats().refused_too_close, 1);

    // 2000 ms - 100 ms: sent, and it is the first call Python sees.
    let reply = call(2000).await.expect("sent").into_inner();
    let first_seen = server.next_call().await;
    assert_eq!(first_seen, (reply.budget_ms * 1e3).round() / 1e3);
    assert!(first_seen > 1000.0, "Python saw {first_seen} ms");
}
