//! The demo's policy center: the `stormguard center` program as a child process (the demo),
//! or the same center served in this process (the paused-time test), driven the same way
//! through its HTTP API.
//!
//! As a child process it is exactly what an operator runs: its own store, its own
//! collection loop (scraping the instances that announce their `/metrics` with their
//! watch, every second by default) and its own rule runner. In this process, the test
//! starts the same [`Collector`] on the same defaults, so that its clock is the test's.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use serde_json::{Value, json};
use stormguard_center::{
    Center, CenterConfig, CollectConfig, Collector, Role, RuleRunner, Store, Version, new_token,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::fleet::SERVICE;
use super::servers::{Serving, serve};
use crate::policy_center::Client;

/// Where the center runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CenterAt {
    /// Served by this process, its collector started by [`DemoCenter::start_collecting`].
    InProcess,
    /// `PROGRAM center …` as a child process, collecting from its start.
    Process(PathBuf),
}

/// A running center, an editor's, a viewer's and one instance token per client.
pub(crate) struct DemoCenter {
    /// `http://127.0.0.1:PORT`.
    pub(crate) url: String,
    /// The instances' tokens, one each.
    pub(crate) instances: Vec<String>,
    /// A viewer's token (the dashboard's sign-in; [`versions`](Self::versions) reads with it).
    pub(crate) viewer_token: String,
    editor: Client,
    viewer: Client,
    running: Running,
    // Last: the store's directory outlives the center that writes into it.
    _dir: tempfile::TempDir,
}

enum Running {
    InProcess {
        center: Center,
        _serving: Serving,
        collecting: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
    },
    /// Killed when dropped.
    Process { _child: ChildCenter },
}

/// The child process; killed when dropped.
struct ChildCenter(Child);

impl Drop for ChildCenter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl DemoCenter {
    /// Starts a center on a new SQLite file with at most `max_changes` automatic changes per
    /// service per hour, and makes the tokens.
    pub(crate) async fn start(
        at: &CenterAt,
        clients: usize,
        max_changes: u32,
    ) -> Result<DemoCenter, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
        let database = format!("sqlite://{}", dir.path().join("center.db").display());
        let admin = new_token();
        let (url, running) = match at {
            CenterAt::InProcess => {
                let store = Store::open(&database)
                    .await
                    .map_err(|e| format!("the center's store: {e}"))?;
                let center = Center::new(store, CenterConfig::default())
                    .await
                    .map_err(|e| format!("the center: {e}"))?;
                center
                    .add_token(&admin, "admin", Role::Admin, None)
                    .await
                    .map_err(|e| format!("the admin token: {e}"))?;
                let serving = serve(center.router()).await?;
                (
                    serving.url.clone(),
                    Running::InProcess {
                        center,
                        _serving: serving,
                        collecting: None,
                    },
                )
            }
            CenterAt::Process(program) => {
                let (url, child) =
                    spawn(program, &database, &admin, max_changes, dir.path()).await?;
                (url, Running::Process { _child: child })
            }
        };
        let admin = client(&url, &admin)?;
        let editor = client(&url, &token(&admin, "ops", "editor", None).await?)?;
        let viewer_token = token(&admin, "demo", "viewer", None).await?;
        let viewer = client(&url, &viewer_token)?;
        let mut instances = Vec::new();
        for i in 1..=clients {
            let name = format!("{SERVICE}-{i}");
            instances.push(token(&admin, &name, "instance", Some(SERVICE)).await?);
        }
        Ok(DemoCenter {
            url,
            instances,
            viewer_token,
            editor,
            viewer,
            running,
            _dir: dir,
        })
    }

    /// Runs the center's collection loop on the default interval, feeding its rules (in
    /// this process; a child process collects from its start).
    pub(crate) fn start_collecting(&mut self, max_changes: u32) {
        if let Running::InProcess {
            center, collecting, ..
        } = &mut self.running
        {
            let runner = Arc::new(RuleRunner::new(center.clone(), max_changes));
            let collector = Collector::new(center.clone(), runner, CollectConfig::default());
            let (stop, stopped) = oneshot::channel::<()>();
            let task = tokio::spawn(collector.run(async move {
                let _ = stopped.await;
            }));
            *collecting = Some((stop, task));
        }
    }

    /// Stops the collection loop started by [`start_collecting`](Self::start_collecting).
    pub(crate) async fn stop_collecting(&mut self) {
        if let Running::InProcess { collecting, .. } = &mut self.running {
            if let Some((stop, task)) = collecting.take() {
                let _ = stop.send(());
                let _ = task.await;
            }
        }
    }

    /// Publishes the first version of the service's `policy`.
    pub(crate) async fn publish(&self, policy: &str, message: &str) -> Result<(), String> {
        let body = json!({"base": 0, "policy": policy, "message": message});
        let path = format!("/v1/services/{SERVICE}/versions");
        self.editor
            .send("POST", &path, Some(body))
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Stores a rule (its JSON form) under its service and name.
    pub(crate) async fn put_rule(
        &self,
        service: &str,
        name: &str,
        rule: Value,
    ) -> Result<(), String> {
        let path = format!("/v1/services/{service}/rules/{name}");
        self.editor
            .send("PUT", &path, Some(rule))
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// The service's versions, oldest first.
    pub(crate) async fn versions(&self) -> Result<Vec<Version>, String> {
        let path = format!("/v1/services/{SERVICE}/versions?limit=1000");
        let list = self
            .viewer
            .send("GET", &path, None)
            .await
            .map_err(|e| e.to_string())?;
        let mut versions: Vec<Version> =
            serde_json::from_value(list).map_err(|e| format!("the center's versions: {e}"))?;
        versions.sort_by_key(|v| v.version);
        Ok(versions)
    }
}

fn client(url: &str, token: &str) -> Result<Client, String> {
    Client::with_token(url, token).map_err(|e| e.to_string())
}

/// A new token of `role` made by `admin` (an `instance` token for `service`).
async fn token(
    admin: &Client,
    name: &str,
    role: &str,
    service: Option<&str>,
) -> Result<String, String> {
    let body = json!({"name": name, "role": role, "service": service});
    let answer = admin
        .send("POST", "/v1/tokens", Some(body))
        .await
        .map_err(|e| e.to_string())?;
    answer["token"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("the center made no token: {answer}"))
}

/// How long the center may take to announce where it listens.
const START_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `program center` on a free port of 127.0.0.1 with the admin token in its environment,
/// its log in `dir`; returns its URL once it has announced where it listens.
///
/// A thread reads the child's standard output: its first line (the address) is handed over
/// and the rest is drained for as long as the child runs, so that the center never writes
/// into a closed pipe. The wait for that first line is bounded by [`START_WAIT`].
async fn spawn(
    program: &Path,
    database: &str,
    admin: &str,
    max_changes: u32,
    dir: &Path,
) -> Result<(String, ChildCenter), String> {
    let log_path = dir.join("center.log");
    let log =
        std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let child = Command::new(program)
        .args([
            "center",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            database,
        ])
        .args(["--max-rule-changes-per-hour", &max_changes.to_string()])
        .env("STORMGUARD_CENTER_ADMIN_TOKEN", admin)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting {} center: {e}", program.display()))?;
    let mut child = ChildCenter(child);
    let (announce, announced) = oneshot::channel();
    if let Some(stdout) = child.0.stdout.take() {
        std::thread::spawn(move || {
            let mut stdout = std::io::BufReader::new(stdout);
            let mut first = String::new();
            // Until the center has bound its port (or died): the first line it prints.
            let _ = stdout.read_line(&mut first);
            let _ = announce.send(first);
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
        });
    }
    let first = tokio::time::timeout(START_WAIT, announced)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let listen: Option<String> = serde_json::from_str::<Value>(&first)
        .ok()
        .and_then(|v| v["listen"].as_str().map(str::to_owned));
    match listen {
        Some(addr) => Ok((format!("http://{addr}"), child)),
        None => {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            Err(format!(
                "the center did not start: {}",
                log.lines().last().unwrap_or("(no log)")
            ))
        }
    }
}
