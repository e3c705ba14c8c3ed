//! The verification harness: the platform simulator against the service under four
//! scenarios, checked against the invariants that make a payment callback correct.
//!
//! | scenario | what happens | extra checks |
//! | --- | --- | --- |
//! | `duplicates` | one callback delivered 1000 times within 60 s (scaled), half at once | — |
//! | `crash` | a burst of distinct and duplicate callbacks; the service *process* is killed (`SIGKILL`) mid-burst and restarted | — |
//! | `network-faults` | a proxy resets 5 % of connections and drops 10 % of answers | faults were injected |
//! | `risk-down` | the risk service answers 503 for a while | failures while down are `500` + `X-Retry-Exhausted`; retries while down stay within the budget |
//!
//! In every scenario the risk service fails 12 % of calls (503) and adds 5–40 ms; the
//! service runs in-process except in `crash`, where it is a child process.
//!
//! Every scenario checks the same core invariants once the platform is done and the outbox
//! has drained: every notification was finally answered `success` (none lost), each order has
//! exactly one payment row, one outbox message, one distinct event in the broker (which may
//! hold a message twice: publishing is at least once), exactly one applied notification,
//! and every answer came within the 4.5 s business deadline.
//!
//! Each scenario uses its own order numbers (a run id in the prefix), so runs on a shared
//! PostgreSQL, MariaDB, Redis, RabbitMQ or NATS never count each other's rows; `--fresh` also
//! deletes the demo's rows (and the broker's messages) first. Without `--database-url` each scenario gets a new
//! SQLite file.
//!
//! The risk service's seeded faults and the retry jitter repeat for a seed, but the figures
//! vary a little from run to run: concurrent requests draw from the fault generator in
//! arrival order, and the crash lands wherever the burst happens to be.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comfy_table::{Cell, Color, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use tokio::task::JoinSet;

use crate::broker::{Broker, BrokerCounts, BrokerError, BrokerUrl};
use crate::callback::PaymentCallback;
use crate::launcher::{LaunchError, Launcher};
use crate::platform::{Platform, PlatformError};
use crate::policy::{Policies, PolicyError};
use crate::risk::{RiskCounts, RiskFaults, RiskServer};
use crate::service::{BUSINESS_DEADLINE, CALLBACK_PATH, ServiceConfig, ServiceError};
use crate::signature::{EmptySecret, Signer};
use crate::store::{Counts, DatabaseUrl, Store, StoreError, StoreOptions};

mod scenarios;
use scenarios::{crash, duplicates, network_faults, risk_down};

/// The secret the demo's platform and service share (the demo only; pass a real one to
/// `serve --secret`).
pub const DEMO_SECRET: &str = "stormguard-demo-secret";

/// A scenario of the harness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Scenario {
    /// One callback delivered many times, half of them at once.
    Duplicates,
    /// The service process is killed mid-burst and restarted.
    Crash,
    /// Resets and dropped answers between platform and service.
    NetworkFaults,
    /// The risk service is down for a while.
    RiskDown,
}

impl Scenario {
    /// All scenarios, in the order they run.
    pub const ALL: [Scenario; 4] = [
        Scenario::Duplicates,
        Scenario::Crash,
        Scenario::NetworkFaults,
        Scenario::RiskDown,
    ];

    /// The name on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Duplicates => "duplicates",
            Scenario::Crash => "crash",
            Scenario::NetworkFaults => "network-faults",
            Scenario::RiskDown => "risk-down",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Scenario::Duplicates => "dup",
            Scenario::Crash => "crash",
            Scenario::NetworkFaults => "net",
            Scenario::RiskDown => "down",
        }
    }
}

/// How to run the harness.
#[derive(Clone, Debug)]
pub struct HarnessConfig {
    /// Shortened runs (CI).
    pub quick: bool,
    /// The database; `None` for a fresh SQLite file per scenario.
    pub database: Option<DatabaseUrl>,
    /// The broker `order.paid` goes through.
    pub broker: BrokerUrl,
    /// Delete the demo's rows at the start of each scenario.
    pub fresh: bool,
    /// The platform's schedule and the duplicates window are divided by this (at least 1).
    pub time_scale: f64,
    /// Seed of every random draw (faults, jitter).
    pub seed: u64,
    /// The scenarios to run, in order.
    pub scenarios: Vec<Scenario>,
    /// How to start the service as a child process (needed by `crash`).
    pub launcher: Option<Launcher>,
    /// Where child processes append their logs.
    pub log_file: Option<PathBuf>,
}

impl HarnessConfig {
    /// The defaults: full runs of every scenario on SQLite, time scale 1000, seed 42.
    pub fn new(launcher: Option<Launcher>) -> Self {
        HarnessConfig {
            quick: false,
            database: None,
            broker: BrokerUrl::Table,
            fresh: false,
            time_scale: 1000.0,
            seed: 42,
            scenarios: Scenario::ALL.to_vec(),
            launcher,
            log_file: None,
        }
    }
}

/// The harness could not run (as opposed to: it ran and found a violation).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The database.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The broker.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The service.
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// The child process.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The platform's client.
    #[error(transparent)]
    Platform(#[from] PlatformError),
    /// The policy file.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The secret.
    #[error(transparent)]
    Secret(#[from] EmptySecret),
    /// A local socket (risk service, proxy) or the temporary directory.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// `crash` needs a child process, and no launcher was given.
    #[error("the crash scenario needs the service binary (no launcher given)")]
    NoLauncher,
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> HarnessError {
    move |source| HarnessError::Io { what, source }
}

/// The figures and verdict of one scenario.
#[derive(Clone, Debug)]
pub struct ScenarioResult {
    /// Which.
    pub scenario: Scenario,
    /// The database kind.
    pub database: &'static str,
    /// The broker kind.
    pub broker_kind: &'static str,
    /// Notifications the platform sent (each redelivered until `success`).
    pub notifications: u64,
    /// Of which finally answered `success`.
    pub delivered: u64,
    /// HTTP deliveries, redeliveries included.
    pub deliveries: u64,
    /// Deliveries not answered `success` (HTTP failures and transport failures).
    pub failed_deliveries: u64,
    /// … of which answered `500` with `X-Retry-Exhausted: true`.
    pub retry_exhausted: u64,
    /// Distinct orders in the scenario.
    pub orders: i64,
    /// The database's rows for them.
    pub counts: Counts,
    /// The broker's messages for them.
    pub broker: BrokerCounts,
    /// The longest time to an HTTP answer.
    pub max_latency: Duration,
    /// What the risk service saw.
    pub risk: RiskCounts,
    /// Wall time of the scenario.
    pub wall: Duration,
    /// Scenario-specific figures.
    pub notes: Vec<String>,
    /// Broken invariants; empty means pass.
    pub violations: Vec<String>,
}

impl ScenarioResult {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Scenario sizes.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    duplicates: usize,
    crash_orders: usize,
    crash_burst: Duration,
    network_orders: usize,
    network_window: Duration,
    down_orders: usize,
    down_window: Duration,
    down_from: Duration,
    down_for: Duration,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        let ms = Duration::from_millis;
        if quick {
            Sizes {
                duplicates: 200,
                crash_orders: 90,
                crash_burst: ms(600),
                network_orders: 200,
                network_window: ms(800),
                down_orders: 90,
                down_window: ms(1000),
                down_from: ms(200),
                down_for: ms(600),
            }
        } else {
            Sizes {
                duplicates: 1000,
                crash_orders: 300,
                crash_burst: ms(1000),
                network_orders: 1000,
                network_window: ms(2000),
                down_orders: 300,
                down_window: ms(2000),
                down_from: ms(400),
                down_for: ms(1200),
            }
        }
    }
}

/// The baseline risk faults of every scenario: 12 % failures, 5–40 ms extra latency.
fn risk_faults(seed: u64) -> Arc<RiskFaults> {
    Arc::new(
        RiskFaults::new(seed)
            .with_failure_rate(0.12)
            .with_latency(Duration::from_millis(5), Duration::from_millis(40)),
    )
}

/// A run id for order numbers: unique per process and start time, letters and digits only.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("R{:x}{:x}", std::process::id(), nanos & 0xff_ffff_ffff)
}

/// Where one scenario's data lives, and the harness's own connection to check it.
struct Env {
    url: DatabaseUrl,
    verifier: Store,
    broker: Broker,
    _dir: Option<tempfile::TempDir>,
}

impl Env {
    async fn prepare(config: &HarnessConfig, scenario: Scenario) -> Result<Env, HarnessError> {
        let (url, dir) = match &config.database {
            Some(url) => (url.clone(), None),
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("stormguard-payment-")
                    .tempdir()
                    .map_err(io("creating a temporary directory"))?;
                let path = dir.path().join(format!("{}.db", scenario.name()));
                (DatabaseUrl::Sqlite(path), Some(dir))
            }
        };
        let verifier = Store::connect(
            &url,
            StoreOptions {
                acquire_timeout: Duration::from_secs(10),
                max_connections: 2,
            },
        )
        .await?;
        let broker = Broker::connect(&config.broker, &verifier).await?;
        broker.audit().await?;
        if config.fresh {
            verifier.reset().await?;
            broker.reset().await?;
        }
        Ok(Env {
            url,
            verifier,
            broker,
            _dir: dir,
        })
    }
}

/// Sends every `(at, callback)` at its time (after the platform started) and redelivers
/// until answered; returns (notifications, delivered).
async fn send_all(platform: &Arc<Platform>, plan: Vec<(Duration, PaymentCallback)>) -> (u64, u64) {
    let mut tasks = JoinSet::new();
    let notifications = plan.len() as u64;
    for (at, cb) in plan {
        let platform = platform.clone();
        tasks.spawn(async move {
            let wait = at.saturating_sub(platform.elapsed());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            platform.notify(&cb).await.delivered
        });
    }
    let mut delivered = 0;
    while let Some(done) = tasks.join_next().await {
        if matches!(done, Ok(true)) {
            delivered += 1;
        }
    }
    (notifications, delivered)
}

/// `orders` distinct callbacks, every `dup_every`-th sent twice, spread evenly over `window`.
fn burst(
    prefix: &str,
    orders: usize,
    dup_every: usize,
    window: Duration,
) -> Vec<(Duration, PaymentCallback)> {
    let mut plan = Vec::new();
    let step = window.div_f64(orders.max(1) as f64);
    for i in 0..orders {
        let cb = PaymentCallback::paid(format!("{prefix}{i}"), format!("WX{i}"), 100 + i as u64);
        let at = step * u32::try_from(i).unwrap_or(u32::MAX);
        if dup_every > 0 && i % dup_every == 0 {
            // The duplicate a moment later: often concurrently with the first.
            plan.push((at + step / 2, cb.clone()));
        }
        plan.push((at, cb));
    }
    plan
}

/// What a scenario leaves for the common checks.
struct Ran {
    platform: Arc<Platform>,
    orders: i64,
    notifications: u64,
    delivered: u64,
    counts: Counts,
    broker: BrokerCounts,
    notes: Vec<String>,
    violations: Vec<String>,
}

/// Everything a scenario runs against.
struct Ctx<'a> {
    config: &'a HarnessConfig,
    sizes: Sizes,
    env: Env,
    prefix: String,
    faults: Arc<RiskFaults>,
    risk: RiskServer,
    signer: Signer,
}

impl Ctx<'_> {
    fn service_config(&self) -> Result<ServiceConfig, HarnessError> {
        Ok(ServiceConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            database: self.env.url.clone(),
            risk_url: self.risk.url(),
            broker: self.config.broker.clone(),
            secret: DEMO_SECRET.to_owned(),
            policies: Policies::default_policies()?,
            seed: self.config.seed,
            deadline: BUSINESS_DEADLINE,
            bind_patience: Duration::ZERO,
        })
    }

    fn platform(&self, addr: SocketAddr) -> Result<Arc<Platform>, HarnessError> {
        Ok(Arc::new(Platform::new(
            format!("http://{addr}{CALLBACK_PATH}"),
            self.signer.clone(),
            self.config.time_scale,
        )?))
    }

    /// Waits until the outbox has drained for `orders` orders and the consumer has
    /// acknowledged every message (at most 30 s), and returns the final counts.
    async fn drained(&self, orders: i64) -> Result<(Counts, BrokerCounts), HarnessError> {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let c = self.env.verifier.counts(&self.prefix).await?;
            let business =
                c.outbox_published >= orders && c.applied >= orders && c.outbox >= orders;
            // The broker is counted only once the database says everything went through.
            if business || Instant::now() >= until {
                let b = self.env.broker.counts(&self.prefix).await?;
                if b.acked >= b.messages || Instant::now() >= until {
                    return Ok((c, b));
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// Runs one scenario.
pub async fn run_scenario(
    config: &HarnessConfig,
    scenario: Scenario,
) -> Result<ScenarioResult, HarnessError> {
    let started = Instant::now();
    let env = Env::prepare(config, scenario).await?;
    let faults = risk_faults(config.seed);
    let risk = RiskServer::start(faults.clone())
        .await
        .map_err(io("starting the risk service"))?;
    let ctx = Ctx {
        config,
        sizes: Sizes::new(config.quick),
        env,
        prefix: format!("{}-{}-", run_id(), scenario.tag()),
        faults,
        risk,
        signer: Signer::new(DEMO_SECRET)?,
    };
    let ran = match scenario {
        Scenario::Duplicates => duplicates(&ctx).await,
        Scenario::Crash => crash(&ctx).await,
        Scenario::NetworkFaults => network_faults(&ctx).await,
        Scenario::RiskDown => risk_down(&ctx).await,
    };
    let risk_counts = ctx.faults.counts();
    let database = ctx.env.url.kind();
    let broker_kind = config.broker.kind();
    ctx.env.verifier.close().await;
    ctx.risk.stop().await;
    Ok(conclude(
        scenario,
        (database, broker_kind),
        ran?,
        risk_counts,
        started.elapsed(),
    ))
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Checks the invariants every scenario shares.
fn conclude(
    scenario: Scenario,
    (database, broker_kind): (&'static str, &'static str),
    ran: Ran,
    risk: RiskCounts,
    wall: Duration,
) -> ScenarioResult {
    let stats = ran.platform.stats();
    let mut violations = ran.violations;
    let n = ran.counts;
    let b = ran.broker;
    let o = ran.orders;
    if ran.delivered != ran.notifications {
        violations.push(format!(
            "{} of {} notifications never answered success (lost)",
            ran.notifications - ran.delivered,
            ran.notifications
        ));
    }
    if n.orders != o {
        violations.push(format!("{} payment rows for {o} orders", n.orders));
    }
    if n.outbox != o || n.outbox_published != o {
        violations.push(format!(
            "outbox: {} messages ({} published) for {o} orders",
            n.outbox, n.outbox_published
        ));
    }
    if b.distinct != o {
        violations.push(format!(
            "broker: {} distinct events for {o} orders",
            b.distinct
        ));
    }
    if b.acked != b.messages {
        violations.push(format!(
            "broker: {} of {} messages not consumed",
            b.messages - b.acked,
            b.messages
        ));
    }
    if n.applied != o || n.applied_distinct != o {
        violations.push(format!(
            "consumer applied {} events ({} distinct) for {o} orders",
            n.applied, n.applied_distinct
        ));
    }
    if stats.max_latency > BUSINESS_DEADLINE {
        violations.push(format!(
            "an answer took {:?}, over the {BUSINESS_DEADLINE:?} deadline",
            stats.max_latency
        ));
    }
    ScenarioResult {
        scenario,
        database,
        broker_kind,
        notifications: ran.notifications,
        delivered: ran.delivered,
        deliveries: stats.deliveries,
        failed_deliveries: stats.http_failures + stats.transport_failures,
        retry_exhausted: stats.retry_exhausted,
        orders: o,
        counts: n,
        broker: b,
        max_latency: stats.max_latency,
        risk,
        wall,
        notes: ran.notes,
        violations,
    }
}

/// Runs the configured scenarios in order, reporting progress on stderr.
pub async fn run(config: &HarnessConfig) -> Result<Vec<ScenarioResult>, HarnessError> {
    let mut results = Vec::new();
    for &scenario in &config.scenarios {
        eprintln!(
            "payment-callback: running {} ({})…",
            scenario.name(),
            if config.quick { "quick" } else { "full" }
        );
        let result = run_scenario(config, scenario).await?;
        eprintln!(
            "payment-callback: {} {} in {:.1} s",
            scenario.name(),
            if result.passed() { "passed" } else { "FAILED" },
            result.wall.as_secs_f64()
        );
        results.push(result);
    }
    Ok(results)
}

/// The verification table, then each scenario's notes and violations.
pub fn render(results: &[ScenarioResult]) -> String {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(vec![
            "scenario",
            "db",
            "notifications",
            "deliveries",
            "failed (exhausted)",
            "rows",
            "events (published)",
            "max latency",
            "risk retry rate",
            "risk attempts/request",
            "wall",
            "result",
        ]);
    for r in results {
        let verdict = if r.passed() {
            Cell::new("pass").fg(Color::Green)
        } else {
            Cell::new("FAIL").fg(Color::Red)
        };
        table.add_row(vec![
            Cell::new(r.scenario.name()),
            Cell::new(if r.broker_kind == "table" {
                r.database.to_owned()
            } else {
                format!("{}+{}", r.database, r.broker_kind)
            }),
            Cell::new(format!("{}/{}", r.delivered, r.notifications)),
            Cell::new(r.deliveries),
            Cell::new(format!("{} ({})", r.failed_deliveries, r.retry_exhausted)),
            Cell::new(format!("{}/{}", r.counts.orders, r.orders)),
            Cell::new(format!("{} ({})", r.counts.applied, r.broker.messages)),
            Cell::new(format!("{} ms", r.max_latency.as_millis())),
            Cell::new(format!("{:.1} %", 100.0 * r.risk.retry_rate())),
            Cell::new(format!(
                "{:.3}",
                ratio(r.risk.requests, r.risk.first_attempts())
            )),
            Cell::new(format!("{:.1} s", r.wall.as_secs_f64())),
            verdict,
        ]);
    }
    let mut out = table.to_string();
    out.push('\n');
    for r in results {
        for note in &r.notes {
            let _ = writeln!(out, "{}: {note}", r.scenario.name());
        }
        for v in &r.violations {
            let _ = writeln!(out, "{}: VIOLATED: {v}", r.scenario.name());
        }
    }
    let _ = writeln!(
        out,
        "notifications: answered success / sent; rows: payment rows / orders; events: applied once by the consumer (messages in the broker, at least once); retry rate: retries / all requests seen by the risk service"
    );
    out
}
