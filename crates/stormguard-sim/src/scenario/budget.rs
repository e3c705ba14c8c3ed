//! `budget`: a population whose downstream's success rate drops, against every budget kind.
//!
//! `rate` logical requests per second arrive evenly; each attempt takes `latency` and its
//! outcome is decided when it completes, by the success rate in force at that instant:
//! `before` until `step-at`, `after` from then on. Each request is a [`RetryRun`] with up to
//! `retries` retries (exponential backoff from `base`, full jitter); the budget under test is
//! shared by all of them. The run reports retries per second over time, and the time from the
//! step to the first retry the budget refused: how fast the budget shuts retries off.
//!
//! # Reading the figures
//!
//! The seeds' Q5: 1000 requests/s, success dropping to 50 %, a (10, 0.1) bucket. Successes
//! refund 50 tokens a second while failures want 500 retries a second, so the seeds' bucket
//! (a retry spends 1, allowed while ≥ 1 token) runs dry after about 10 / 450 s ≈ 20 ms, and
//! gRPC A6's (a *failure* costs 1, retries allowed above 5 tokens) after about
//! 5 / 450 s ≈ 11 ms. After that retries are pinned to what successes pay for. The AWS quota
//! (500 tokens, 5 per retry) lasts about a second; the ratio budget settles near its percent
//! of requests plus its reserve; Envoy's concurrency budget bounds retries in flight, not a
//! rate, so it never shuts them off entirely.
//!
//! Failures are spread evenly by default (`--failures spread`: exactly one attempt in
//! 1/(1−s) fails, as in the seeds' arithmetic), so the figures are exact; `--failures random`
//! draws each outcome instead.

use std::time::Duration;

use rand::Rng;
use rand::rngs::SmallRng;
use serde::Serialize;
use stormguard::budget::RetryBudget;
use stormguard::classify::Outcome;
use stormguard::retry::{Decision, RetryPolicy, RetryRun, StopReason};

use crate::bins::Bins;
use crate::budgets::{BudgetKind, BudgetParams, invalid_budget};
use crate::error::{self, InvalidParam};
use crate::progress::Progress;
use crate::queue::{EventQueue, pack, unpack};
use crate::report::round;
use crate::rng;
use crate::slab::Slab;
use crate::strategy::Strategy;
use crate::time::{NANOS_PER_SEC, Nanos, millis, nanos, nth_of_rate, seconds};
use crate::vclock::VirtualClock;

/// How attempt failures are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePattern {
    /// Evenly: exactly the failure rate, as in the seeds' arithmetic.
    Spread,
    /// Each attempt fails with the failure probability, drawn from the seed.
    Random,
}

impl FailurePattern {
    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<FailurePattern> {
        match name {
            "spread" => Some(FailurePattern::Spread),
            "random" => Some(FailurePattern::Random),
            _ => None,
        }
    }
}

/// Parameters of a budget run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BudgetConfig {
    /// Logical requests per second.
    pub rate: f64,
    /// Success rate before the step.
    pub before: f64,
    /// Success rate from the step on.
    pub after: f64,
    /// When the success rate steps.
    #[serde(with = "crate::report::seconds")]
    pub step_at: Duration,
    /// Length of the run.
    #[serde(with = "crate::report::seconds")]
    pub duration: Duration,
    /// Time an attempt takes.
    #[serde(with = "crate::report::seconds")]
    pub latency: Duration,
    /// Retries per request.
    pub retries: u32,
    /// Backoff base (exponential, full jitter).
    #[serde(with = "crate::report::seconds")]
    pub base: Duration,
    /// Backoff cap.
    #[serde(with = "crate::report::seconds")]
    pub cap: Duration,
    /// Bin width of the retries-per-second series.
    #[serde(with = "crate::report::seconds")]
    pub bin: Duration,
    /// How failures are laid out.
    pub failures: FailurePattern,
    /// The budgets' numbers.
    pub budget: BudgetParams,
    /// Rows of the table.
    #[serde(skip)]
    pub kinds: Vec<BudgetKind>,
    /// Seed of every random draw.
    pub seed: u64,
}

impl Default for BudgetConfig {
    /// The seeds' Q5: 1000 requests/s, success 99 % then 50 % from 1 s, 5 s in all, 10 ms
    /// attempts, 2 retries with backoff from 20 ms (full jitter, cap 1 s), 250 ms bins,
    /// failures spread evenly, default budget numbers, every budget kind.
    fn default() -> Self {
        BudgetConfig {
            rate: 1000.0,
            before: 0.99,
            after: 0.5,
            step_at: Duration::from_secs(1),
            duration: Duration::from_secs(5),
            latency: Duration::from_millis(10),
            retries: 2,
            base: Duration::from_millis(20),
            cap: Duration::from_secs(1),
            bin: Duration::from_millis(250),
            failures: FailurePattern::Spread,
            budget: BudgetParams::default(),
            kinds: BudgetKind::ALL.to_vec(),
            seed: 42,
        }
    }
}

impl BudgetConfig {
    /// Checks every parameter; the error names the flag.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        error::in_range("rate", self.rate, 1e-3, 1e6)?;
        error::in_range("before", self.before, 0.0, 1.0)?;
        error::in_range("after", self.after, 0.0, 1.0)?;
        let duration = error::positive_duration("duration", self.duration)?;
        let step = error::bounded_duration("step-at", self.step_at)?;
        if step >= duration {
            return Err(InvalidParam::new(
                "step-at",
                "must come before the end of the run",
            ));
        }
        error::bounded_duration("latency", self.latency)?;
        if self.retries > 100 {
            return Err(InvalidParam::new("retries", "at most 100"));
        }
        error::backoff_range(self.base, self.cap)?;
        error::bin_width(self.bin, duration)?;
        error::non_empty("budget", &self.kinds)?;
        if self.rate * self.duration.as_secs_f64() > 1e8 {
            return Err(InvalidParam::new(
                "duration",
                "more than 100 million requests: shorten the run or lower the rate",
            ));
        }
        self.budget.validate()
    }
}

/// One budget kind's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BudgetRow {
    /// Always `"budget"`.
    pub scenario: &'static str,
    /// The budget kind's command-line name.
    pub strategy: BudgetKind,
    /// The table label.
    pub label: &'static str,
    /// The run's parameters.
    pub parameters: BudgetConfig,
    /// Milliseconds from the step to the first refused retry; `null` if none was refused.
    pub shutoff_ms: Option<f64>,
    /// Retries per second over the second before the step (or since the start, if the step
    /// comes sooner).
    pub retries_per_s_before: f64,
    /// Retries per second over the last second of the run (or since the step, if it is
    /// closer to the end).
    pub retries_per_s_after: f64,
    /// Retries as a fraction of new requests over that last second.
    pub retry_share_after: f64,
    /// Attempts per new request over that last second (the load multiplier).
    pub load_after: f64,
    /// Logical requests that succeeded over that last second, per new request.
    pub success_after: f64,
    /// Retries the budget refused over the run.
    pub refused: u64,
    /// Retries per second in each bin, bin 0 first.
    pub retries_per_s: Vec<f64>,
}

/// A budget run's result: one row per budget kind.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BudgetReport {
    /// One row per kind, in the order asked for.
    pub rows: Vec<BudgetRow>,
    /// Events handled.
    #[serde(skip)]
    pub events: u64,
}

/// Runs every budget kind asked for through the same step.
///
/// ```
/// use stormguard_sim::budgets::BudgetKind;
/// use stormguard_sim::progress::NoProgress;
/// use stormguard_sim::scenario::budget::{BudgetConfig, run};
///
/// let cfg = BudgetConfig { kinds: vec![BudgetKind::Grpc], ..BudgetConfig::default() };
/// let ms = run(&cfg, &mut NoProgress)?.rows[0].shutoff_ms.expect("shuts off");
/// assert!((9.0..=13.0).contains(&ms), "{ms}");
/// # Ok::<(), stormguard_sim::error::InvalidParam>(())
/// ```
pub fn run(cfg: &BudgetConfig, progress: &mut dyn Progress) -> Result<BudgetReport, InvalidParam> {
    cfg.validate()?;
    let total_ms = nanos(cfg.duration) / 1_000_000;
    progress.start(total_ms.saturating_mul(cfg.kinds.len() as u64));
    let mut rows = Vec::with_capacity(cfg.kinds.len());
    let mut events = 0;
    for (i, &kind) in cfg.kinds.iter().enumerate() {
        let (row, n) = run_kind(cfg, kind, &mut |ms| progress.set(total_ms * i as u64 + ms))?;
        events += n;
        rows.push(row);
    }
    progress.finish();
    Ok(BudgetReport { rows, events })
}

const ARRIVAL: u8 = 0;
const DONE: u8 = 1;

/// A span of virtual time over which figures are counted.
struct Window {
    from: Nanos,
    to: Nanos,
}

impl Window {
    fn new(from: Nanos, to: Nanos) -> Self {
        Window { from, to }
    }

    fn holds(&self, t: Nanos) -> bool {
        (self.from..self.to).contains(&t)
    }

    /// `n` events in this window, per second.
    fn per_second(&self, n: u64) -> f64 {
        let span = seconds(self.to.saturating_sub(self.from));
        if span > 0.0 { n as f64 / span } else { 0.0 }
    }
}

/// What happened in a window.
#[derive(Default)]
struct Counts {
    requests: u64,
    attempts: u64,
    retries: u64,
    successes: u64,
}

/// Decides attempt outcomes.
struct Downstream {
    step: Nanos,
    before_fail_ppm: u64,
    after_fail_ppm: u64,
    pattern: FailurePattern,
    /// Bresenham accumulator for the spread pattern, in parts per million.
    acc: u64,
}

impl Downstream {
    fn fails(&mut self, now: Nanos, rng: &mut SmallRng) -> bool {
        let ppm = if now < self.step {
            self.before_fail_ppm
        } else {
            self.after_fail_ppm
        };
        match self.pattern {
            FailurePattern::Random => rng.random_range(0..1_000_000) < ppm,
            FailurePattern::Spread => {
                self.acc += ppm;
                if self.acc >= 1_000_000 {
                    self.acc -= 1_000_000;
                    true
                } else {
                    false
                }
            }
        }
    }
}

fn fail_ppm(success: f64) -> u64 {
    ((1.0 - success) * 1e6).round() as u64
}

fn run_kind(
    cfg: &BudgetConfig,
    kind: BudgetKind,
    progress: &mut dyn FnMut(u64),
) -> Result<(BudgetRow, u64), InvalidParam> {
    let mut vclock = VirtualClock::read_if(kind == BudgetKind::Ratio);
    let budget = kind
        .build(&cfg.budget, vclock.clock())
        .map_err(|e| invalid_budget(&e))?;
    let backoff = Strategy::Full
        .backoff(cfg.base, cfg.cap)
        .map_err(|e| InvalidParam::new("cap", e.to_string()))?;
    let policy = RetryPolicy::new(cfg.retries + 1).with_backoff(backoff);
    policy
        .validate()
        .map_err(|e| InvalidParam::new("retries", e.to_string()))?;
    let duration = nanos(cfg.duration);
    let step = nanos(cfg.step_at);
    let latency = nanos(cfg.latency);
    let mut downstream = Downstream {
        step,
        before_fail_ppm: fail_ppm(cfg.before),
        after_fail_ppm: fail_ppm(cfg.after),
        pattern: cfg.failures,
        acc: 0,
    };
    let mut rng = rng::stream(cfg.seed, kind as u64);
    let mut requests: Slab<RetryRun<'_, dyn RetryBudget>> = Slab::new();
    let mut queue = EventQueue::with_capacity(1024);
    let bin = nanos(cfg.bin);
    let mut retries = Bins::new(bin, duration);
    // The second before the step (or all of it, if shorter) and the last second of the run
    // (or all that follows the step, if shorter).
    let before = Window::new(step.saturating_sub(NANOS_PER_SEC), step);
    let after = Window::new(duration.saturating_sub(NANOS_PER_SEC).max(step), duration);
    let (mut before_counts, mut after_counts) = (Counts::default(), Counts::default());
    let mut shutoff: Option<Nanos> = None;
    let mut refused = 0u64;
    let mut events = 0u64;
    let mut arrived = 0u64;
    queue.push(0, pack(ARRIVAL, 0, 0));
    while let Some((now, payload)) = queue.pop() {
        events += 1;
        vclock.advance_to(now);
        let (kind_of, slot, _) = unpack(payload);
        if kind_of == ARRIVAL {
            let run = RetryRun::start(&policy, &*budget, false);
            let id = requests
                .insert(run)
                .ok_or_else(|| InvalidParam::new("rate", "too many requests in flight"))?;
            for (w, c) in [(&before, &mut before_counts), (&after, &mut after_counts)] {
                if w.holds(now) {
                    c.requests += 1;
                    c.attempts += 1;
                }
            }
            queue.push(now.saturating_add(latency), pack(DONE, id, 0));
            arrived += 1;
            let next = nth_of_rate(0, arrived, cfg.rate);
            if next < duration {
                queue.push(next, pack(ARRIVAL, 0, 0));
            }
            if arrived % 1024 == 0 {
                progress(now / 1_000_000);
            }
            continue;
        }
        let Some(run) = requests.get_mut(slot) else {
            continue;
        };
        let outcome = if downstream.fails(now, &mut rng) {
            Outcome::Retryable
        } else {
            Outcome::Success
        };
        match run.finish_attempt(outcome.into(), || None, &mut rng) {
            Decision::Retry { delay, .. } => {
                let send = now.saturating_add(nanos(delay));
                if send < duration {
                    retries.add(send);
                }
                for (w, c) in [(&before, &mut before_counts), (&after, &mut after_counts)] {
                    if w.holds(send) {
                        c.retries += 1;
                        c.attempts += 1;
                    }
                }
                queue.push(send.saturating_add(latency), pack(DONE, slot, 0));
            }
            Decision::Stop(reason) => {
                if reason == StopReason::Succeeded {
                    if after.holds(now) {
                        after_counts.successes += 1;
                    }
                } else if reason == StopReason::BudgetExhausted {
                    refused += 1;
                    if now >= step && shutoff.is_none() {
                        shutoff = Some(now - step);
                    }
                }
                requests.remove(slot);
            }
        }
    }
    progress(duration / 1_000_000);
    let requests_after = after_counts.requests.max(1) as f64;
    let bins_per_sec = NANOS_PER_SEC as f64 / bin as f64;
    let series_len = usize::try_from(duration.div_ceil(bin)).unwrap_or(0);
    let row = BudgetRow {
        scenario: "budget",
        strategy: kind,
        label: kind.label(),
        parameters: cfg.clone(),
        shutoff_ms: shutoff.map(|n| round(millis(n), 3)),
        retries_per_s_before: round(before.per_second(before_counts.retries), 2),
        retries_per_s_after: round(after.per_second(after_counts.retries), 2),
        retry_share_after: round(after_counts.retries as f64 / requests_after, 4),
        load_after: round(after_counts.attempts as f64 / requests_after, 4),
        success_after: round(after_counts.successes as f64 / requests_after, 4),
        refused,
        retries_per_s: retries
            .counts()
            .iter()
            .take(series_len)
            .map(|&c| round(c as f64 * bins_per_sec, 3))
            .collect(),
    };
    Ok((row, events))
}
