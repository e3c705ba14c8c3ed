//! Metric collection: what the rules read, scraped from the instances or queried from
//! Prometheus, every few seconds.
//!
//! A rule is only as quick as its numbers: the seeds' center took 30 s from the CDN's
//! first 504 to the switch. A [`Collector`] reads each service's numbers every
//! [`CollectConfig::interval`] (1 s by default), records them in the center's
//! [`MetricHistory`], and hands them to the [`RuleRunner`]; with a rule `for = "2s"`, the
//! switch follows the first 504 after at most two rounds plus the hold, a few seconds.
//!
//! Two sources, one set of series ([`Source`]):
//!
//! - **Scrape** (the default, nothing else to run): each instance listed in the center's
//!   [`ScrapeTargets`] — announced by the instance with its watch, or listed by the operator —
//!   is read at its `/metrics` (the Prometheus text format, read by
//!   [`stormguard::advise::prometheus::exposition`]); the
//!   increase of each counter since the instance's previous scrape, over the time between
//!   the two, is its rate. An instance's first scrape is a baseline only.
//! - **PromQL** ([`PrometheusSource`]): the same rates from a Prometheus server that scrapes
//!   the fleet, `rate()` over a window, for the services that have rules.
//!
//! What each series is, per downstream endpoint (the `endpoint` label of the client stack's
//! metrics, [`stormguard_tower::metric_names`]), summed over the service's instances:
//!
//! | series | from |
//! |--------|------|
//! | `error_ratio` | `stormguard_requests_total` not `outcome="succeeded"` / all of it: failed calls / calls |
//! | `error_ratio{code}` | `stormguard_responses_total{code}` / all of it: attempts answered with the code / attempts that ended |
//! | `error_ratio{class}` | the same, summed over the class's codes (`5` → 500–599) |
//! | `p99` | the 99th percentile of the attempt duration `stormguard_attempt_duration_seconds` (each attempt, not each call: retries are separate samples), its buckets' increases summed over series and instances as `histogram_quantile` does; where the exporter renders a summary instead, its `quantile="0.99"`, the largest of the series' — a summary covers the exporter's rolling window (about a minute, not the round) and cannot be summed, so give the metric buckets ([`ATTEMPT_DURATION_BUCKETS`](stormguard_tower::metric_names::ATTEMPT_DURATION_BUCKETS)). Only where attempts ended in the round. |
//! | attempts per request (history only) | `stormguard_attempts_total` / `stormguard_requests_total` |
//!
//! and per service: `cpu`, the busiest instance's `process_cpu_seconds_total` rate divided by
//! the cores it may use (`process_cpu_allowance_cores`, which the client stack's
//! `describe_metrics` sets from `available_parallelism`, cgroup quota included), a fraction
//! 0..=1, absent for an instance that does not expose its allowance; `memory`, the largest
//! `process_resident_memory_bytes`; threads (history only), the most `process_threads` —
//! read where an instance exposes them. Ratios are clamped to 0..=1. A series with no
//! traffic behind it in a round is absent, and a rule on it neither holds nor clears.
//!
//! Bounds, since the targets are announced by the instances: [`MAX_TARGETS_PER_SERVICE`]
//! and [`MAX_TARGETS`] listed (an announcement beyond them is refused),
//! [`MAX_CONCURRENT_SCRAPES`] scrapes and [`MAX_CONCURRENT_SERVICES`] services in flight,
//! [`MAX_SCRAPE_BYTES`] per page, [`MAX_ENDPOINTS`] endpoints kept per instance and round
//! (the others counted in [`Round::dropped_endpoints`]).

mod counters;
mod history;
mod promql;
mod reading;
mod scrape;
mod targets;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use stormguard::clock::Clock;

pub use counters::MAX_ENDPOINTS;
pub use history::{
    DEFAULT_HISTORY_ROUNDS, EndpointTraffic, MAX_HISTORY_SERVICES, MetricHistory, Round,
};
pub use promql::{DEFAULT_SELECTOR, PrometheusSource, PromqlError};
pub use scrape::{MAX_CONCURRENT_SCRAPES, MAX_SCRAPE_BYTES};
pub use targets::{
    Announced, MAX_METRICS_URL, MAX_TARGETS, MAX_TARGETS_PER_SERVICE, ScrapeTargets,
};

use crate::rules::{RuleEvent, RuleRunner};
use crate::server::{Center, now_ms};
use crate::store::StoreError;
use promql::Promql;
use scrape::Scraper;

/// The interval between rounds when none is given.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// The most services read at once in one round.
pub const MAX_CONCURRENT_SERVICES: usize = 16;

/// Where the numbers come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// Each listed instance's `/metrics` ([`ScrapeTargets`]).
    Scrape,
    /// A Prometheus server's HTTP API.
    Prometheus(PrometheusSource),
}

/// How a [`Collector`] runs.
///
/// # Default
///
/// Scrapes every 1 s, each scrape or query given 1 s, scrapes stamped by tokio's clock.
#[derive(Clone, Debug)]
pub struct CollectConfig {
    /// Where the numbers come from.
    pub source: Source,
    /// The time between two rounds.
    pub interval: Duration,
    /// How long one scrape or one query may take.
    pub timeout: Duration,
    /// What stamps each scrape (the instant its body was read): rates are increases over
    /// the time between two stamps of the same instance.
    pub clock: Clock,
}

impl Default for CollectConfig {
    fn default() -> Self {
        CollectConfig {
            source: Source::Scrape,
            interval: DEFAULT_INTERVAL,
            timeout: DEFAULT_INTERVAL,
            clock: Clock::tokio(),
        }
    }
}

/// What one round did for one service.
#[derive(Debug)]
pub struct Collected {
    /// The service.
    pub service: String,
    /// What was read (also recorded in the center's [`MetricHistory`]); `None` when the
    /// source could not be read at all (see `error`).
    pub round: Option<Round>,
    /// What the rules did with it (nothing when nothing was read), or why they could not
    /// run.
    pub events: Result<Vec<RuleEvent>, StoreError>,
    /// Why nothing was read: Prometheus unreachable, refusing the query, or answering
    /// something else than its API's JSON. (A scrape that fails fails one instance, named
    /// in [`Round::failures`].)
    pub error: Option<PromqlError>,
}

/// Reads every service's numbers each round, records them, and runs the rules on them.
///
/// ```no_run
/// # async fn run(center: stormguard_center::Center) {
/// use std::sync::Arc;
/// use stormguard_center::{CollectConfig, Collector, RuleRunner};
///
/// let runner = Arc::new(RuleRunner::new(center.clone(), 6));
/// let collector = Collector::new(center.clone(), runner, CollectConfig::default());
/// tokio::spawn(collector.run(std::future::pending()));
/// // … later: what the dashboard charts
/// for round in center.metric_history().rounds("web") {
///     println!("{} {:?}", round.at_ms, round.error_ratio("GET /img/*"));
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Collector {
    center: Center,
    runner: Arc<RuleRunner>,
    interval: Duration,
    reader: Reader,
}

#[derive(Debug)]
enum Reader {
    Scrape(Scraper),
    Prometheus(Promql),
}

impl Collector {
    /// A collector for `center`, feeding `runner`.
    pub fn new(center: Center, runner: Arc<RuleRunner>, config: CollectConfig) -> Collector {
        let reader = match config.source {
            Source::Scrape => Reader::Scrape(Scraper::new(config.timeout, config.clock)),
            Source::Prometheus(source) => Reader::Prometheus(Promql::new(source, config.timeout)),
        };
        Collector {
            center,
            runner,
            interval: config.interval,
            reader,
        }
    }

    /// One round at `now` (the instant the rules' holds are measured on): every service
    /// read, its round recorded and its rules run, [`MAX_CONCURRENT_SERVICES`] at a time.
    /// Services: those with listed instances (scrape) or with rules (PromQL); PromQL
    /// evaluates every query of the round at one instant.
    pub async fn round(&self, now: Instant) -> Vec<Collected> {
        let services = match &self.reader {
            Reader::Scrape(scraper) => {
                let services = self.center.scrape_targets().services();
                scraper.keep_only(&services);
                services
            }
            Reader::Prometheus(_) => match self.center.store().rule_services().await {
                Ok(services) => services,
                Err(error) => {
                    tracing::warn!(%error, "stormguard center: the services with rules could not be read");
                    return Vec::new();
                }
            },
        };
        let evaluated_ms = now_ms();
        futures_util::stream::iter(services)
            .map(|service| async move { self.service_round(&service, now, evaluated_ms).await })
            .buffered(MAX_CONCURRENT_SERVICES)
            .collect()
            .await
    }

    async fn service_round(&self, service: &str, now: Instant, evaluated_ms: i64) -> Collected {
        let round = match &self.reader {
            Reader::Scrape(scraper) => {
                let scraped = scraper.scrape(self.center.scrape_targets(), service).await;
                Ok(scraped.reading.into_round(
                    now_ms(),
                    scraped.window_seconds,
                    scraped.instances,
                    scraped.failures,
                    scraped.dropped_endpoints,
                ))
            }
            Reader::Prometheus(promql) => {
                promql
                    .read(service, evaluated_ms)
                    .await
                    .map(|(reading, instances)| {
                        let window = promql.window().as_secs_f64();
                        reading.into_round(evaluated_ms, window, instances, Vec::new(), 0)
                    })
            }
        };
        match round {
            Ok(round) => {
                for failure in &round.failures {
                    tracing::debug!(
                        service,
                        failure,
                        "stormguard center: an instance was not scraped"
                    );
                }
                self.center.metric_history().record(service, round.clone());
                let events = self.runner.observe(service, &round.observations, now).await;
                if let Err(error) = &events {
                    tracing::warn!(%error, service, "stormguard center: the rules could not run");
                }
                Collected {
                    service: service.to_owned(),
                    round: Some(round),
                    events,
                    error: None,
                }
            }
            Err(error) => {
                tracing::warn!(%error, service, "stormguard center: nothing read this round");
                Collected {
                    service: service.to_owned(),
                    round: None,
                    events: Ok(Vec::new()),
                    error: Some(error),
                }
            }
        }
    }

    /// Runs a round every interval until `shutdown` completes (a round late by more than
    /// an interval is not caught up: the next starts an interval later).
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                tick = ticks.tick() => {
                    self.round(tick.into_std()).await;
                }
            }
        }
    }
}
