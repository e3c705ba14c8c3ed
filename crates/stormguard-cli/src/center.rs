//! `stormguard center`: runs a policy center replica (the `stormguard-center` crate).
//!
//! SQLite in a file by default, so a center runs with nothing to install; `--database-url
//! postgres://…` for several replicas on one database. Logs are JSON lines on stderr;
//! `/metrics` serves the Prometheus text. Deny by default: without `--admin-token` (or
//! `STORMGUARD_CENTER_ADMIN_TOKEN`) and no token in the database, nobody can do anything,
//! so the first start sets one and the admin makes the others (`POST /v1/tokens`).
//!
//! The center runs its services' metric-driven rules on numbers it collects every
//! `--collect-interval` (1 s): by default it scrapes the `/metrics` of each instance that
//! announced one with its watch, and of each `--scrape SERVICE=INSTANCE=URL`; with
//! `--prometheus URL` it asks that Prometheus server instead (PromQL over its HTTP API,
//! `--prometheus-selector` choosing a service's series, `rate()` over `--prometheus-window`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use stormguard_center::collect::DEFAULT_SELECTOR;
use stormguard_center::fanout::NatsFanout;
use stormguard_center::metric_names::PUBLISH_TO_ACK;
use stormguard_center::{
    Center, CenterConfig, CollectConfig, Collector, PrometheusSource, Role, RuleRunner,
    ScrapeTargets, Source, Store,
};

use crate::run::Failure;

/// The options of `stormguard center`.
#[derive(Debug, Args)]
pub(crate) struct CenterArgs {
    /// The address to listen on (port 0: any free port; the bound address is printed as
    /// the first stdout line, `{"listen":"127.0.0.1:PORT"}`).
    #[arg(long, default_value = "127.0.0.1:7450")]
    listen: SocketAddr,
    /// The store: sqlite://FILE (created if missing) or postgres://USER@HOST/DB.
    #[arg(long, default_value = "sqlite://stormguard-center.db")]
    database_url: String,
    /// An admin token to accept (stored hashed); with none stored yet, nothing is allowed.
    #[arg(long, env = "STORMGUARD_CENTER_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Also put every stable version into a NATS JetStream key-value bucket
    /// (nats://HOST:4222), for instances that watch the bucket instead of the center.
    #[arg(long)]
    fanout: Option<String>,
    /// The bucket of --fanout.
    #[arg(long, default_value = stormguard_center::fanout::DEFAULT_BUCKET)]
    fanout_bucket: String,
    /// The largest request body, in bytes.
    #[arg(long, default_value_t = 1024 * 1024)]
    body_limit: usize,
    /// Refuse a publish whose policies have a `policy lint` finding at or above this
    /// severity (never: publish whatever validates). Rollbacks are not linted.
    #[arg(long, value_enum, default_value_t = crate::governance::FailOn::Error)]
    lint_blocks: crate::governance::FailOn,
    /// How often the rules' numbers are collected (scraped or queried).
    #[arg(long, default_value = "1s", value_parser = crate::parse::duration)]
    collect_interval: Duration,
    /// Also scrape this instance's /metrics: SERVICE=INSTANCE=URL (repeatable), for
    /// instances that do not announce theirs with their watch.
    #[arg(long = "scrape", value_name = "SERVICE=INSTANCE=URL")]
    scrape: Vec<String>,
    /// Read the rules' numbers from this Prometheus server (http://HOST:9090) with PromQL
    /// instead of scraping the instances.
    #[arg(long)]
    prometheus: Option<String>,
    /// The label matchers of a service's series in Prometheus, {service} replaced by its
    /// name.
    #[arg(long, default_value = DEFAULT_SELECTOR)]
    prometheus_selector: String,
    /// The window of each rate() (at least twice Prometheus's scrape interval).
    #[arg(long, default_value = "1m", value_parser = crate::parse::duration)]
    prometheus_window: Duration,
    /// At most this many automatic changes (rule firings and reverts) per service per hour.
    #[arg(long, default_value_t = stormguard::rules::DEFAULT_CHANGES_PER_HOUR)]
    max_rule_changes_per_hour: u32,
}

/// Runs the center until Ctrl-C.
pub(crate) fn run(args: CenterArgs) -> Result<String, Failure> {
    if args.admin_token.as_ref().is_some_and(|t| t.len() < 16) {
        return Err(Failure::Usage(
            "--admin-token: at least 16 characters".to_owned(),
        ));
    }
    if args.collect_interval.is_zero() {
        return Err(Failure::Usage(
            "--collect-interval: must be more than 0".to_owned(),
        ));
    }
    if let Some(url) = &args.prometheus {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| Failure::Usage(format!("--prometheus {url:?}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Failure::Usage(format!(
                "--prometheus {url:?}: not an http or https URL"
            )));
        }
    }
    if args.prometheus.is_some() && !args.scrape.is_empty() {
        return Err(Failure::Usage(
            "--scrape and --prometheus: choose one source".to_owned(),
        ));
    }
    // Checked here, before anything opens the store: a typo costs nothing.
    let checked = ScrapeTargets::default();
    for target in &args.scrape {
        let (service, instance, url) = scrape_target(target)?;
        checked
            .add_static(service, instance, url)
            .map_err(|e| Failure::Usage(format!("--scrape {target:?}: {e}")))?;
    }
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Io(format!("tokio runtime: {e}")))?;
    runtime.block_on(serve(args))?;
    Ok(String::new())
}

async fn serve(args: CenterArgs) -> Result<(), Failure> {
    let seconds = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let metrics = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(PUBLISH_TO_ACK.to_owned()), &seconds)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| Failure::Failed(format!("metrics: {e}")))?;
    let store = Store::open(&args.database_url)
        .await
        .map_err(|e| Failure::Failed(format!("--database-url: {e}")))?;
    let fanout = match &args.fanout {
        None => None,
        Some(url) => Some(
            NatsFanout::connect(url, &args.fanout_bucket)
                .await
                .map_err(|e| Failure::Failed(format!("--fanout: {e}")))?,
        ),
    };
    let config = CenterConfig {
        body_limit: args.body_limit,
        lint_blocks: args.lint_blocks.threshold(),
        metrics: Some(metrics),
        fanout,
        ..CenterConfig::default()
    };
    let center = Center::new(store, config)
        .await
        .map_err(|e| Failure::Failed(format!("center: {e}")))?;
    if let Some(token) = &args.admin_token {
        center
            .add_token(token, "admin", Role::Admin, None)
            .await
            .map_err(|e| Failure::Failed(format!("admin token: {e}")))?;
    }
    start_collecting(&center, &args)?;
    let listener = stormguard_tower::listen::bind(args.listen)
        .await
        .map_err(|e| Failure::Usage(format!("--listen {}: {e}", args.listen)))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::Io(format!("--listen {}: {e}", args.listen)))?;
    crate::run::announce(&serde_json::json!({ "listen": bound.to_string() }))?;
    tracing::info!(listen = %bound, store = %store_kind(&args.database_url), "stormguard center serving");
    center
        .serve(listener, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| Failure::Io(format!("serving: {e}")))
}

/// Lists the `--scrape` targets and starts the collector and the rules it feeds.
fn start_collecting(center: &Center, args: &CenterArgs) -> Result<(), Failure> {
    for target in &args.scrape {
        let (service, instance, url) = scrape_target(target)?;
        center
            .scrape_targets()
            .add_static(service, instance, url)
            .map_err(|e| Failure::Usage(format!("--scrape {target:?}: {e}")))?;
    }
    let source = match &args.prometheus {
        None => Source::Scrape,
        Some(url) => Source::Prometheus(PrometheusSource {
            selector: args.prometheus_selector.clone(),
            window: args.prometheus_window,
            ..PrometheusSource::new(url)
        }),
    };
    let config = CollectConfig {
        source,
        interval: args.collect_interval,
        timeout: args.collect_interval.max(Duration::from_secs(1)),
        ..CollectConfig::default()
    };
    let runner = Arc::new(RuleRunner::new(
        center.clone(),
        args.max_rule_changes_per_hour,
    ));
    let collector = Collector::new(center.clone(), runner, config);
    tokio::spawn(collector.run(std::future::pending()));
    Ok(())
}

/// `SERVICE=INSTANCE=URL` split (the URL may hold `=`).
fn scrape_target(target: &str) -> Result<(&str, &str, &str), Failure> {
    let mut parts = target.splitn(3, '=');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(service), Some(instance), Some(url))
            if !service.is_empty() && !instance.is_empty() =>
        {
            Ok((service, instance, url))
        }
        _ => Err(Failure::Usage(format!(
            "--scrape {target:?}: expected SERVICE=INSTANCE=URL"
        ))),
    }
}

/// The kind of store, for the log (never the URL: it may hold a password).
fn store_kind(url: &str) -> &'static str {
    if url.starts_with("sqlite:") {
        "sqlite"
    } else {
        "postgres"
    }
}
