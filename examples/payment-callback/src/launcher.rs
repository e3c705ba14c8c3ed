//! The service as a child process, for the crash scenario: a real `SIGKILL`, not a dropped
//! task.
//!
//! The harness starts the binary it is running in (`std::env::current_exe()`) with the hidden
//! `serve` subcommand; [`Launcher`] knows the arguments that lead there (none for the
//! example's own binary, `demo payment-callback` for the `stormguard` CLI). The child prints
//! `listening on ADDR` as its first line on stdout, which is how the harness learns its port.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

/// What the child prints first: `listening on 127.0.0.1:PORT`.
pub const READY_PREFIX: &str = "listening on ";

/// How long a child may take to print its address.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How to start `serve` in a child process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launcher {
    exe: PathBuf,
    prefix: Vec<OsString>,
}

/// Starting the child failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The executable could not be found or started.
    #[error("starting {exe}: {source}")]
    Spawn {
        /// The executable.
        exe: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The child exited or printed something else before its address.
    #[error("the service process did not report its address: {0}")]
    NotReady(String),
}

impl Launcher {
    /// Runs `exe`, with `prefix` before `serve` (for example `["demo", "payment-callback"]`).
    pub fn new<I, S>(exe: impl Into<PathBuf>, prefix: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Launcher {
            exe: exe.into(),
            prefix: prefix.into_iter().map(Into::into).collect(),
        }
    }

    /// The running executable, with `prefix` before `serve`.
    pub fn current_exe(prefix: &[&str]) -> std::io::Result<Self> {
        Ok(Launcher::new(
            std::env::current_exe()?,
            prefix.iter().copied(),
        ))
    }

    /// Starts `serve` with `args` and waits for its address; its stderr goes to `log` (appended)
    /// or nowhere.
    pub async fn spawn(
        &self,
        args: Vec<OsString>,
        log: Option<&Path>,
    ) -> Result<ChildService, LaunchError> {
        let spawn_err = |source| LaunchError::Spawn {
            exe: self.exe.display().to_string(),
            source,
        };
        let stderr = match log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(spawn_err)?,
            ),
            None => Stdio::null(),
        };
        let mut child = Command::new(&self.exe)
            .args(&self.prefix)
            .arg("serve")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(spawn_err)?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LaunchError::NotReady("no stdout pipe".into()));
        };
        let ready = tokio::time::timeout(
            READY_TIMEOUT,
            tokio::task::spawn_blocking(move || read_address(stdout)),
        )
        .await;
        let (addr, stdout) = match ready {
            Ok(Ok(Ok(found))) => found,
            Ok(Ok(Err(e))) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
            Ok(Err(join)) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(LaunchError::NotReady(join.to_string()));
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(LaunchError::NotReady(format!(
                    "nothing within {READY_TIMEOUT:?}"
                )));
            }
        };
        Ok(ChildService {
            child,
            addr,
            _stdout: stdout,
        })
    }
}

fn read_address(stdout: ChildStdout) -> Result<(SocketAddr, BufReader<ChildStdout>), LaunchError> {
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => Err(LaunchError::NotReady(
            "it exited first (see its log)".into(),
        )),
        Ok(_) => line
            .trim()
            .strip_prefix(READY_PREFIX)
            .and_then(|a| a.parse().ok())
            .map(|addr| (addr, reader))
            .ok_or_else(|| LaunchError::NotReady(format!("it printed {:?}", line.trim()))),
        Err(e) => Err(LaunchError::NotReady(e.to_string())),
    }
}

/// A running service process; killed when dropped.
#[derive(Debug)]
pub struct ChildService {
    child: Child,
    addr: SocketAddr,
    _stdout: BufReader<ChildStdout>,
}

impl ChildService {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// `SIGKILL` (`Child::kill`), then reaps it.
    pub fn kill(mut self) -> std::io::Result<()> {
        self.child.kill()?;
        self.child.wait().map(|_| ())
    }
}

impl Drop for ChildService {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
