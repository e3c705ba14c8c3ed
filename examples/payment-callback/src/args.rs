//! The command line, shared by both binaries: the example's `payment-callback` and
//! `stormguard demo payment-callback`.
//!
//! With no subcommand it runs the harness and prints the verification table; the hidden
//! `serve` subcommand runs the service alone, which is how the harness starts the child
//! process it kills in the crash scenario. Both binaries flatten [`DemoArgs`] into their own
//! parser and call [`run`] with a [`Launcher`] that knows how to reach `serve` again.
//!
//! Exit status: 0 when every invariant held; 1 when one was violated or the run failed
//! (database unreachable, …); 2 for bad input.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::broker::BrokerUrl;
use crate::harness::{self, DEMO_SECRET, HarnessConfig, Scenario};
use crate::launcher::{Launcher, READY_PREFIX};
use crate::policy::{DEFAULT_POLICY, Policies};
use crate::risk::{RiskFaults, RiskServer};
use crate::service::{BUSINESS_DEADLINE, Service, ServiceConfig};
use crate::store::DatabaseUrl;

/// The payment-callback reference service and its load and chaos verification.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DemoArgs {
    /// Run the service alone instead of the harness.
    #[command(subcommand)]
    pub command: Option<DemoCommand>,
    /// The harness's options.
    #[command(flatten)]
    pub harness: HarnessArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum DemoCommand {
    /// Run the callback service (the harness starts this in a child process).
    #[command(hide = true)]
    Serve(ServeArgs),
}

/// Options of the harness.
#[derive(Debug, Args)]
pub struct HarnessArgs {
    /// Shortened runs (for CI): fewer callbacks per scenario.
    #[arg(long)]
    pub quick: bool,
    /// The database: sqlite:PATH, postgres://… or mysql://… (MariaDB) [default: a new SQLite
    /// file per scenario in a temporary directory].
    #[arg(long, value_name = "URL")]
    pub database_url: Option<DatabaseUrl>,
    /// Where `order.paid` is published: `table` (a queue table in the database), Redis
    /// Streams (redis://HOST:PORT/), RabbitMQ (amqp://USER:PASS@HOST:PORT/VHOST) or NATS
    /// JetStream (nats://HOST:PORT).
    #[arg(long, value_name = "URL", default_value = "table")]
    pub broker: BrokerUrl,
    /// Delete the demo's rows (payments, notifications, broker, its outbox and inbox entries)
    /// at the start of each scenario.
    #[arg(long)]
    pub fresh: bool,
    /// Divide the platform's redelivery schedule (15 s, 15 s, 30 s, 3 min, …) and the
    /// duplicates scenario's 60 s window by this. The service's own 4.5 s deadline and its
    /// timeouts stay real.
    #[arg(long, default_value_t = 1000.0, value_parser = time_scale)]
    pub time_scale: f64,
    /// Seed of the injected faults and of the retry jitter.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Scenarios to run, comma-separated [default: all four].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub scenario: Vec<Scenario>,
    /// Append the service's logs (JSON lines; the crash scenario's child processes too) to this
    /// file. Without it they are discarded.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
}

/// Options of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any free port; the address is printed first on stdout).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The database: sqlite:PATH, postgres://… or mysql://….
    #[arg(long, value_name = "URL", default_value = "sqlite:payment-callback.db")]
    pub database_url: DatabaseUrl,
    /// Where `order.paid` is published: `table`, redis://…, amqp://… or nats://….
    #[arg(long, value_name = "URL", default_value = "table")]
    pub broker: BrokerUrl,
    /// The risk service's check URL [default: start a healthy one in-process].
    #[arg(long, value_name = "URL")]
    pub risk_url: Option<String>,
    /// The secret shared with the payment platform.
    #[arg(long, default_value = DEMO_SECRET, hide_default_value = true)]
    pub secret: String,
    /// A policy file replacing the embedded one (same shape as examples/payment-callback/policy.toml).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Seed of the retry jitter.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// How long to keep trying to bind a port that is still in use.
    #[arg(long, default_value = "0s", value_parser = duration)]
    pub bind_patience: Duration,
}

fn time_scale(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
        _ => Err("must be a number >= 1 (1 = real time)".to_owned()),
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    stormguard::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// Why a run did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Bad input (exit status 2).
    #[error("{0}")]
    Usage(String),
    /// A violated invariant or a failed run (exit status 1).
    #[error("{0}")]
    Failed(String),
}

impl DemoError {
    /// The process exit status.
    pub fn exit_code(&self) -> u8 {
        match self {
            DemoError::Usage(_) => 2,
            DemoError::Failed(_) => 1,
        }
    }
}

/// Runs the harness (printing the table on stdout) or, with `serve`, the service.
pub fn run(args: DemoArgs, launcher: Launcher) -> Result<(), DemoError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| DemoError::Failed(format!("starting the runtime: {e}")))?;
    match args.command {
        Some(DemoCommand::Serve(serve_args)) => runtime.block_on(serve(serve_args)),
        None => runtime.block_on(harness(args.harness, launcher)),
    }
}

fn init_logs<W>(writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(writer)
        .try_init();
}

/// `serve`: runs until killed.
async fn serve(args: ServeArgs) -> Result<(), DemoError> {
    init_logs(std::io::stderr);
    let text = match &args.policy {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| DemoError::Usage(format!("--policy {}: {e}", path.display())))?,
        None => DEFAULT_POLICY.to_owned(),
    };
    let policies = Policies::from_toml(&text).map_err(|e| DemoError::Usage(e.to_string()))?;
    let mut _embedded = None;
    let risk_url = match args.risk_url {
        Some(url) => url,
        None => {
            let risk = RiskServer::start(Arc::new(RiskFaults::new(args.seed)))
                .await
                .map_err(|e| DemoError::Failed(format!("starting the risk service: {e}")))?;
            let url = risk.url();
            _embedded = Some(risk);
            url
        }
    };
    let service = Service::start(ServiceConfig {
        listen: args.listen,
        database: args.database_url,
        risk_url,
        broker: args.broker,
        secret: args.secret,
        policies,
        seed: args.seed,
        deadline: BUSINESS_DEADLINE,
        bind_patience: args.bind_patience,
    })
    .await
    .map_err(|e| DemoError::Failed(e.to_string()))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{READY_PREFIX}{}", service.addr())
        .and_then(|()| out.flush())
        .map_err(|e| DemoError::Failed(format!("writing the address: {e}")))?;
    drop(out);
    service
        .wait()
        .await
        .map_err(|e| DemoError::Failed(e.to_string()))
}

/// The harness: every scenario, then the table.
async fn harness(args: HarnessArgs, launcher: Launcher) -> Result<(), DemoError> {
    if let Some(path) = &args.log_file {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| DemoError::Usage(format!("--log-file {}: {e}", path.display())))?;
        init_logs(Arc::new(file));
    }
    let config = HarnessConfig {
        quick: args.quick,
        database: args.database_url,
        broker: args.broker,
        fresh: args.fresh,
        time_scale: args.time_scale,
        seed: args.seed,
        scenarios: if args.scenario.is_empty() {
            Scenario::ALL.to_vec()
        } else {
            args.scenario
        },
        launcher: Some(launcher),
        log_file: args.log_file,
    };
    let results = harness::run(&config)
        .await
        .map_err(|e| DemoError::Failed(e.to_string()))?;
    let mut out = std::io::stdout().lock();
    write!(out, "{}", harness::render(&results))
        .and_then(|()| out.flush())
        .map_err(|e| DemoError::Failed(format!("writing the table: {e}")))?;
    let failed: Vec<_> = results
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.scenario.name())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(DemoError::Failed(format!(
            "invariants violated in: {}",
            failed.join(", ")
        )))
    }
}
