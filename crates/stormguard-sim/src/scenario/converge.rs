//! `converge`: a server's handler gets twice slower mid-run — how fast does the adaptive
//! concurrency limit follow?
//!
//! A server of `workers` workers serves a FIFO queue of the requests its limiter admitted;
//! each takes `service` of work, `slowdown` times more from `change_at` on (a deploy, a
//! slower dependency: capacity drops from `workers / service` to a `slowdown`-th of it).
//! Requests arrive as a Poisson stream at `load` times the capacity *before* the change, so
//! the server is overloaded throughout and only the limit decides how long its queue gets.
//! The limiter is the core's ([`stormguard::limit::Limiter`], one row per
//! `--limit-algorithm`) on the virtual clock: a request is admitted on arrival while fewer
//! than the limit are in flight (queued or in service) and shed otherwise; its slot is given
//! back with its round-trip time when its work is done. A request that waited longer than
//! `timeout` is given up by its caller: the server drops it when it reaches the head of the
//! queue (as the `DeadlineLayer` cancels a handler whose deadline passed) and the limiter
//! counts a drop.
//!
//! # What converging means
//!
//! For a CPU-bound handler the right limit does not change with its speed: `workers`
//! requests keep every worker busy, and whatever is admitted beyond that waits. What changes
//! is what the limiter *sees*: every round trip doubles, which an RTT-based algorithm first
//! takes for a queue. The limit has converged when the server is busy again with a short
//! queue: from `converged_s` after the change on, every bin's admitted requests take at most
//! twice the new service time on average (a queue of at most one service time per worker) —
//! and `goodput_after` says whether the workers stayed busy meanwhile.
//!
//! # Reading the figures
//!
//! With the defaults (4 workers, 10 ms → 20 ms at 10 s, 3x load) Vegas (after its slow start
//! from 1, over within the first second) holds a limit of about 7 on both sides of the
//! change — the level at which 4 workers stay busy with at
//! most one request queued per worker — and the round trip is within twice the new service
//! time from the first bin after the change on; about 99 % of each capacity is served. Its
//! pinned probe of the no-load RTT (every 5 s, the dips to 3) learns the new service time.
//! With one worker (`--workers 1 --service 2ms`) its RTT tolerance holds the limit at 2: one
//! request in service, one waiting.
//! Gradient2 cuts its limit within a second of the change but, under a queue that never
//! drains, its long-term RTT follows the short one and the limit drifts up (to about 180,
//! round trips near 0.9 s): the reason Vegas is the default. AIMD sees no latency, only
//! drops: its limit grows until requests wait out their callers' timeout.

use std::collections::VecDeque;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp};
use serde::Serialize;
use stormguard::classify::Outcome;
use stormguard::limit::{Limiter, LimiterConfig, Ticket};

use super::overload::LimitKind;
use crate::bins::Bins;
use crate::error::{self, InvalidParam};
use crate::progress::Progress;
use crate::queue::{EventQueue, pack, unpack};
use crate::report::round;
use crate::rng;
use crate::time::{NANOS_PER_MILLI, Nanos, nanos, seconds};
use crate::vclock::VirtualClock;

/// Parameters of a convergence run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConvergeConfig {
    /// Requests served at once.
    pub workers: u32,
    /// Work per request before the change.
    #[serde(with = "crate::report::seconds")]
    pub service: Duration,
    /// How many times more work per request from the change on.
    pub slowdown: f64,
    /// When the handler gets slower.
    #[serde(with = "crate::report::seconds")]
    pub change_at: Duration,
    /// Offered load, as a multiple of the capacity before the change.
    pub load: f64,
    /// Callers give up on a request after this long.
    #[serde(with = "crate::report::seconds")]
    pub timeout: Duration,
    /// Length of the run.
    #[serde(with = "crate::report::seconds")]
    pub duration: Duration,
    /// Bin width of the time series.
    #[serde(with = "crate::report::seconds")]
    pub bin: Duration,
    /// Rows of the table.
    #[serde(skip)]
    pub limits: Vec<LimitKind>,
    /// Seed of the arrivals.
    pub seed: u64,
}

impl Default for ConvergeConfig {
    /// 4 workers, 10 ms of work getting twice slower at 10 s, 3x the first capacity offered
    /// (1200 requests/s), 1 s timeout, 30 s in 100 ms bins; Vegas, Gradient2 and AIMD.
    fn default() -> Self {
        ConvergeConfig {
            workers: 4,
            service: Duration::from_millis(10),
            slowdown: 2.0,
            change_at: Duration::from_secs(10),
            load: 3.0,
            timeout: Duration::from_secs(1),
            duration: Duration::from_secs(30),
            bin: Duration::from_millis(100),
            limits: vec![LimitKind::Vegas, LimitKind::Gradient2, LimitKind::Aimd],
            seed: 42,
        }
    }
}

impl ConvergeConfig {
    /// Requests per second the server can serve before the change.
    pub fn capacity_before(&self) -> f64 {
        f64::from(self.workers) / self.service.as_secs_f64()
    }

    /// Requests per second the server can serve after the change.
    pub fn capacity_after(&self) -> f64 {
        self.capacity_before() / self.slowdown
    }

    /// Checks every parameter; the error names the flag.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        if self.workers == 0 || self.workers > 10_000 {
            return Err(InvalidParam::new("workers", "must be between 1 and 10000"));
        }
        error::positive_duration("service", self.service)?;
        error::bounded_duration("service", self.service)?;
        error::in_range("slowdown", self.slowdown, 1e-3, 1e3)?;
        error::in_range("load", self.load, 1e-3, 100.0)?;
        error::positive_duration("timeout", self.timeout)?;
        let run = error::positive_duration("duration", self.duration)?;
        let bin = error::bin_width(self.bin, run)?;
        let at = error::bounded_duration("change-at", self.change_at)?;
        if at < 2 * bin || at.saturating_add(2 * bin) > run {
            return Err(InvalidParam::new(
                "change-at",
                "must leave at least two bins before and after the change",
            ));
        }
        error::non_empty("limit-algorithm", &self.limits)?;
        if self.load * self.capacity_before() * self.duration.as_secs_f64() > 1e8 {
            return Err(InvalidParam::new(
                "duration",
                "more than 100 million requests: shorten the run or lower the load",
            ));
        }
        Ok(())
    }
}

/// One bin of the time series.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ConvergePoint {
    /// Start of the bin, in seconds.
    pub t_s: f64,
    /// The limit at the end of the bin.
    pub limit: u32,
    /// Requests in flight (queued or in service) at the end of the bin.
    pub in_flight: u32,
    /// Requests served per second.
    pub goodput: f64,
    /// Mean round-trip time of the requests served, in milliseconds (`null` when none).
    pub rtt_ms: Option<f64>,
}

/// One limit algorithm's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConvergeRow {
    /// Always `"converge"`.
    pub scenario: &'static str,
    /// The algorithm's command-line name.
    pub strategy: LimitKind,
    /// The table label.
    pub label: &'static str,
    /// The run's parameters.
    pub parameters: ConvergeConfig,
    /// Mean limit over the second half of the time before the change.
    pub limit_before: f64,
    /// Mean limit over the second half of the time after the change.
    pub limit_after: f64,
    /// Goodput before the change (first second excluded), as a share of the capacity then.
    pub goodput_before: f64,
    /// Goodput after the change, as a share of the capacity then.
    pub goodput_after: f64,
    /// Mean round-trip time over the second half of the time after the change, in
    /// milliseconds.
    pub rtt_after_ms: Option<f64>,
    /// Seconds from the change until every later bin's mean round-trip time is at most
    /// twice the new service time (`null` when it never is).
    pub converged_s: Option<f64>,
    /// Requests shed on arrival.
    pub shed: u64,
    /// Admitted requests whose caller had given up before a worker reached them.
    pub timed_out: u64,
    /// The time series.
    pub series: Vec<ConvergePoint>,
}

/// A convergence run's result: one row per limit algorithm.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConvergeReport {
    /// One row per algorithm, in the order asked for.
    pub rows: Vec<ConvergeRow>,
}

/// Runs every limit algorithm through the same change.
///
/// ```
/// use stormguard_sim::progress::NoProgress;
/// use stormguard_sim::scenario::converge::{ConvergeConfig, run};
///
/// let report = run(&ConvergeConfig::default(), &mut NoProgress)?;
/// let vegas = &report.rows[0];
/// assert!(vegas.converged_s.is_some_and(|s| s <= 1.0), "{:?}", vegas.converged_s);
/// assert!(vegas.goodput_after >= 0.95);
/// # Ok::<(), stormguard_sim::error::InvalidParam>(())
/// ```
pub fn run(
    cfg: &ConvergeConfig,
    progress: &mut dyn Progress,
) -> Result<ConvergeReport, InvalidParam> {
    cfg.validate()?;
    let total_ms = nanos(cfg.duration) / NANOS_PER_MILLI;
    progress.start(total_ms.saturating_mul(cfg.limits.len() as u64));
    let mut rows = Vec::with_capacity(cfg.limits.len());
    for (i, &kind) in cfg.limits.iter().enumerate() {
        let offset = total_ms * i as u64;
        rows.push(run_one(cfg, kind, &mut |ms| progress.set(offset + ms))?);
    }
    progress.finish();
    Ok(ConvergeReport { rows })
}

const ARRIVAL: u8 = 0;
const DONE: u8 = 1;
const SAMPLE: u8 = 2;

/// Per-bin figures of one run.
struct Series {
    served: Bins,
    rtt_us: Bins,
    limit: Vec<u32>,
    in_flight: Vec<u32>,
}

fn run_one(
    cfg: &ConvergeConfig,
    kind: LimitKind,
    progress: &mut dyn FnMut(u64),
) -> Result<ConvergeRow, InvalidParam> {
    let mut vclock = VirtualClock::new();
    let clock = vclock.clock();
    let origin = clock.now();
    let limiter = Limiter::new(LimiterConfig::new(kind.algorithm()), &clock)
        .map_err(|e| InvalidParam::new("limit-algorithm", e.to_string()))?;
    let run_ns = nanos(cfg.duration);
    let bin = nanos(cfg.bin);
    let change = nanos(cfg.change_at);
    let service = |start: Nanos| {
        let base = cfg.service.as_secs_f64();
        let work = if start < change {
            base
        } else {
            base * cfg.slowdown
        };
        (work * 1e9) as Nanos
    };
    let timeout = nanos(cfg.timeout);
    let mut rng: SmallRng = rng::stream(cfg.seed, kind as u64);
    let gaps = Exp::new(cfg.load * cfg.capacity_before())
        .map_err(|e| InvalidParam::new("load", e.to_string()))?;
    let mut events = EventQueue::with_capacity(1024);
    // Admitted requests waiting for a worker: their ticket and arrival.
    let mut waiting: VecDeque<(Ticket, Nanos)> = VecDeque::new();
    // Per worker: the request in service, and when it arrived.
    let mut busy: Vec<Option<(Ticket, Nanos)>> = (0..cfg.workers).map(|_| None).collect();
    let mut idle: Vec<u32> = (0..cfg.workers).rev().collect();
    let mut series = Series {
        served: Bins::new(bin, run_ns),
        rtt_us: Bins::new(bin, run_ns),
        limit: Vec::new(),
        in_flight: Vec::new(),
    };
    let (mut shed, mut timed_out) = (0u64, 0u64);
    events.push(0, pack(ARRIVAL, 0, 0));
    events.push(bin, pack(SAMPLE, 0, 0));
    let mut next_progress = 0;
    while let Some((now, payload)) = events.pop() {
        if now >= run_ns && unpack(payload).0 != SAMPLE {
            continue;
        }
        vclock.advance_to(now);
        let at = origin + crate::time::duration(now);
        let (event, worker, _) = unpack(payload);
        match event {
            ARRIVAL => {
                match limiter.try_acquire(0, at) {
                    Ok(ticket) => waiting.push_back((ticket, now)),
                    Err(_) => shed += 1,
                }
                let gap = (gaps.sample(&mut rng) * 1e9) as Nanos;
                events.push(now.saturating_add(gap.max(1)), pack(ARRIVAL, 0, 0));
            }
            DONE => {
                if let Some((ticket, arrived)) =
                    busy.get_mut(worker as usize).and_then(Option::take)
                {
                    limiter.release(ticket, at, Outcome::Success);
                    series.served.add(now);
                    series.rtt_us.add_n(now, (now - arrived) / 1000);
                    idle.push(worker);
                }
            }
            _ => {
                series.limit.push(limiter.limit());
                series.in_flight.push(limiter.in_flight());
                if now < run_ns {
                    events.push(now + bin, pack(SAMPLE, 0, 0));
                }
                if now >= next_progress {
                    progress(now / NANOS_PER_MILLI);
                    next_progress = now + 1_000 * NANOS_PER_MILLI;
                }
                continue;
            }
        }
        // Idle workers take the oldest waiting requests; one whose caller left is dropped.
        while let Some(&worker) = idle.last() {
            let Some((ticket, arrived)) = waiting.pop_front() else {
                break;
            };
            if now - arrived > timeout {
                limiter.release(ticket, at, Outcome::InDoubt);
                timed_out += 1;
                continue;
            }
            idle.pop();
            if let Some(slot) = busy.get_mut(worker as usize) {
                *slot = Some((ticket, arrived));
            }
            events.push(now + service(now), pack(DONE, worker, 0));
        }
    }
    Ok(summarise(cfg, kind, &series, shed, timed_out))
}

fn summarise(
    cfg: &ConvergeConfig,
    kind: LimitKind,
    s: &Series,
    shed: u64,
    timed_out: u64,
) -> ConvergeRow {
    let bin = nanos(cfg.bin);
    let per_sec = 1.0 / seconds(bin);
    let bins = usize::try_from(nanos(cfg.duration) / bin).unwrap_or(0);
    let at = usize::try_from(nanos(cfg.change_at) / bin).unwrap_or(0);
    let first_second = usize::try_from(1_000_000_000 / bin)
        .unwrap_or(1)
        .min(at / 2);
    let rtt = |from: usize, to: usize| {
        let n = s.served.sum(from, to);
        (n > 0).then(|| s.rtt_us.sum(from, to) as f64 / n as f64 / 1e3)
    };
    let goodput = |from: usize, to: usize| {
        s.served.sum(from, to) as f64 * per_sec / to.saturating_sub(from).max(1) as f64
    };
    let mean_limit = |from: usize, to: usize| {
        let window = s.limit.get(from..to).unwrap_or_default();
        window.iter().map(|&l| f64::from(l)).sum::<f64>() / window.len().max(1) as f64
    };
    let bound_ms = 2.0 * cfg.service.as_secs_f64() * cfg.slowdown * 1e3;
    let short = |i: usize| rtt(i, i + 1).is_none_or(|ms| ms <= bound_ms);
    let converged_s = (at..bins)
        .find(|&i| (i..bins).all(short))
        .map(|i| round(seconds((i - at) as u64 * bin), 3));
    let after_half = at + (bins - at) / 2;
    let series = (0..bins)
        .map(|i| ConvergePoint {
            t_s: round(seconds(i as u64 * bin), 6),
            limit: s.limit.get(i).copied().unwrap_or_default(),
            in_flight: s.in_flight.get(i).copied().unwrap_or_default(),
            goodput: round(goodput(i, i + 1), 2),
            rtt_ms: rtt(i, i + 1).map(|ms| round(ms, 3)),
        })
        .collect();
    ConvergeRow {
        scenario: "converge",
        strategy: kind,
        label: kind.name(),
        parameters: cfg.clone(),
        limit_before: round(mean_limit(at / 2, at), 2),
        limit_after: round(mean_limit(after_half, bins), 2),
        goodput_before: round(goodput(first_second, at) / cfg.capacity_before(), 4),
        goodput_after: round(goodput(at, bins) / cfg.capacity_after(), 4),
        rtt_after_ms: rtt(after_half, bins).map(|ms| round(ms, 3)),
        converged_s,
        shed,
        timed_out,
        series,
    }
}
