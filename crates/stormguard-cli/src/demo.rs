//! `stormguard demo …`: reference services run under their verification harness.
//!
//! # Why a separate program
//!
//! The demos live in their own crates under `examples/`, with their own database and broker
//! stack (sqlx for three databases, Redis, RabbitMQ, NATS, reqwest). Linking them in would make
//! every build of this CLI compile that stack and would keep the CLI from being published
//! (the demo crates are not). So `stormguard demo payment-callback ARGS…` runs the
//! example's own binary, `payment-callback ARGS…`, which has the same command line, and
//! passes its exit status through. It is looked for, in order:
//!
//! 1. beside this executable (both are built into the same `target/<profile>/` by a
//!    workspace build, and `cargo install --path examples/payment-callback` puts it beside an
//!    installed `stormguard`);
//! 2. on `PATH`;
//! 3. when this program was started by `cargo run` from the source tree (so `CARGO` is set and
//!    the example's sources are where they were when this was compiled): built first with the
//!    same cargo and profile, then run from beside this executable.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Subcommand;

use crate::run::Failure;

/// The example program behind `demo payment-callback`.
const PAYMENT_CALLBACK: &str = "payment-callback";

/// The demos.
#[derive(Debug, Subcommand)]
pub(crate) enum Demo {
    /// The idempotent payment callback under duplicates, a crash, network faults and a risk
    /// outage (SQLite by default; --database-url for PostgreSQL or MariaDB; --broker for
    /// Redis Streams, RabbitMQ or NATS JetStream). Runs the `payment-callback` program:
    /// `stormguard demo payment-callback --help` shows its options.
    #[command(disable_help_flag = true)]
    PaymentCallback {
        /// The arguments of `payment-callback`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
    /// The seeds' CDN outage healed by a metric-driven rule: an image service behind a CDN
    /// stand-in with a backup source, client instances on the one client stack following a
    /// policy center that scrapes them. The CDN answers 504; the rule cuts retries 3 -> 0
    /// and switches to the backup; the CDN recovers; the rule reverts. Real servers on
    /// 127.0.0.1, real time; prints a table (or JSON) and the switch time, --plot draws it.
    SelfHeal(crate::selfheal::SelfHealArgs),
}

/// Runs a demo; it prints its own output, so there is nothing left to print.
pub(crate) fn run(demo: Demo) -> Result<String, Failure> {
    match demo {
        Demo::SelfHeal(args) => crate::selfheal::run(args),
        Demo::PaymentCallback { args } => {
            let program = find(PAYMENT_CALLBACK)?;
            let status = Command::new(&program)
                .args(&args)
                .status()
                .map_err(|e| Failure::Io(format!("running {}: {e}", program.display())))?;
            match status.code() {
                Some(0) => Ok(String::new()),
                Some(code) => Err(Failure::Exit(u8::try_from(code).unwrap_or(1))),
                None => Err(Failure::Failed(format!(
                    "{} was stopped by a signal ({status})",
                    program.display()
                ))),
            }
        }
    }
}

fn executable(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// Where the demo program is (see the module docs), building it first when run by cargo from
/// the source tree.
fn find(name: &str) -> Result<PathBuf, Failure> {
    let here = std::env::current_exe()
        .map_err(|e| Failure::Io(format!("cannot find the stormguard executable: {e}")))?;
    let beside = here.parent().map(|dir| executable(dir, name));
    if let Some(path) = beside.as_ref().filter(|p| p.is_file()) {
        return Ok(path.clone());
    }
    if let Some(path) = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| executable(&dir, name))
            .find(|p| p.is_file())
    }) {
        return Ok(path);
    }
    if let (Some(cargo), Some(beside)) = (std::env::var_os("CARGO"), beside) {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        if workspace
            .join("examples/payment-callback/Cargo.toml")
            .is_file()
        {
            build(&cargo, &workspace, &here)?;
            if beside.is_file() {
                return Ok(beside);
            }
        }
    }
    Err(Failure::Failed(format!(
        "the demo program `{name}` was found neither beside {} nor on PATH; install it with \
         `cargo install --path examples/payment-callback` (from a stormguard checkout), or run \
         `cargo run --release -- demo payment-callback` from the checkout",
        here.display()
    )))
}

/// `cargo build -p stormguard-payment-callback` in the profile this executable was built in.
fn build(cargo: &OsString, workspace: &Path, here: &Path) -> Result<(), Failure> {
    let release = here
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|profile| profile == "release");
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .args([
            "-p",
            "stormguard-payment-callback",
            "--bin",
            PAYMENT_CALLBACK,
        ]);
    if release {
        cmd.arg("--release");
    }
    eprintln!("stormguard: building the payment-callback demo (its database and broker stack)…");
    let status = cmd
        .status()
        .map_err(|e| Failure::Io(format!("running cargo to build the demo: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(Failure::Failed(format!(
            "building the payment-callback demo failed ({status})"
        )))
    }
}
