//! `stormguard proxy ingress|egress …`: the sidecar proxy (crate `stormguard-proxy`), run
//! until Ctrl-C. This module only turns flags into a [`ProxyConfig`]; a bad flag or setting
//! exits with status 2, naming it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use stormguard::fault::{Abort, FaultConfig, Latency};
use stormguard::limit::{Aimd, Gradient2, LimiterConfig, Vegas};
use stormguard_proxy::fault_spec::{parse_abort, parse_delay};
use stormguard_proxy::{
    Direction, EgressConfig, IdempotencyConfig, IngressConfig, PolicySource, Proxy, ProxyConfig,
    Upstream,
};
use stormguard_tower::DeadlineLayer;
use stormguard_tower::deadline::MalformedPolicy;

use crate::parse;
use crate::run::Failure;

/// The two directions of the sidecar.
#[derive(Debug, Subcommand)]
pub(crate) enum ProxyCommand {
    /// For the service's outgoing calls: the one client stack per route of the policy file
    /// (deadline on the wire, budgeted retries with jitter, breaker, hedging,
    /// X-Retry-Exhausted), reloaded live when the file changes. Point the service's
    /// http_proxy at --listen, or give --upstream for one downstream.
    Egress(EgressArgs),
    /// In front of the service: the caller's deadline read and enforced (expired requests
    /// refused before the service), admission by an adaptive limit, Idempotency-Key handling.
    Ingress(IngressArgs),
}

/// What both directions take.
#[derive(Debug, Args)]
pub(crate) struct Common {
    /// Address to serve on (HTTP/1.1 and h2c on one port).
    #[arg(long, default_value = "127.0.0.1:15001")]
    listen: SocketAddr,
    /// Admin address: GET /metrics (Prometheus), GET /status (policy version, breakers).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Log filter for the JSON log lines on stderr (RUST_LOG syntax).
    #[arg(long, default_value = "info")]
    log: String,
    /// Runtime worker threads (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
}

/// `proxy egress`.
#[derive(Debug, Args)]
pub(crate) struct EgressArgs {
    #[command(flatten)]
    common: Common,
    /// The policy file (TOML or JSON): routes by method, host and path prefix; watched.
    #[arg(long)]
    policy: PathBuf,
    /// Send every request here (host:port) instead of to the host it names.
    #[arg(long)]
    upstream: Option<String>,
    /// Inject aborts below the stack: RATE:STATUS or RATE:reset (0.1:503).
    #[arg(long, value_parser = abort)]
    fault_abort: Option<(f64, Abort)>,
    /// Inject delays below the stack: RATE:DURATION (0.05:250ms).
    #[arg(long, value_parser = delay)]
    fault_delay: Option<(f64, Latency)>,
}

/// `proxy ingress`.
#[derive(Debug, Args)]
pub(crate) struct IngressArgs {
    #[command(flatten)]
    common: Common,
    /// The service behind the proxy (host:port).
    #[arg(long)]
    upstream: String,
    /// The deadline of a request that carries none.
    #[arg(long, value_parser = parse::duration)]
    default_timeout: Option<Duration>,
    /// The longest deadline granted, whatever the caller asks.
    #[arg(long, value_parser = parse::duration)]
    max_timeout: Option<Duration>,
    /// Refuse a malformed deadline header (400) instead of ignoring it.
    #[arg(long)]
    reject_malformed_deadline: bool,
    /// Admission by an adaptive concurrency limit.
    #[arg(long, value_enum)]
    limit: Option<LimitKind>,
    /// Idempotency-Key handling with this store: memory, sqlite:PATH (postgres://, redis://
    /// when built with those features).
    #[arg(long)]
    idempotency: Option<String>,
    /// With --idempotency: refuse POST and PATCH without a key (400).
    #[arg(long, requires = "idempotency")]
    require_key: bool,
}

/// The adaptive limit algorithms.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum LimitKind {
    Aimd,
    Vegas,
    Gradient2,
}

fn abort(s: &str) -> Result<(f64, Abort), String> {
    parse_abort(s).map_err(|e| e.to_string())
}

fn delay(s: &str) -> Result<(f64, Latency), String> {
    parse_delay(s).map_err(|e| e.to_string())
}

fn upstream(s: &str) -> Result<Upstream, Failure> {
    s.parse()
        .map_err(|e: stormguard_proxy::InvalidUpstream| Failure::Usage(format!("--upstream: {e}")))
}

/// Runs the proxy until Ctrl-C.
pub(crate) fn run(command: ProxyCommand) -> Result<String, Failure> {
    let common = match &command {
        ProxyCommand::Egress(a) => &a.common,
        ProxyCommand::Ingress(a) => &a.common,
    };
    if !stormguard_proxy::init_json_logs(&common.log) {
        return Err(Failure::Usage(format!(
            "--log {:?} is not a filter",
            common.log
        )));
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = common.workers {
        if workers == 0 {
            return Err(Failure::Usage("--workers must be at least 1".to_owned()));
        }
        runtime.worker_threads(workers);
    }
    let runtime = runtime
        .enable_all()
        .build()
        .map_err(|e| Failure::Failed(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(async move {
        let config = config(command).await?;
        let proxy = Proxy::start(config)
            .await
            .map_err(|e| Failure::Usage(e.to_string()))?;
        tokio::select! {
            () = proxy.wait() => Err(Failure::Failed("the proxy stopped".to_owned())),
            _ = tokio::signal::ctrl_c() => Ok(String::new()),
        }
    })
}

async fn config(command: ProxyCommand) -> Result<ProxyConfig, Failure> {
    match command {
        ProxyCommand::Egress(a) => {
            let fault = match (a.fault_abort, a.fault_delay) {
                (None, None) => None,
                (abort, delay) => {
                    let mut fault = FaultConfig::new(seed());
                    if let Some((rate, abort)) = abort {
                        fault = fault.with_abort(rate, abort);
                    }
                    if let Some((rate, latency)) = delay {
                        fault = fault.with_latency(rate, latency);
                    }
                    Some(fault)
                }
            };
            Ok(ProxyConfig {
                listen: a.common.listen,
                admin: a.common.admin,
                upstream: a.upstream.as_deref().map(upstream).transpose()?,
                direction: Direction::Egress(EgressConfig {
                    policy: PolicySource::Watched(a.policy),
                    fault,
                    seed: None,
                }),
            })
        }
        ProxyCommand::Ingress(a) => {
            let mut deadline = DeadlineLayer::new();
            if let Some(d) = a.default_timeout {
                deadline = deadline.with_default_timeout(d);
            }
            if let Some(d) = a.max_timeout {
                deadline = deadline.with_max(d);
            }
            if a.reject_malformed_deadline {
                deadline = deadline.with_malformed(MalformedPolicy::Reject);
            }
            let limit = a.limit.map(|kind| match kind {
                LimitKind::Aimd => LimiterConfig::new(Aimd::new()),
                LimitKind::Vegas => LimiterConfig::new(Vegas::new()),
                LimitKind::Gradient2 => LimiterConfig::new(Gradient2::new()),
            });
            let idempotency = match a.idempotency {
                Some(url) => Some(IdempotencyConfig {
                    store: stormguard_proxy::open_store(&url)
                        .await
                        .map_err(|e| Failure::Usage(format!("--idempotency: {e}")))?,
                    key_required: a.require_key,
                }),
                None => None,
            };
            Ok(ProxyConfig {
                listen: a.common.listen,
                admin: a.common.admin,
                upstream: Some(upstream(&a.upstream)?),
                direction: Direction::Ingress(IngressConfig {
                    deadline,
                    limit,
                    idempotency,
                }),
            })
        }
    }
}

/// A seed for the fault draws that differs between runs.
fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
