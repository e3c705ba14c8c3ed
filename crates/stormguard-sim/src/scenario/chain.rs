//! `chain`: L layers each retrying their call to the layer below, over a failing service.
//!
//! Retries multiply, they do not add: when the bottom service is down, a call that enters a
//! chain of L layers, where layer *i* makes up to 1 + r*i* attempts, reaches the bottom
//! ∏(1 + r*i*) times (3 layers × 2 retries: 27×; × 3 retries: 64×; 5 layers × 3 tries: 243×).
//! The simulation sends `rate` entry requests per second for `duration`, lets every layer's
//! [`RetryRun`] decide its retries, and counts the requests each layer receives.
//!
//! # Modes
//!
//! - `every-layer`: every layer retries, no budget — the multiplication above;
//! - `entry-only`: only the entry layer retries ("only one layer of a chain retries") — 1 + r;
//! - `budget`: every layer retries, each with its own ratio budget (Google SRE's per-client
//!   budget: retries ≤ `retry-ratio` of requests, 10 % by default, no reserve). Each layer
//!   adds at most 10 %, but the budgets compound: about 1.1^L at the bottom;
//! - `budget-nack`: the same, and a layer that gives up after retrying answers "already
//!   retried, don't retry" (`X-Retry-Exhausted`, Finagle's non-retryable nack), which the
//!   layer above classifies as a failure never to retry. Only the lowest layer retries, within
//!   its budget: about 1.1× at the bottom, the SRE book's figure.
//!
//! Time matters only through the ratio budgets' window: each hop's call to the service takes
//! `latency`, retries wait the core's backoff (exponential from `base` to `cap`, full jitter).

use std::time::Duration;

use rand::Rng;
use rand::rngs::SmallRng;
use serde::Serialize;
use stormguard::budget::{RatioBudget, RetryBudget, Unlimited};
use stormguard::classify::Outcome;
use stormguard::clock::Clock;
use stormguard::retry::{Decision, RetryPolicy, RetryRun, StopReason};

use crate::error::{self, InvalidParam};
use crate::progress::Progress;
use crate::queue::{EventQueue, pack, unpack};
use crate::report::round;
use crate::rng;
use crate::slab::Slab;
use crate::strategy::Strategy;
use crate::time::{Nanos, nanos, nth_of_rate};
use crate::vclock::VirtualClock;

/// Where retries happen, and what limits them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChainMode {
    /// Every layer retries, without a budget.
    EveryLayer,
    /// Only the entry layer retries.
    EntryOnly,
    /// Every layer retries within its own ratio budget.
    Budget,
    /// Every layer retries within its own ratio budget, and failures after retrying are
    /// passed up as "don't retry".
    BudgetNack,
}

impl ChainMode {
    /// Every mode, in table order.
    pub const ALL: [ChainMode; 4] = [
        ChainMode::EveryLayer,
        ChainMode::EntryOnly,
        ChainMode::Budget,
        ChainMode::BudgetNack,
    ];

    /// The command-line name.
    pub const fn name(self) -> &'static str {
        match self {
            ChainMode::EveryLayer => "every-layer",
            ChainMode::EntryOnly => "entry-only",
            ChainMode::Budget => "budget",
            ChainMode::BudgetNack => "budget-nack",
        }
    }

    /// A label for tables.
    pub const fn label(self) -> &'static str {
        match self {
            ChainMode::EveryLayer => "every layer retries",
            ChainMode::EntryOnly => "entry layer only",
            ChainMode::Budget => "every layer, ratio budget",
            ChainMode::BudgetNack => "every layer, budget + don't-retry nack",
        }
    }

    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<ChainMode> {
        ChainMode::ALL.into_iter().find(|m| m.name() == name)
    }

    fn budgeted(self) -> bool {
        matches!(self, ChainMode::Budget | ChainMode::BudgetNack)
    }
}

/// Parameters of a chain.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChainConfig {
    /// Layers that retry, entry first (1 to 16); the service sits below the last.
    pub layers: u32,
    /// Retries per layer: one value for every layer, or one per layer, entry first.
    pub retries: Vec<u32>,
    /// Entry requests per second.
    pub rate: f64,
    /// How long entry requests arrive.
    #[serde(with = "crate::report::seconds")]
    pub duration: Duration,
    /// Probability that the service fails an attempt (1.0: the service is down).
    pub fail_prob: f64,
    /// The service's response time.
    #[serde(with = "crate::report::seconds")]
    pub latency: Duration,
    /// Backoff base (exponential, full jitter).
    #[serde(with = "crate::report::seconds")]
    pub base: Duration,
    /// Backoff cap.
    #[serde(with = "crate::report::seconds")]
    pub cap: Duration,
    /// Ratio budget per layer in the budget modes: retries as a fraction of requests (0.1 =
    /// 10 %; 0..=1, the core's rule).
    pub retry_ratio: f64,
    /// Rows of the table.
    #[serde(skip)]
    pub modes: Vec<ChainMode>,
    /// Seed of every random draw.
    pub seed: u64,
}

impl Default for ChainConfig {
    /// The seeds' chain: 3 layers retrying twice over a service that is down, 10 000 entry
    /// requests per second for 1 s, 1 ms service time, backoff 10 ms to 1 s, 10 % budgets.
    fn default() -> Self {
        ChainConfig {
            layers: 3,
            retries: vec![2],
            rate: 10_000.0,
            duration: Duration::from_secs(1),
            fail_prob: 1.0,
            latency: Duration::from_millis(1),
            base: Duration::from_millis(10),
            cap: Duration::from_secs(1),
            retry_ratio: 0.1,
            modes: ChainMode::ALL.to_vec(),
            seed: 42,
        }
    }
}

/// The most layers a chain may have.
pub const MAX_LAYERS: u32 = 16;

/// The most service calls a chain may be asked to simulate (entries × ∏(1 + r)).
pub const MAX_WORK: f64 = 1e9;

impl ChainConfig {
    /// Retries of layer `i` (entry = 0).
    pub fn retries_of(&self, i: usize) -> u32 {
        match self.retries.as_slice() {
            [one] => *one,
            many => many.get(i).copied().unwrap_or(0),
        }
    }

    /// Entry requests in the run.
    pub fn entries(&self) -> u64 {
        (self.rate * self.duration.as_secs_f64()).round() as u64
    }

    /// ∏(1 + r*i*): what the service sees per entry request when every layer retries and
    /// every attempt fails.
    pub fn worst_case_amplification(&self) -> f64 {
        (0..self.layers as usize)
            .map(|i| 1.0 + f64::from(self.retries_of(i)))
            .product()
    }

    /// Checks every parameter; the error names the flag.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        if self.layers == 0 || self.layers > MAX_LAYERS {
            return Err(InvalidParam::new(
                "layers",
                format!("must be between 1 and {MAX_LAYERS}"),
            ));
        }
        let n = self.retries.len();
        if n == 0 || (n != 1 && n != self.layers as usize) {
            return Err(InvalidParam::new(
                "retries",
                format!(
                    "give one value for every layer or {} values, one per layer",
                    self.layers
                ),
            ));
        }
        if self.retries.iter().any(|&r| r > 100) {
            return Err(InvalidParam::new("retries", "at most 100 per layer"));
        }
        error::in_range("rate", self.rate, 1e-3, 1e7)?;
        error::positive_duration("duration", self.duration)?;
        if self.entries() == 0 {
            return Err(InvalidParam::new(
                "duration",
                "no entry request arrives in so short a run at this rate",
            ));
        }
        error::in_range("fail-prob", self.fail_prob, 0.0, 1.0)?;
        error::bounded_duration("latency", self.latency)?;
        error::backoff_range(self.base, self.cap)?;
        layer_budget(self, VirtualClock::new().clock())?;
        error::non_empty("mode", &self.modes)?;
        if self.entries() as f64 * self.worst_case_amplification() > MAX_WORK {
            return Err(InvalidParam::new(
                "rate",
                format!(
                    "{} entry requests × {}× amplification is more than {MAX_WORK} service calls",
                    self.entries(),
                    self.worst_case_amplification()
                ),
            ));
        }
        Ok(())
    }
}

/// One mode's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChainRow {
    /// Always `"chain"`.
    pub scenario: &'static str,
    /// The mode's command-line name.
    pub strategy: ChainMode,
    /// The table label.
    pub label: &'static str,
    /// The run's parameters.
    pub parameters: ChainConfig,
    /// Requests received by each layer, entry first, then the service.
    pub requests_per_layer: Vec<u64>,
    /// The same divided by the entry requests.
    pub amplification_per_layer: Vec<f64>,
    /// Requests the service received per entry request.
    pub amplification: f64,
    /// Entry requests that succeeded, as a fraction.
    pub success_rate: f64,
}

/// A chain's result: one row per mode.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChainReport {
    /// One row per mode, in the order asked for.
    pub rows: Vec<ChainRow>,
    /// Events handled.
    #[serde(skip)]
    pub events: u64,
}

/// Runs a chain, one simulation per mode.
///
/// ```
/// use stormguard_sim::progress::NoProgress;
/// use stormguard_sim::scenario::chain::{ChainConfig, ChainMode, run};
///
/// let cfg = ChainConfig { rate: 100.0, modes: vec![ChainMode::EveryLayer], ..ChainConfig::default() };
/// assert_eq!(run(&cfg, &mut NoProgress)?.rows[0].amplification, 27.0);
/// # Ok::<(), stormguard_sim::error::InvalidParam>(())
/// ```
pub fn run(cfg: &ChainConfig, progress: &mut dyn Progress) -> Result<ChainReport, InvalidParam> {
    cfg.validate()?;
    let entries = cfg.entries();
    progress.start(entries.saturating_mul(cfg.modes.len() as u64));
    let mut rows = Vec::with_capacity(cfg.modes.len());
    let mut events = 0;
    for (i, &mode) in cfg.modes.iter().enumerate() {
        let (row, n) = run_mode(cfg, mode, &mut |done| {
            progress.set(entries * i as u64 + done);
        })?;
        events += n;
        rows.push(row);
    }
    progress.finish();
    Ok(ChainReport { rows, events })
}

const ARRIVAL: u8 = 0;
const SEND: u8 = 1;
const REPLY: u8 = 2;

/// What a layer passes up for its call.
const OK: u32 = 0;
const FAILED: u32 = 1;
/// Failed, and the layer below already retried: do not retry again.
const NACK: u32 = 2;

const NO_PARENT: u32 = u32::MAX;

struct Call<'p> {
    layer: usize,
    parent: u32,
    run: RetryRun<'p, dyn RetryBudget + 'p>,
}

/// The mutable state of one simulation.
struct World<'p> {
    cfg: &'p ChainConfig,
    mode: ChainMode,
    policies: &'p [RetryPolicy],
    budgets: &'p [Box<dyn RetryBudget>],
    calls: Slab<Call<'p>>,
    queue: EventQueue,
    rng: SmallRng,
    requests: Vec<u64>,
    succeeded: u64,
    latency: Nanos,
}

/// One layer's ratio budget: `retry_ratio` of its requests over 10 s, no reserve (the core's
/// rules; the error names `--retry-ratio`).
fn layer_budget(cfg: &ChainConfig, clock: Clock) -> Result<RatioBudget, InvalidParam> {
    RatioBudget::new(cfg.retry_ratio, Duration::from_secs(10), 0, clock)
        .map_err(|e| InvalidParam::new("retry-ratio", e.to_string()))
}

fn run_mode(
    cfg: &ChainConfig,
    mode: ChainMode,
    progress: &mut dyn FnMut(u64),
) -> Result<(ChainRow, u64), InvalidParam> {
    let layers = cfg.layers as usize;
    let backoff = Strategy::Full
        .backoff(cfg.base, cfg.cap)
        .map_err(|e| InvalidParam::new("cap", e.to_string()))?;
    let policies: Vec<RetryPolicy> = (0..layers)
        .map(|i| {
            let retries = if mode == ChainMode::EntryOnly && i > 0 {
                0
            } else {
                cfg.retries_of(i)
            };
            let policy = RetryPolicy::new(retries + 1).with_backoff(backoff);
            policy
                .validate()
                .map(|()| policy)
                .map_err(|e| InvalidParam::new("retries", e.to_string()))
        })
        .collect::<Result<_, _>>()?;
    let mut vclock = VirtualClock::read_if(mode.budgeted());
    let budgets: Vec<Box<dyn RetryBudget>> = (0..layers)
        .map(|_| -> Result<Box<dyn RetryBudget>, InvalidParam> {
            if mode.budgeted() {
                Ok(Box::new(layer_budget(cfg, vclock.clock())?))
            } else {
                Ok(Box::new(Unlimited))
            }
        })
        .collect::<Result<_, _>>()?;
    let entries = cfg.entries();
    let mut w = World {
        cfg,
        mode,
        policies: &policies,
        budgets: &budgets,
        calls: Slab::new(),
        queue: EventQueue::with_capacity(1024),
        rng: rng::stream(cfg.seed, mode as u64),
        requests: vec![0; layers + 1],
        succeeded: 0,
        latency: nanos(cfg.latency),
    };
    w.queue.push(0, pack(ARRIVAL, 0, 0));
    let mut arrived = 0u64;
    let mut events = 0u64;
    while let Some((now, payload)) = w.queue.pop() {
        events += 1;
        vclock.advance_to(now);
        let (kind, slot, operand) = unpack(payload);
        match kind {
            ARRIVAL => {
                let id = w.start_call(0, NO_PARENT)?;
                w.send(now, id)?;
                arrived += 1;
                if arrived < entries {
                    w.queue
                        .push(nth_of_rate(0, arrived, cfg.rate), pack(ARRIVAL, 0, 0));
                }
                if arrived % 4096 == 0 {
                    progress(arrived);
                }
            }
            SEND => w.send(now, slot)?,
            _ => w.reply(now, slot, operand),
        }
    }
    progress(entries);
    let requests = w.requests.clone();
    let entry = requests.first().copied().unwrap_or(0).max(1) as f64;
    let row = ChainRow {
        scenario: "chain",
        strategy: mode,
        label: mode.label(),
        parameters: cfg.clone(),
        amplification_per_layer: requests
            .iter()
            .map(|&r| round(r as f64 / entry, 4))
            .collect(),
        amplification: round(requests.last().copied().unwrap_or(0) as f64 / entry, 4),
        success_rate: round(w.succeeded as f64 / entry, 4),
        requests_per_layer: requests,
    };
    Ok((row, events))
}

impl<'p> World<'p> {
    fn start_call(&mut self, layer: usize, parent: u32) -> Result<u32, InvalidParam> {
        let (Some(policy), Some(budget)) = (self.policies.get(layer), self.budgets.get(layer))
        else {
            return Err(InvalidParam::new("layers", "layer out of range"));
        };
        if let Some(r) = self.requests.get_mut(layer) {
            *r += 1;
        }
        let run = RetryRun::start(policy, &**budget, false);
        self.calls
            .insert(Call { layer, parent, run })
            .ok_or_else(|| InvalidParam::new("rate", "too many calls in flight"))
    }

    /// Sends an attempt of call `id` to the layer below: a new call there, or the service.
    fn send(&mut self, now: Nanos, mut id: u32) -> Result<(), InvalidParam> {
        let bottom = self.policies.len() - 1;
        loop {
            let Some(layer) = self.calls.get(id).map(|c| c.layer) else {
                return Ok(());
            };
            if layer == bottom {
                if let Some(r) = self.requests.last_mut() {
                    *r += 1;
                }
                let failed =
                    self.cfg.fail_prob >= 1.0 || self.rng.random::<f64>() < self.cfg.fail_prob;
                let result = if failed { FAILED } else { OK };
                self.queue
                    .push(now.saturating_add(self.latency), pack(REPLY, id, result));
                return Ok(());
            }
            id = self.start_call(layer + 1, id)?;
        }
    }

    /// The attempt in flight of call `id` ended with `result`; decide, and pass results up.
    fn reply(&mut self, now: Nanos, mut id: u32, mut result: u32) {
        loop {
            let Some(call) = self.calls.get_mut(id) else {
                return;
            };
            let outcome = match result {
                OK => Outcome::Success,
                NACK => Outcome::NeverRetry,
                _ => Outcome::Retryable,
            };
            match call
                .run
                .finish_attempt(outcome.into(), || None, &mut self.rng)
            {
                Decision::Retry { delay, .. } => {
                    self.queue
                        .push(now.saturating_add(nanos(delay)), pack(SEND, id, 0));
                    return;
                }
                Decision::Stop(reason) => {
                    let Some(done) = self.calls.remove(id) else {
                        return;
                    };
                    let retries_here = self
                        .policies
                        .get(done.layer)
                        .is_some_and(|p| p.max_attempts() > 1);
                    result = if reason == StopReason::Succeeded {
                        OK
                    } else if self.mode == ChainMode::BudgetNack && retries_here {
                        NACK
                    } else {
                        FAILED
                    };
                    if done.parent == NO_PARENT {
                        if result == OK {
                            self.succeeded += 1;
                        }
                        return;
                    }
                    id = done.parent;
                }
            }
        }
    }
}
