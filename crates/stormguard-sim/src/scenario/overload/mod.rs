//! `overload`: a server near capacity, clients with timeouts and retries, and a trigger —
//! does the system come back when the trigger ends?
//!
//! This is the metastable failure of Bronson et al. (HotOS 2021). A server with capacity
//! 300 requests/s (and 10× slower while more than that is offered, see below) serves 280
//! requests/s. Clients
//! time out after 1 s and retry once. A 10 s outage (the trigger) makes every request in
//! flight time out; when the outage ends, the retries of those timeouts arrive on top of new
//! requests — 560 requests/s, above capacity — so the server slows down, everything it
//! serves has already timed out, every request times out and is retried: the system stays at
//! about 560 requests/s offered and nearly zero goodput long after the trigger is gone. The
//! *sustaining effect* is the retries, not the trigger.
//!
//! # The server
//!
//! One worker serves a FIFO queue, one request at a time, in `1 / capacity` seconds while
//! the load offered over the last second is at most `capacity`, and `slowdown` times slower
//! above it (thrashing, lock contention, cache misses: work gets more expensive exactly when
//! there is more of it). The queue is unbounded, so latency grows with load. A server told
//! each request's deadline refuses, at the head of the queue and at no cost, any request
//! whose deadline has passed — as a stormguard server refuses an expired `grpc-timeout`
//! before running the handler; one that is not told serves everything, including requests
//! nobody waits for any more. During an outage it drops everything and loses its queue.
//!
//! # Protections (printed side by side)
//!
//! - `none`: retry at once after a timeout, no budget;
//! - `budget`: the same, with a retry budget shared by all clients (gRPC A6's (10, 0.1) by
//!   default, `--budget` picks another kind). In an outage every attempt fails, the budget
//!   runs dry within a handful of failures, and retries stop: the offered load stays near
//!   280/s and the system recovers as soon as the trigger ends;
//! - `jitter-deadline`: exponential backoff with full jitter, and a deadline: the caller
//!   waits `--deadline` in all (by default the same 1 s as the timeout), each attempt gets
//!   `min(timeout, remaining)`, the core refuses a retry that cannot fit
//!   `backoff + min-call` before the deadline, and the deadline travels with the request so
//!   the server refuses work whose caller has given up. Retries happen only when they can
//!   still help; the server never works for nobody. It recovers too. With a deadline much
//!   longer than the timeout (`--deadline 2s`) retries fit again and the run stays stuck:
//!   jitter spreads load, it does not remove it;
//! - `all`: budget, jitter and deadline together;
//! - `limit`: the server protects itself, with clients that still retry at once and without
//!   a budget (the worst case): the core's adaptive concurrency limiter
//!   ([`stormguard::limit`], `--limit-algorithm`, Vegas by default, on the virtual clock) bounds
//!   the requests the server has taken on (queued or in service), and a request is shed on
//!   arrival, answered at once and at no cost, when it is over the limit or when its deadline
//!   (each attempt carries its timeout, as a gRPC client's `grpc-timeout`) leaves less than
//!   what admitted requests currently take. Shed clients retry at once, ignoring the
//!   pushback. As stormguard's `AdaptiveLimitLayer` does, minus its short queue.
//!
//! # What "offered" costs the server
//!
//! The slowdown follows the work the server *takes on* over the last second: every arrival
//! for a server without a limit (so those rows are as before), only the admitted ones for one
//! with a limit. A request shed on arrival costs nothing here (a 503 costs microseconds
//! against milliseconds of work); a model in which refusing costs as much as serving would
//! make every server-side protection useless by construction.
//!
//! # Triggers
//!
//! `outage` (the server drops everything for `trigger-for`), `capacity-drop` (capacity ×
//! `drop-to`), `spike` (`spike` extra requests per second). With a spike the queue built up
//! during the trigger outlives it: a budget alone stops the retries but the server still
//! works through a backlog of requests nobody waits for, while a server that knows deadlines
//! drops them and recovers.
//!
//! Arrivals are evenly spaced (280/s is 7 % under capacity; Poisson arrivals would cross
//! capacity by chance in one second out of eight and trigger the slowdown without any
//! outage), so the only randomness is the clients' jitter.

mod server;
mod summary;
mod world;

use std::time::Duration;

use serde::Serialize;

use crate::budgets::{BudgetKind, BudgetParams};
use crate::error::{self, InvalidParam};
use crate::progress::Progress;
use crate::time::{NANOS_PER_MILLI, Nanos, nanos};

/// What pushes the system over the edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    /// The server drops every request (and its queue) for the trigger's duration.
    Outage,
    /// The server's capacity is multiplied by `drop_to`.
    CapacityDrop,
    /// `spike` extra requests per second arrive.
    Spike,
}

impl Trigger {
    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<Trigger> {
        match name {
            "outage" => Some(Trigger::Outage),
            "capacity-drop" => Some(Trigger::CapacityDrop),
            "spike" => Some(Trigger::Spike),
            _ => None,
        }
    }
}

/// What the clients do about overload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protection {
    /// Retry at once after a timeout.
    None,
    /// Retry at once, within a shared retry budget.
    Budget,
    /// Jittered exponential backoff and a deadline checked by client and server.
    JitterDeadline,
    /// Budget, jitter and deadline.
    All,
    /// The server's adaptive concurrency limit and deadline shedding; clients retry at once
    /// without a budget.
    Limit,
}

impl Protection {
    /// Every protection, in table order.
    pub const ALL: [Protection; 5] = [
        Protection::None,
        Protection::Budget,
        Protection::JitterDeadline,
        Protection::All,
        Protection::Limit,
    ];

    /// The command-line name.
    pub const fn name(self) -> &'static str {
        match self {
            Protection::None => "none",
            Protection::Budget => "budget",
            Protection::JitterDeadline => "jitter-deadline",
            Protection::All => "all",
            Protection::Limit => "limit",
        }
    }

    /// A label for tables.
    pub const fn label(self) -> &'static str {
        match self {
            Protection::None => "no protection",
            Protection::Budget => "retry budget",
            Protection::JitterDeadline => "jitter + deadline",
            Protection::All => "budget + jitter + deadline",
            Protection::Limit => "server: adaptive limit + deadline shedding",
        }
    }

    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<Protection> {
        Protection::ALL.into_iter().find(|p| p.name() == name)
    }

    fn budget(self) -> bool {
        matches!(self, Protection::Budget | Protection::All)
    }

    fn deadline(self) -> bool {
        matches!(self, Protection::JitterDeadline | Protection::All)
    }

    fn limit(self) -> bool {
        matches!(self, Protection::Limit)
    }
}

/// The limit algorithm of the `limit` protection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LimitKind {
    /// [`Aimd`](stormguard::limit::Aimd).
    Aimd,
    /// [`Vegas`](stormguard::limit::Vegas).
    Vegas,
    /// [`Gradient2`](stormguard::limit::Gradient2).
    Gradient2,
}

impl LimitKind {
    /// Every kind.
    pub const ALL: [LimitKind; 3] = [LimitKind::Aimd, LimitKind::Vegas, LimitKind::Gradient2];

    /// The command-line name.
    pub const fn name(self) -> &'static str {
        match self {
            LimitKind::Aimd => "aimd",
            LimitKind::Vegas => "vegas",
            LimitKind::Gradient2 => "gradient2",
        }
    }

    /// The algorithm with the core's defaults, except that every kind may go down to a
    /// limit of 1 (the simulated server has one worker) and up to 1000. Vegas and Gradient2
    /// begin with their slow start from 1 (Vegas's default), AIMD at 20.
    pub fn algorithm(self) -> stormguard::limit::LimitAlgorithm {
        use stormguard::limit::{Aimd, Gradient2, Vegas};
        match self {
            LimitKind::Aimd => Aimd::new().with_limits(1, 20, 1000).into(),
            LimitKind::Vegas => Vegas::new().with_limits(1, 1, 1000).into(),
            LimitKind::Gradient2 => Gradient2::new().with_limits(1, 1, 1000).into(),
        }
    }
}

/// Parameters of an overload run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OverloadConfig {
    /// New requests per second.
    pub rate: f64,
    /// Requests per second the server serves while not overloaded.
    pub capacity: f64,
    /// How many times slower the server gets above capacity.
    pub slowdown: f64,
    /// Per-attempt timeout.
    #[serde(with = "crate::report::seconds")]
    pub timeout: Duration,
    /// Retries per request.
    pub retries: u32,
    /// What pushes the system over the edge.
    pub trigger: Trigger,
    /// When the trigger starts.
    #[serde(with = "crate::report::seconds")]
    pub trigger_at: Duration,
    /// How long the trigger lasts.
    #[serde(with = "crate::report::seconds")]
    pub trigger_for: Duration,
    /// Capacity factor during a capacity drop.
    pub drop_to: f64,
    /// Extra requests per second during a spike.
    pub spike: f64,
    /// Length of the run.
    #[serde(with = "crate::report::seconds")]
    pub duration: Duration,
    /// Bin width of the time series.
    #[serde(with = "crate::report::seconds")]
    pub bin: Duration,
    /// The caller's deadline, in the deadline protections.
    #[serde(with = "crate::report::seconds")]
    pub deadline: Duration,
    /// Minimum useful call time: no retry starts with less left (deadline protections).
    #[serde(with = "crate::report::seconds")]
    pub min_call: Duration,
    /// Backoff base in the jitter protections (exponential, full jitter).
    #[serde(with = "crate::report::seconds")]
    pub base: Duration,
    /// Backoff cap in the jitter protections.
    #[serde(with = "crate::report::seconds")]
    pub cap: Duration,
    /// The budget kind in the budget protections.
    pub budget: BudgetKind,
    /// The budgets' numbers.
    pub budget_params: BudgetParams,
    /// The limit algorithm of the `limit` protection.
    pub limit: LimitKind,
    /// Rows of the table.
    #[serde(skip)]
    pub protections: Vec<Protection>,
    /// Seed of every random draw.
    pub seed: u64,
}

impl Default for OverloadConfig {
    /// Bronson et al.'s example: 280 requests/s against capacity 300 (10× slower above),
    /// 1 s timeout, one retry, a 10 s outage at 10 s, 60 s in all, 1 s bins; deadline 1 s,
    /// minimum call 50 ms, backoff 100 ms to 1 s; gRPC (10, 0.1) budget; a Vegas limit;
    /// protections none, budget, jitter + deadline and limit.
    fn default() -> Self {
        OverloadConfig {
            rate: 280.0,
            capacity: 300.0,
            slowdown: 10.0,
            timeout: Duration::from_secs(1),
            retries: 1,
            trigger: Trigger::Outage,
            trigger_at: Duration::from_secs(10),
            trigger_for: Duration::from_secs(10),
            drop_to: 0.5,
            spike: 200.0,
            duration: Duration::from_secs(60),
            bin: Duration::from_secs(1),
            deadline: Duration::from_secs(1),
            min_call: Duration::from_millis(50),
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            budget: BudgetKind::Grpc,
            budget_params: BudgetParams::default(),
            limit: LimitKind::Vegas,
            protections: vec![
                Protection::None,
                Protection::Budget,
                Protection::JitterDeadline,
                Protection::Limit,
            ],
            seed: 42,
        }
    }
}

impl OverloadConfig {
    fn trigger_end(&self) -> Nanos {
        nanos(self.trigger_at).saturating_add(nanos(self.trigger_for))
    }

    /// Checks every parameter; the error names the flag.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        error::in_range("rate", self.rate, 1e-3, 1e6)?;
        error::in_range("capacity", self.capacity, 1e-3, 1e7)?;
        error::in_range("slowdown", self.slowdown, 1.0, 1e4)?;
        error::positive_duration("timeout", self.timeout)?;
        if self.retries > 100 {
            return Err(InvalidParam::new("retries", "at most 100"));
        }
        let run = error::positive_duration("duration", self.duration)?;
        let bin = error::bin_width(self.bin, run)?;
        let at = error::bounded_duration("trigger-at", self.trigger_at)?;
        error::bounded_duration("trigger-for", self.trigger_for)?;
        if at < 2 * bin {
            return Err(InvalidParam::new(
                "trigger-at",
                "must leave at least two bins before the trigger to measure the healthy state",
            ));
        }
        if self.trigger_end().saturating_add(2 * bin) > run {
            return Err(InvalidParam::new(
                "duration",
                "must leave at least two bins after the trigger ends",
            ));
        }
        error::in_range("drop-to", self.drop_to, 1e-3, 1.0)?;
        error::in_range("spike", self.spike, 0.0, 1e6)?;
        error::positive_duration("deadline", self.deadline)?;
        error::bounded_duration("min-call", self.min_call)?;
        if self.min_call >= self.deadline {
            // The core refuses a retry unless the deadline leaves `backoff + min_call`; with
            // the whole deadline or more asked for, no retry could ever be sent.
            return Err(InvalidParam::new(
                "min-call",
                format!(
                    "{:?} is not shorter than the deadline ({:?}): no retry could ever fit",
                    self.min_call, self.deadline
                ),
            ));
        }
        error::backoff_range(self.base, self.cap)?;
        error::non_empty("protection", &self.protections)?;
        if (self.rate + self.spike) * self.duration.as_secs_f64() > 1e8 {
            return Err(InvalidParam::new(
                "duration",
                "more than 100 million requests: shorten the run or lower the rate",
            ));
        }
        self.budget_params.validate()
    }
}

/// One bin of the time series.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OverloadPoint {
    /// Start of the bin, in seconds.
    pub t_s: f64,
    /// Attempts arriving at the server, per second.
    pub offered: f64,
    /// Logical requests completed successfully, per second.
    pub goodput: f64,
    /// Mean latency of those successes, in milliseconds (`null` when none).
    pub latency_ms: Option<f64>,
}

/// One protection's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OverloadRow {
    /// Always `"overload"`.
    pub scenario: &'static str,
    /// The protection's command-line name.
    pub strategy: Protection,
    /// The table label.
    pub label: &'static str,
    /// The run's parameters.
    pub parameters: OverloadConfig,
    /// Mean goodput (requests/s) before the trigger, first bin excluded.
    pub goodput_before: f64,
    /// Mean offered load (requests/s) before the trigger.
    pub offered_before: f64,
    /// Highest offered load in a bin from the trigger on.
    pub offered_peak: f64,
    /// Length of the tail over which the "after" figures are measured, in seconds: the
    /// last 10 s of the run, or half of what follows the trigger if that is shorter.
    pub after_window_s: f64,
    /// Mean goodput over the tail.
    pub goodput_after: f64,
    /// Mean offered load over the tail.
    pub offered_after: f64,
    /// Mean latency of successes over the tail, in milliseconds (`null` when none).
    pub latency_after_ms: Option<f64>,
    /// Whether goodput over the tail is at least 95 % of goodput before the trigger.
    pub recovered: bool,
    /// Seconds from the end of the trigger until goodput is back at 95 % for good (`null`
    /// when it never is).
    pub recovery_s: Option<f64>,
    /// Server completions whose client had already given up.
    pub wasted: u64,
    /// Requests the server refused because their deadline had passed.
    pub expired: u64,
    /// Requests the server's limit shed on arrival.
    pub shed: u64,
    /// The time series.
    pub series: Vec<OverloadPoint>,
}

/// An overload run's result: one row per protection.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OverloadReport {
    /// One row per protection, in the order asked for.
    pub rows: Vec<OverloadRow>,
    /// Events handled.
    #[serde(skip)]
    pub events: u64,
}

/// Runs every protection through the same trigger.
///
/// ```
/// use stormguard_sim::progress::NoProgress;
/// use stormguard_sim::scenario::overload::{OverloadConfig, run};
///
/// let report = run(&OverloadConfig::default(), &mut NoProgress)?;
/// let [none, budget, deadline, limit] = &report.rows[..] else { unreachable!() };
/// assert!(!none.recovered && none.offered_after > 500.0 && none.goodput_after < 30.0);
/// assert!(budget.recovered && deadline.recovered && limit.recovered);
/// # Ok::<(), stormguard_sim::error::InvalidParam>(())
/// ```
pub fn run(
    cfg: &OverloadConfig,
    progress: &mut dyn Progress,
) -> Result<OverloadReport, InvalidParam> {
    cfg.validate()?;
    let total_ms = nanos(cfg.duration) / NANOS_PER_MILLI;
    progress.start(total_ms.saturating_mul(cfg.protections.len() as u64));
    let mut rows = Vec::with_capacity(cfg.protections.len());
    let mut events = 0;
    for (i, &p) in cfg.protections.iter().enumerate() {
        let (row, n) =
            world::run_protection(cfg, p, &mut |ms| progress.set(total_ms * i as u64 + ms))?;
        events += n;
        rows.push(row);
    }
    progress.finish();
    Ok(OverloadReport { rows, events })
}
