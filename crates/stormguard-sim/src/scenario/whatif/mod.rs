//! `policy` (the what-if): your own call graph and policy files, run with the production
//! policy objects while faults are injected.
//!
//! A policy review asks "what happens to the rest of the system when *this* service
//! fails?". The lint answers with formulas (∏ attempts along a path); this scenario answers
//! by running the graph: entry requests arrive, every call is made by the core's
//! [`RetryRun`](stormguard::retry::RetryRun) with the call's
//! [`EndpointPolicy`](stormguard::policy::EndpointPolicy) — its attempts, backoff, per-try
//! and overall timeouts, minimum call time, idempotency, its retry budget built by
//! [`BudgetSpec::build`](stormguard::policy::BudgetSpec::build) and its
//! [`CircuitBreaker`](stormguard::breaker::CircuitBreaker), all on the virtual clock — while
//! an outage, a latency spike or a 503 rate hits a service for a while. The same decision
//! code as the `chain` scenario and the tokio `Retrier`; no second retry loop. (As in the
//! `Retrier`, a first attempt runs under the budget's request guard alone and the run is
//! built from it when that attempt did not succeed: the budget hears the same calls.)
//!
//! # The model
//!
//! - **Endpoints** are the graph's endpoints. One that no endpoint of the graph calls is an
//!   *entry*: requests arrive there from outside, evenly spaced, at `rate` per second in all,
//!   shared by the entries in proportion to their `requests_per_sec` (equally when not every
//!   entry gives one). Without `rate`, the entries' `requests_per_sec` are used. After
//!   `duration` no request arrives, and the requests in flight go on (for at most the run's
//!   length again, or 60 s if longer) so that their retries are counted, as `chain` counts
//!   them; the series and the queue lengths at the end stop at `duration`.
//! - **Work.** A request first works for the endpoint's *own* time, drawn from its latency
//!   in the graph: with a histogram, the upper bound of a bucket drawn by its count (the
//!   bound the graph's percentiles are read as); with percentiles, the quantile function
//!   through (0, 0), each given percentile and (1, the last given), linear in between; with
//!   neither, no time. It then fails with the endpoint's `failure_rate` (a 503), or makes its
//!   calls one after the other in file order; the time of those calls comes on top of its
//!   own. It succeeds when every call succeeded, and fails (503) at the first call that
//!   failed.
//! - **Services** have `workers` (default: no limit) and a FIFO `queue` in front of them
//!   (default: no limit). A request holds its worker while it works *and* while it waits for
//!   its calls (a thread per request). A request that finds the queue full is answered with a
//!   503 at once.
//! - **Deadlines.** A call's deadline is the earlier of the request's deadline (less the
//!   policy's hop reserve) and the policy's overall timeout; each attempt's deadline is the
//!   earlier of that and its per-try timeout, and travels with the attempt. A service that
//!   `honours_deadline` (the default: stormguard's server deadline layer) drops a queued
//!   request whose deadline passed, at no cost, and stops working on one when its deadline
//!   passes (its worker is free again); one that does not works on for nobody. Budgets and
//!   breakers read the virtual clock to 0.1 ms.
//! - **Answers.** An attempt that reaches its deadline ends in doubt (retried only when the
//!   call is idempotent or keyed). A refused connection (an outage) is retryable; a 503 is
//!   retried when the call's `retry_on` lists 503. A service with `retry_signal` that gave
//!   up on a call it retries answers "already retried, don't retry"; its callers with
//!   `retry_signal` do not retry that answer.
//! - **Not modelled:** hedging (a hedged call sends one attempt), the adaptive throttle,
//!   connect timeouts, and time windows of a policy (the policy out of any window is used).
//!
//! # What is reported, per service
//!
//! Offered load (requests arriving per second, mean and peak bin), amplification (requests
//! at the service per entry request), success rate (of the requests that arrived), served
//! (the share that got a worker), latency P50/P99/P999 of its successful answers (arrival to
//! answer, queueing and calls included), its queue's peak and length at the end, and the
//! time to recover after the last injection ends: from that instant to the first bin from
//! which on every window of five bins has a success share at most 5 points below the share
//! before the first injection (1.0 when it started at once) and an offered load at most
//! 25 % above it — `None` when it never gets back before the run ends.

mod inject;
mod latency;
mod model;
mod stats;
mod world;

use std::time::Duration;

use serde::Serialize;
use stormguard::graph::CallGraph;

pub use inject::{Fault, Injection, MAX_SCALE};

use crate::error::{self, InvalidParam};
use crate::progress::Progress;
use crate::queue::unpack;
use crate::report::round;
use crate::rng;
use crate::time::{NANOS_PER_SEC, Nanos, nanos, nth_of_rate};
use crate::vclock::VirtualClock;
use model::Model;
use stats::{ServiceStats, recovery_bins};

/// The most bins a what-if run may have: each service keeps a series of that many counts.
pub const MAX_SERIES_BINS: u64 = 100_000;
use world::{ARRIVAL, TIMER, World};

/// How to run a graph.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WhatIfConfig {
    /// Entry requests per second in all; `None`: the entries' `requests_per_sec`.
    pub rate: Option<f64>,
    /// How long the run lasts.
    #[serde(with = "crate::report::seconds")]
    pub duration: Duration,
    /// The width of the time bins of the series.
    #[serde(with = "crate::report::seconds")]
    pub bin: Duration,
    /// The faults injected.
    pub injections: Vec<Injection>,
    /// Seed of every random draw.
    pub seed: u64,
}

impl Default for WhatIfConfig {
    /// The graph's own rates for 60 s, 1 s bins, no injection, seed 42.
    fn default() -> Self {
        WhatIfConfig {
            rate: None,
            duration: Duration::from_secs(60),
            bin: Duration::from_secs(1),
            injections: Vec::new(),
            seed: 42,
        }
    }
}

impl WhatIfConfig {
    /// Checks the parameters against `graph`; the error names the flag.
    pub fn validate(&self, graph: &CallGraph) -> Result<(), InvalidParam> {
        if let Some(rate) = self.rate {
            error::in_range("rate", rate, 1e-3, 1e7)?;
        }
        let run = error::positive_duration("duration", self.duration)?;
        let width = error::bin_width(self.bin, run)?;
        // Each service keeps a series of counts per bin: bounded well below the other
        // scenarios' limit, which hold one series in all.
        if run / width > MAX_SERIES_BINS {
            return Err(InvalidParam::new(
                "bin",
                format!(
                    "{:?} would cut the run into more than {MAX_SERIES_BINS} bins per service",
                    self.bin
                ),
            ));
        }
        for i in &self.injections {
            if graph.service(&i.service).is_none() {
                let names: Vec<&str> = graph.services().keys().map(String::as_str).collect();
                return Err(InvalidParam::new(
                    "inject",
                    format!(
                        "no service {:?} in the graph (it has: {})",
                        i.service,
                        names.join(", ")
                    ),
                ));
            }
            if i.start >= self.duration {
                return Err(InvalidParam::new(
                    "inject",
                    format!("{i} starts after the run's {:?}", self.duration),
                ));
            }
        }
        self.entries(graph).map(drop)
    }

    /// Each entry endpoint (by service and endpoint name) with its arrival rate.
    pub fn entries(&self, graph: &CallGraph) -> Result<Vec<(String, String, f64)>, InvalidParam> {
        let called: std::collections::BTreeSet<(&str, &str)> = graph
            .calls()
            .map(|(_, _, c)| (c.service.as_str(), c.endpoint.as_str()))
            .collect();
        let entries: Vec<(String, String, Option<f64>)> = graph
            .services()
            .iter()
            .flat_map(|(s, service)| {
                service
                    .endpoints
                    .iter()
                    .map(move |(e, endpoint)| (s, e, endpoint))
            })
            .filter(|(s, e, _)| !called.contains(&(s.as_str(), e.as_str())))
            .map(|(s, e, endpoint)| (s.clone(), e.clone(), endpoint.requests_per_sec))
            .collect();
        if entries.is_empty() {
            return Err(InvalidParam::new(
                "graph",
                "the graph has no endpoint to send requests to",
            ));
        }
        let given: Option<Vec<f64>> = entries.iter().map(|e| e.2).collect();
        let given = given.filter(|g| g.iter().sum::<f64>() > 0.0);
        let rates: Vec<f64> = match (self.rate, given) {
            (Some(total), Some(g)) => {
                let sum: f64 = g.iter().sum();
                g.iter().map(|r| total * r / sum).collect()
            }
            (Some(total), None) => vec![total / entries.len() as f64; entries.len()],
            (None, Some(g)) => g,
            (None, None) => {
                return Err(InvalidParam::new(
                    "rate",
                    "give --rate, or requests_per_sec on every entry endpoint of the graph",
                ));
            }
        };
        let total: f64 = rates.iter().sum();
        error::in_range("rate", total, 1e-3, 1e7)?;
        Ok(entries
            .into_iter()
            .zip(rates)
            .map(|((s, e, _), r)| (s, e, r))
            .collect())
    }
}

/// One service's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServiceRow {
    /// The service.
    pub service: String,
    /// Requests that arrived, the retries of requests in flight at the end included.
    pub requests: u64,
    /// Requests arriving per second, over the run.
    pub offered_per_sec: f64,
    /// The busiest bin's arrivals per second.
    pub peak_per_sec: f64,
    /// Requests at the service per entry request.
    pub amplification: f64,
    /// Requests answered with success, as a share of those that arrived.
    pub success_rate: f64,
    /// Requests that got a worker, as a share of those that arrived.
    pub served: f64,
    /// Requests dropped from the queue or stopped at their deadline.
    pub abandoned: u64,
    /// Latency of successful answers, in milliseconds.
    pub p50_ms: Option<f64>,
    /// The 99th percentile.
    pub p99_ms: Option<f64>,
    /// The 99.9th percentile.
    pub p999_ms: Option<f64>,
    /// The most requests waiting in its queue.
    pub queue_peak: usize,
    /// Requests waiting when the run ended.
    pub queue_at_end: usize,
    /// Seconds from the end of the last injection to recovery; `None`: no injection, or it
    /// never recovered.
    pub recover_s: Option<f64>,
    /// Whether it recovered (false also without an injection).
    pub recovered: bool,
    /// Arrivals per bin.
    pub offered_series: Vec<u64>,
    /// Successful answers per bin.
    pub ok_series: Vec<u64>,
    /// Requests that got a worker per bin.
    pub served_series: Vec<u64>,
}

/// One run of one graph.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WhatIfReport {
    /// Always `"policy"`.
    pub scenario: &'static str,
    /// Which graph: `"graph"` or `"against"`.
    pub version: String,
    /// The run's parameters.
    pub parameters: WhatIfConfig,
    /// Entry requests sent.
    pub entry_requests: u64,
    /// Entry requests answered with success, as a share of those sent.
    pub entry_success_rate: f64,
    /// One row per service, by name.
    pub services: Vec<ServiceRow>,
    /// Events handled.
    pub events: u64,
}

impl WhatIfReport {
    /// The row of `service`.
    pub fn service(&self, service: &str) -> Option<&ServiceRow> {
        self.services.iter().find(|s| s.service == service)
    }
}

/// Runs `graph` under `cfg`; `version` labels the report.
///
/// ```
/// use stormguard::graph::CallGraph;
/// use stormguard_sim::progress::NoProgress;
/// use stormguard_sim::scenario::whatif::{Injection, WhatIfConfig, run};
///
/// let graph = CallGraph::from_toml(r#"
///     [[services.web.endpoints."GET /".calls]]
///     to = "db"
///     endpoint = "GET /row"
///     policy = { retry = { max_attempts = 3 } }
///
///     [services.db.endpoints."GET /row"]
///     latency = { p50 = "2ms", p99 = "10ms" }
/// "#)?;
/// let cfg = WhatIfConfig {
///     rate: Some(100.0),
///     injections: vec![Injection::parse("outage:db@10s+10s")?],
///     ..WhatIfConfig::default()
/// };
/// let report = run(&graph, &cfg, "graph", &mut NoProgress)?;
/// let db = report.service("db").unwrap();
/// // A sixth of the run the database is down, and every call to it is tried three times.
/// assert!((db.amplification - (1.0 + 2.0 / 6.0)).abs() < 0.01);
/// assert!(db.recovered);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run(
    graph: &CallGraph,
    cfg: &WhatIfConfig,
    version: &str,
    progress: &mut dyn Progress,
) -> Result<WhatIfReport, InvalidParam> {
    cfg.validate(graph)?;
    let entries = cfg.entries(graph)?;
    let run_for = nanos(cfg.duration);
    let bin = nanos(cfg.bin);
    let probe = VirtualClock::new();
    let model = Model::compile(graph, &probe.clock(), cfg.seed)?;
    let mut vclock = if model.reads_clock {
        probe
    } else {
        VirtualClock::unread()
    };
    let bins = usize::try_from(run_for.div_ceil(bin.max(1))).unwrap_or(usize::MAX);
    let stats = model
        .services
        .iter()
        .map(|_| ServiceStats::new(bins))
        .collect::<Result<Vec<_>, _>>()?;
    let entry_nodes: Vec<(usize, f64)> = entries
        .iter()
        .filter_map(|(s, e, rate)| {
            let service = model.service_index(s)?;
            let names = graph.service(s)?.endpoints.keys();
            let offset = names.take_while(|n| *n != e).count();
            let first = model.nodes.iter().position(|n| n.service == service)?;
            Some((first + offset, *rate))
        })
        .collect();
    let expected: u64 = entry_nodes
        .iter()
        .map(|&(_, r)| arrivals_before(r, run_for))
        .sum();
    progress.start(expected);
    let mut w = World::new(
        &model,
        &cfg.injections,
        stats,
        bin,
        rng::stream(cfg.seed, 0x7768_6174),
    );
    let mut sent = vec![0u64; entry_nodes.len()];
    // An entry the graph gives no traffic (a rate of 0) gets no arrival at all.
    for (i, _) in entry_nodes
        .iter()
        .enumerate()
        .filter(|(_, (_, rate))| *rate > 0.0)
    {
        w.queue.push(0, crate::queue::pack(ARRIVAL, i as u32, 0));
    }
    let mut events = 0u64;
    let mut arrived = 0u64;
    let drain_until = run_for.saturating_add(run_for.max(DRAIN * NANOS_PER_SEC));
    let mut queued = None;
    let mut clock_next = 0;
    // The earliest instant at which any of the checks below has something to do: an event
    // before it passes them all with one comparison.
    let mut checkpoint = 0;
    while let Some((now, payload)) = w.queue.pop() {
        if now >= checkpoint {
            if now >= run_for && queued.is_none() {
                queued = Some(w.queued());
            }
            if now >= drain_until {
                break;
            }
            if now >= clock_next {
                vclock.advance_to(now);
                clock_next = now.saturating_add(CLOCK_RESOLUTION);
            }
            w.tick(now);
            let end_of_run = if queued.is_none() {
                run_for
            } else {
                Nanos::MAX
            };
            checkpoint = clock_next.min(w.bin_end()).min(drain_until).min(end_of_run);
        }
        events += 1;
        let (kind, slot, operand) = unpack(payload);
        match kind {
            ARRIVAL => {
                let Some(&(node, rate)) = entry_nodes.get(slot as usize) else {
                    continue;
                };
                w.entry(now, node)?;
                arrived += 1;
                if let Some(k) = sent.get_mut(slot as usize) {
                    *k += 1;
                    let next = nth_of_rate(0, *k, rate);
                    if next < run_for {
                        w.queue.push(next, crate::queue::pack(ARRIVAL, slot, 0));
                    }
                }
                if arrived % 65_536 == 0 {
                    progress.set(arrived);
                }
            }
            TIMER => w.timer(now, slot)?,
            _ => w.handle(now, kind, slot, operand)?,
        }
    }
    progress.finish();
    let queued = queued.unwrap_or_else(|| w.queued());
    let faults = fault_window(&cfg.injections, bin);
    let services = model
        .services
        .iter()
        .zip(w.stats())
        .zip(queued)
        .map(|((service, s), queue_at_end)| {
            row(
                &service.name,
                s,
                queue_at_end,
                arrived,
                (run_for, bins),
                faults,
                cfg.bin,
            )
        })
        .collect();
    Ok(WhatIfReport {
        scenario: "policy",
        version: version.to_owned(),
        parameters: cfg.clone(),
        entry_requests: arrived,
        entry_success_rate: round(w.entry_ok as f64 / arrived.max(1) as f64, 4),
        services,
        events,
    })
}

/// Budgets and breakers read the virtual clock to this resolution (their windows are
/// seconds long; moving a shared clock at every event would cost more than the event).
const CLOCK_RESOLUTION: Nanos = 100_000;

/// After the run, requests in flight go on for at least this many seconds (or the run's
/// length, if longer) so that their retries are counted.
const DRAIN: u64 = 60;

/// Arrivals at `rate` in `[0, run)`.
fn arrivals_before(rate: f64, run: Nanos) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = (rate * run as f64 / NANOS_PER_SEC as f64).ceil() as u64;
    n
}

/// The bins before the first injection, and the first bin after the last one ends.
fn fault_window(injections: &[Injection], bin: Nanos) -> Option<(usize, usize)> {
    let start = injections.iter().map(|i| nanos(i.start)).min()?;
    let end = injections.iter().map(|i| nanos(i.end())).max()?;
    let b = bin.max(1);
    Some((
        usize::try_from(start / b).unwrap_or(usize::MAX),
        usize::try_from(end.div_ceil(b)).unwrap_or(usize::MAX),
    ))
}

fn row(
    name: &str,
    s: &ServiceStats,
    queue_at_end: usize,
    entries: u64,
    (run_for, bins): (Nanos, usize),
    faults: Option<(usize, usize)>,
    bin: Duration,
) -> ServiceRow {
    let requests = s.sum(0, None, |c| c.arrivals);
    let ok = s.sum(0, None, |c| c.ok);
    let secs = run_for as f64 / NANOS_PER_SEC as f64;
    let offered_series = s.series(bins, |c| c.arrivals);
    let peak = offered_series.iter().copied().max().unwrap_or(0);
    let recover = faults.and_then(|(start, end)| recovery_bins(s, start, end, bins));
    let share = |x: u64| round(x as f64 / requests.max(1) as f64, 4);
    let [p50, p99, p999] = s.latency_ms([0.5, 0.99, 0.999]);
    ServiceRow {
        service: name.to_owned(),
        requests,
        offered_per_sec: round(offered_series.iter().sum::<u64>() as f64 / secs, 2),
        peak_per_sec: round(peak as f64 / bin.as_secs_f64(), 2),
        amplification: round(requests as f64 / entries.max(1) as f64, 4),
        success_rate: share(ok),
        served: share(s.sum(0, None, |c| c.admitted)),
        abandoned: s.abandoned,
        p50_ms: p50.map(|v| round(v, 3)),
        p99_ms: p99.map(|v| round(v, 3)),
        p999_ms: p999.map(|v| round(v, 3)),
        queue_peak: s.queue_peak,
        queue_at_end,
        recover_s: recover.map(|b| round(b as f64 * bin.as_secs_f64(), 3)),
        recovered: recover.is_some(),
        offered_series,
        ok_series: s.series(bins, |c| c.ok),
        served_series: s.series(bins, |c| c.admitted),
    }
}
