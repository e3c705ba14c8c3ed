//! `stormguard proxy ingress|egress …`: the sidecar proxy (crate `stormguard-proxy`), run
//! until Ctrl-C. This module only turns flags into a [`ProxyConfig`]; a bad flag or setting
//! exits with status 2, naming it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use stormguard::fault::{Abort, FaultConfig, Latency};
use stormguard::limit::{Aimd, Gradient2, LimiterConfig, Vegas};
use stormguard::policy::PolicyFile;
use stormguard_proxy::fault_spec::{parse_abort, parse_delay};
use stormguard_proxy::{
    CenterSource, CenterWatchConfig, Direction, EgressConfig, IdempotencyConfig, IngressConfig,
    PolicySource, PoolConfig, Proxy, ProxyConfig, Upstream,
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
    /// Admin port, `PORT` (on 127.0.0.1) or `ADDR:PORT`: GET /metrics (Prometheus), GET
    /// /status (policy version, breakers), POST /faults/on|off. It binds loopback unless an
    /// address is given: the fault switch must not be reachable by the traffic proxied.
    #[arg(long, value_parser = admin_addr)]
    admin: Option<SocketAddr>,
    /// Log filter for the JSON log lines on stderr (RUST_LOG syntax).
    #[arg(long, default_value = "info")]
    log: String,
    /// Runtime worker threads (default: one per core). 1 runs the proxy on one thread
    /// (tokio's current-thread runtime: no work stealing, the cheapest per request).
    #[arg(long)]
    workers: Option<usize>,
    /// On SIGTERM or Ctrl-C, let open connections finish for at most this long.
    #[arg(long, value_parser = parse::duration, default_value = "5s")]
    drain: Duration,
    /// A connect to the upstream that takes longer fails (and may be retried: nothing was
    /// sent). Default 5s; at most 60s. An egress route whose policy sets `timeouts.connect`
    /// uses that instead (also at most 60s).
    #[arg(long, value_parser = parse::duration)]
    connect_timeout: Option<Duration>,
    /// Upstream connections idle this long are closed; keep it under the upstream's own
    /// keep-alive (Node's is 5s). Default 4s; at most 1h.
    #[arg(long, value_parser = parse::duration)]
    idle_timeout: Option<Duration>,
}

impl Common {
    /// The upstream connection settings of the flags (checked when the proxy starts).
    fn pool(&self) -> PoolConfig {
        let mut pool = PoolConfig::new();
        if let Some(timeout) = self.connect_timeout {
            pool = pool.with_connect_timeout(timeout);
        }
        if let Some(timeout) = self.idle_timeout {
            pool = pool.with_idle_timeout(timeout);
        }
        pool
    }
}

/// `proxy egress`.
#[derive(Debug, Args)]
pub(crate) struct EgressArgs {
    #[command(flatten)]
    common: Common,
    /// The policy file (TOML or JSON): routes by method, host and path prefix; watched. With
    /// --center, the policies in use until the center's (or the last-good copy's) arrive.
    #[arg(long, required_unless_present = "center")]
    policy: Option<PathBuf>,
    /// Follow this policy center (http://center:7450) instead of watching the file.
    #[arg(long, requires_all = ["center_token", "service"])]
    center: Option<String>,
    /// The center's instance token for --service.
    #[arg(long, env = "STORMGUARD_CENTER_TOKEN", hide_env_values = true)]
    center_token: Option<String>,
    /// The service whose policies to follow at the center.
    #[arg(long)]
    service: Option<String>,
    /// This instance's name at the center (default: HOSTNAME-PID).
    #[arg(long, requires = "center")]
    instance: Option<String>,
    /// Keep the last applied center version in this file, and start from it.
    #[arg(long, requires = "center")]
    last_good: Option<PathBuf>,
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

/// `PORT` (loopback) or `ADDR:PORT`.
fn admin_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse()
        .map_err(|_| format!("{s:?} is not PORT or ADDR:PORT"))
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
    let drain = common.drain;
    let mut runtime = match common.workers {
        Some(0) => return Err(Failure::Usage("--workers must be at least 1".to_owned())),
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(workers) => {
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            runtime.worker_threads(workers);
            runtime
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = runtime
        .enable_all()
        .build()
        .map_err(|e| Failure::Failed(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(async move {
        let config = config(command).await?;
        let mut proxy = Proxy::start(config)
            .await
            .map_err(|e| Failure::Usage(e.to_string()))?;
        announce(&proxy)?;
        tokio::select! {
            () = proxy.wait() => return Err(Failure::Failed("the proxy stopped".to_owned())),
            () = stop_signal() => {}
        }
        proxy.shutdown(drain).await;
        Ok(String::new())
    })
}

/// Ctrl-C, or SIGTERM (what a container runtime sends before it kills).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Prints the bound addresses as the first line of stdout, `{"listen":"…","admin":"…"}`:
/// what a supervisor or a test that asked for port 0 reads.
fn announce(proxy: &Proxy) -> Result<(), Failure> {
    crate::run::announce(&serde_json::json!({
        "listen": proxy.local_addr().to_string(),
        "admin": proxy.admin_addr().map(|a| a.to_string()),
    }))
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
                pool: a.common.pool(),
                upstream: a.upstream.as_deref().map(upstream).transpose()?,
                direction: Direction::Egress(EgressConfig {
                    policy: policy_source(
                        a.policy,
                        a.center,
                        a.center_token,
                        a.service,
                        a.instance,
                        a.last_good,
                    )?,
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
                pool: a.common.pool(),
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

/// The file to watch, or the center to follow (clap has checked that the center comes with
/// its token and service, and that a file is given without a center).
fn policy_source(
    file: Option<PathBuf>,
    center: Option<String>,
    token: Option<String>,
    service: Option<String>,
    instance: Option<String>,
    last_good: Option<PathBuf>,
) -> Result<PolicySource, Failure> {
    let Some(url) = center else {
        return file
            .map(PolicySource::Watched)
            .ok_or_else(|| Failure::Usage("--policy or --center is required".to_owned()));
    };
    let (Some(token), Some(service)) = (token, service) else {
        return Err(Failure::Usage(
            "--center needs --center-token and --service".to_owned(),
        ));
    };
    let instance = instance.unwrap_or_else(default_instance);
    let mut watch = CenterWatchConfig::new(&url, &service, &instance, &token);
    if let Some(path) = last_good {
        watch = watch.with_last_good(path);
    }
    let initial = file
        .map(|path| PolicyFile::load(&path).map_err(|e| Failure::Usage(format!("--policy: {e}"))))
        .transpose()?;
    Ok(PolicySource::Center(Box::new(CenterSource {
        watch,
        initial,
    })))
}

/// `HOSTNAME-PID`: distinct per process, recognisable per host.
fn default_instance() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "proxy".to_owned());
    format!("{host}-{}", std::process::id())
}

/// A seed for the fault draws that differs between runs.
fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
