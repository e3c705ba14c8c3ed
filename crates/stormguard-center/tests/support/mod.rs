//! A center on 127.0.0.1 over a real database, and an HTTP client for its API.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use stormguard_center::{Center, CenterConfig, Role, Store};

pub mod metrics_page;

/// A running center: its address, its state, an admin, an editor and a viewer token.
pub struct TestCenter {
    pub addr: SocketAddr,
    pub center: Center,
    pub admin: String,
    pub editor: String,
    pub viewer: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
    _dir: Option<tempfile::TempDir>,
}

/// Fails when the servers are required (CI), else prints a loud SKIPPED line.
pub fn postgres_url(test: &str) -> Option<String> {
    match std::env::var("STORMGUARD_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("STORMGUARD_REQUIRE_ALL_STORES").as_deref() == Ok("1") {
                panic!(
                    "STORMGUARD_TEST_POSTGRES_URL is not set but STORMGUARD_REQUIRE_ALL_STORES=1"
                );
            }
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: {test} on PostgreSQL: STORMGUARD_TEST_POSTGRES_URL not set"
            );
            None
        }
    }
}

/// A fresh schema on the PostgreSQL server, and the URL whose connections use it.
pub async fn postgres_schema(url: &str) -> String {
    use sqlx::Connection as _;
    let schema = format!("center_{}_{}", std::process::id(), rand_suffix());
    let mut admin = sqlx::PgConnection::connect(url)
        .await
        .expect("connect postgres");
    sqlx::raw_sql(&format!("CREATE SCHEMA {schema}"))
        .execute(&mut admin)
        .await
        .expect("create schema");
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-c%20search_path%3D{schema}")
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    u64::from(nanos) * 1000 + NEXT.fetch_add(1, Ordering::Relaxed)
}

impl TestCenter {
    /// A center on a new SQLite file.
    pub async fn sqlite() -> TestCenter {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("center.db").display());
        let mut center = TestCenter::on(&url, None).await;
        center._dir = Some(dir);
        center
    }

    /// A center on the database at `url`, on `addr` (or any free port).
    pub async fn on(url: &str, addr: Option<SocketAddr>) -> TestCenter {
        TestCenter::with_config(url, addr, CenterConfig::default()).await
    }

    /// A center on the database at `url`, on `addr`, configured so.
    pub async fn with_config(
        url: &str,
        addr: Option<SocketAddr>,
        config: CenterConfig,
    ) -> TestCenter {
        let store = Store::open(url).await.expect("open store");
        let center = Center::new(store, config).await.expect("center");
        let admin = center
            .create_token("root", Role::Admin, None)
            .await
            .expect("token");
        let editor = center
            .create_token("alice", Role::Editor, None)
            .await
            .expect("token");
        let viewer = center
            .create_token("bob", Role::Viewer, None)
            .await
            .expect("token");
        let listener =
            tokio::net::TcpListener::bind(addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap()))
                .await
                .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let serving = center.clone();
        let server = tokio::spawn(async move {
            let _ = serving
                .serve(listener, async move {
                    let _ = rx.await;
                })
                .await;
        });
        TestCenter {
            addr,
            center,
            admin,
            editor,
            viewer,
            shutdown: Some(tx),
            server: Some(server),
            _dir: None,
        }
    }

    /// Stops serving: the watch streams end, the port is free.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn instance_token(&self, service: &str) -> String {
        self.center
            .create_token(
                &format!("{service}-instances"),
                Role::Instance,
                Some(service),
            )
            .await
            .expect("token")
    }

    pub fn api(&self, token: &str) -> Api {
        Api {
            base: self.url(),
            token: Some(token.to_owned()),
            client: reqwest::Client::new(),
        }
    }

    pub fn anonymous(&self) -> Api {
        Api {
            base: self.url(),
            token: None,
            client: reqwest::Client::new(),
        }
    }
}

/// The API as one token sees it.
pub struct Api {
    base: String,
    token: Option<String>,
    client: reqwest::Client,
}

impl Api {
    pub async fn send(&self, method: &str, path: &str, body: Option<Vec<u8>>) -> (u16, Value) {
        self.try_send(method, path, body).await.expect("request")
    }

    /// The status and JSON answer, or the transport's error (a server that refuses a body
    /// and closes the connection while it is still being written cuts the write).
    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Value), reqwest::Error> {
        let mut request = self
            .client
            .request(
                method.parse().expect("method"),
                format!("{}{path}", self.base),
            )
            .timeout(Duration::from_secs(30));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.unwrap_or_default();
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send("GET", path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send("POST", path, Some(body.to_string().into_bytes()))
            .await
    }

    pub async fn publish(&self, service: &str, base: u64, policy: &str) -> (u16, Value) {
        self.post(
            &format!("/v1/services/{service}/versions"),
            json!({ "base": base, "policy": policy, "message": format!("on {base}") }),
        )
        .await
    }
}

/// A policy for every endpoint with this many attempts.
pub fn attempts(n: u32) -> String {
    format!("[endpoints.default]\nretry = {{ max_attempts = {n} }}\n")
}

/// An instance's one-stack client whose every endpoint makes `n` attempts until the center
/// says otherwise.
pub fn client_stack(n: u32) -> stormguard_tower::client::ClientLayer {
    let policies = stormguard::policy::PolicyFile::from_toml(&attempts(n)).unwrap();
    stormguard_tower::client::ClientLayer::from_policy_file(&policies).unwrap()
}

/// The bin directory of a PostgreSQL installation (`initdb`, `pg_ctl`) for a server of the
/// test's own, from `STORMGUARD_TEST_PG_BIN` (`.ci/stores.sh` sets it); fails when the
/// servers are required (CI), else prints a loud SKIPPED line.
pub fn private_postgres_bin(test: &str) -> Option<std::path::PathBuf> {
    match std::env::var("STORMGUARD_TEST_PG_BIN") {
        Ok(bin) if !bin.is_empty() => Some(bin.into()),
        _ => {
            if std::env::var("STORMGUARD_REQUIRE_ALL_STORES").as_deref() == Ok("1") {
                panic!("STORMGUARD_TEST_PG_BIN is not set but STORMGUARD_REQUIRE_ALL_STORES=1");
            }
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: {test}: STORMGUARD_TEST_PG_BIN (PostgreSQL's bin directory) not set"
            );
            None
        }
    }
}

/// A PostgreSQL server of one test alone: a new cluster in a temporary directory, on a
/// free port of 127.0.0.1, trusting local connections. The test may stop and start it,
/// which the shared server on :5432 (other tests use it at the same time) must never be.
/// As root (CI) the server runs as the `postgres` user, which PostgreSQL requires.
pub struct PrivatePostgres {
    bin: std::path::PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    as_postgres: bool,
}

impl PrivatePostgres {
    /// Makes the cluster (`initdb`) and starts the server (`pg_ctl start`, which waits until
    /// it accepts connections). Blocking: call it from `spawn_blocking`.
    pub fn start(bin: &std::path::Path) -> PrivatePostgres {
        let dir = tempfile::tempdir().expect("temp dir");
        let as_postgres = run(std::process::Command::new("id").arg("-u")).trim() == "0";
        if as_postgres {
            run(std::process::Command::new("chown")
                .arg("postgres:")
                .arg(dir.path()));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let server = PrivatePostgres {
            bin: bin.to_owned(),
            dir,
            port,
            as_postgres,
        };
        run(server.command("initdb").arg("-D").arg(server.data()).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]));
        server.start_again();
        server
    }

    fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> std::process::Command {
        let program = self.bin.join(program);
        if self.as_postgres {
            let mut command = std::process::Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            std::process::Command::new(program)
        }
    }

    /// Starts the stopped server on its port and waits (at most 60 s) until it accepts
    /// connections. Blocking.
    pub fn start_again(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-w", "-t", "60", "-o", &options, "start"]));
    }

    /// Stops the server the hard way (`pg_ctl stop -m immediate`: every connection cut, no
    /// checkpoint, crash recovery at the next start) and waits until it is gone. Blocking.
    pub fn stop_immediately(&self) {
        run(self.command("pg_ctl").arg("-D").arg(self.data()).args([
            "-w",
            "-t",
            "60",
            "-m",
            "immediate",
            "stop",
        ]));
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-t", "60", "-m", "immediate", "stop"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Runs a command to its end; its standard output, or a panic with its output when it fails.
fn run(command: &mut std::process::Command) -> String {
    let output = command.output().expect("the command runs");
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
