//! `occ`: clients contending on optimistic concurrency — Brooker's "Exponential Backoff And
//! Jitter" set-up.
//!
//! N clients start together; each wants to update one shared row once. An update is a read
//! (learning the row's version) followed by a conditional write that succeeds only if the
//! version has not changed since. Every message crosses a network with delay |N(10 ms,
//! 2 ms)|. A client whose write lost the race backs off (the core's decision and backoff,
//! base 5 ms, cap 2 s) and tries again, until it wins. The figures per jitter kind are the
//! writes sent (the *calls*, the work the contended resource does) and the time until the
//! last client is done, each averaged over `runs` runs.
//!
//! # Reading the figures
//!
//! Contention is the retry storm in miniature: without jitter, clients that collided once
//! collide again on every later attempt, so exponential backoff alone mostly adds waiting.
//! Full jitter spreads the retries so each round has fewer contenders: at 100 clients it needs
//! under half the calls of plain exponential backoff (about 875 against 1850) and finishes in
//! about 5 s instead of a minute. Equal jitter needs as few calls but finishes later;
//! decorrelated jitter needs a few more calls and finishes as fast.
//!
//! Delays follow the core's convention (retry *n* waits up to base · 2^(n−1)); Brooker's
//! simulator waits up to base · 2^n, so its first retry waits twice as long for the same base.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand_distr::{Distribution, Normal};
use serde::Serialize;
use stormguard::budget::Unlimited;
use stormguard::classify::Outcome;
use stormguard::retry::{Decision, RetryPolicy, RetryRun};

use crate::error::{self, InvalidParam};
use crate::progress::Progress;
use crate::queue::{EventQueue, pack, unpack};
use crate::report::round;
use crate::rng;
use crate::strategy::Strategy;
use crate::time::{Nanos, millis, nanos};

/// Parameters of the OCC set-up.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OccConfig {
    /// Numbers of contending clients; one row per strategy and number.
    pub clients: Vec<u32>,
    /// Runs averaged per row.
    pub runs: u32,
    /// Backoff base.
    #[serde(with = "crate::report::seconds")]
    pub base: Duration,
    /// Backoff cap.
    #[serde(with = "crate::report::seconds")]
    pub cap: Duration,
    /// Mean one-way network delay.
    #[serde(with = "crate::report::seconds")]
    pub delay: Duration,
    /// Standard deviation of the network delay.
    #[serde(with = "crate::report::seconds")]
    pub delay_sd: Duration,
    /// Rows of the table.
    #[serde(skip)]
    pub strategies: Vec<Strategy>,
    /// Seed of every random draw.
    pub seed: u64,
}

impl Default for OccConfig {
    /// Brooker's set-up at 100 clients: 100 runs, base 5 ms, cap 2 s, delay |N(10 ms, 2 ms)|,
    /// exponential without jitter, full, equal and decorrelated jitter.
    fn default() -> Self {
        OccConfig {
            clients: vec![100],
            runs: 100,
            base: Duration::from_millis(5),
            cap: Duration::from_secs(2),
            delay: Duration::from_millis(10),
            delay_sd: Duration::from_millis(2),
            strategies: vec![
                Strategy::Exponential,
                Strategy::Full,
                Strategy::Equal,
                Strategy::Decorrelated,
            ],
            seed: 42,
        }
    }
}

/// The most clients one row may have.
pub const MAX_CLIENTS: u32 = 100_000;

impl OccConfig {
    /// Checks every parameter; the error names the flag.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        error::non_empty("clients", &self.clients)?;
        if self.clients.iter().any(|&c| c == 0 || c > MAX_CLIENTS) {
            return Err(InvalidParam::new(
                "clients",
                format!("each must be between 1 and {MAX_CLIENTS}"),
            ));
        }
        if self.runs == 0 || self.runs > 100_000 {
            return Err(InvalidParam::new("runs", "must be between 1 and 100000"));
        }
        error::backoff_range(self.base, self.cap)?;
        error::bounded_duration("delay", self.delay)?;
        error::bounded_duration("delay-sd", self.delay_sd)?;
        error::non_empty("strategy", &self.strategies)?;
        let work: f64 = self
            .clients
            .iter()
            .map(|&c| f64::from(c).powi(2))
            .sum::<f64>()
            * f64::from(self.runs)
            * self.strategies.len() as f64;
        if work > 1e10 {
            return Err(InvalidParam::new(
                "runs",
                "clients² × runs × strategies is too large to simulate (over 1e10)",
            ));
        }
        Ok(())
    }
}

/// One strategy's figures at one number of clients.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OccRow {
    /// Always `"occ"`.
    pub scenario: &'static str,
    /// The strategy's command-line name.
    pub strategy: Strategy,
    /// The table label.
    pub label: &'static str,
    /// The run's parameters.
    pub parameters: OccConfig,
    /// Contending clients in this row.
    pub clients: u32,
    /// Writes sent per run, on average.
    pub calls: f64,
    /// Time until the last client finished, in milliseconds, on average.
    pub completion_ms: f64,
}

/// The OCC set-up's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OccReport {
    /// One row per client number and strategy.
    pub rows: Vec<OccRow>,
    /// Events handled.
    #[serde(skip)]
    pub events: u64,
}

/// Runs the set-up.
///
/// ```
/// use stormguard_sim::progress::NoProgress;
/// use stormguard_sim::scenario::occ::{OccConfig, run};
/// use stormguard_sim::strategy::Strategy;
///
/// let cfg = OccConfig { clients: vec![20], runs: 10, strategies: vec![Strategy::Full], ..OccConfig::default() };
/// let row = &run(&cfg, &mut NoProgress)?.rows[0];
/// assert!(row.calls >= 20.0);
/// # Ok::<(), stormguard_sim::error::InvalidParam>(())
/// ```
pub fn run(cfg: &OccConfig, progress: &mut dyn Progress) -> Result<OccReport, InvalidParam> {
    cfg.validate()?;
    let net = Normal::new(
        cfg.delay.as_secs_f64() * 1e3,
        cfg.delay_sd.as_secs_f64() * 1e3,
    )
    .map_err(|e| InvalidParam::new("delay-sd", e.to_string()))?;
    let total = u64::from(cfg.runs) * (cfg.clients.len() * cfg.strategies.len()) as u64;
    progress.start(total);
    let mut rows = Vec::new();
    let mut events = 0;
    let mut done = 0;
    let mut sim = Sim::default();
    for &clients in &cfg.clients {
        for &strategy in &cfg.strategies {
            let backoff = strategy
                .backoff(cfg.base, cfg.cap)
                .map_err(|e| InvalidParam::new("cap", e.to_string()))?;
            let policy = RetryPolicy::new(u32::MAX).with_backoff(backoff);
            policy
                .validate()
                .map_err(|e| InvalidParam::new("strategy", e.to_string()))?;
            let mut rng = rng::stream(
                cfg.seed,
                rng::stream_id(&[strategy.index(), u64::from(clients)]),
            );
            let (mut calls, mut time) = (0u64, 0u64);
            for _ in 0..cfg.runs {
                let (c, t, e) = sim.run(clients, &policy, &net, &mut rng);
                calls += c;
                time += t;
                events += e;
                done += 1;
                progress.set(done);
            }
            let runs = f64::from(cfg.runs);
            rows.push(OccRow {
                scenario: "occ",
                strategy,
                label: strategy.label(),
                parameters: cfg.clone(),
                clients,
                calls: round(calls as f64 / runs, 2),
                completion_ms: round(millis(time) / runs, 3),
            });
        }
    }
    progress.finish();
    Ok(OccReport { rows, events })
}

const READ_ARRIVES: u8 = 0;
const READ_RETURNS: u8 = 1;
const WRITE_ARRIVES: u8 = 2;
const WRITE_RETURNS: u8 = 3;

/// Reused buffers for one run after another.
#[derive(Default)]
struct Sim {
    queue: EventQueue,
    /// Per client: the version its last read saw, and whether its last write won.
    seen: Vec<(u64, bool)>,
}

impl Sim {
    /// One run: `(writes, completion time, events)`.
    fn run(
        &mut self,
        clients: u32,
        policy: &RetryPolicy,
        net: &Normal<f64>,
        rng: &mut SmallRng,
    ) -> (u64, Nanos, u64) {
        let delay = |rng: &mut SmallRng| (net.sample(rng).abs() * 1e6) as Nanos;
        self.queue.clear();
        self.seen.clear();
        self.seen.resize(clients as usize, (0, false));
        let mut runs: Vec<RetryRun<'_, Unlimited>> = (0..clients)
            .map(|_| RetryRun::start(policy, &Unlimited, false))
            .collect();
        for c in 0..clients {
            let at = delay(rng);
            self.queue.push(at, pack(READ_ARRIVES, c, 0));
        }
        let mut version = 0u64;
        let (mut writes, mut last, mut events) = (0u64, 0, 0u64);
        while let Some((now, payload)) = self.queue.pop() {
            events += 1;
            last = now;
            let (kind, c, _) = unpack(payload);
            let Some(seen) = self.seen.get_mut(c as usize) else {
                continue;
            };
            let next = match kind {
                READ_ARRIVES => {
                    seen.0 = version;
                    READ_RETURNS
                }
                READ_RETURNS => WRITE_ARRIVES,
                WRITE_ARRIVES => {
                    writes += 1;
                    seen.1 = seen.0 == version;
                    if seen.1 {
                        version += 1;
                    }
                    WRITE_RETURNS
                }
                _ => {
                    let outcome = if seen.1 {
                        Outcome::Success
                    } else {
                        Outcome::Retryable
                    };
                    let Some(run) = runs.get_mut(c as usize) else {
                        continue;
                    };
                    if let Decision::Retry { delay: wait, .. } =
                        run.finish_attempt(outcome.into(), || None, rng)
                    {
                        let at = now + delay(rng) + nanos(wait);
                        self.queue.push(at, pack(READ_ARRIVES, c, 0));
                    }
                    continue;
                }
            };
            let at = now + delay(rng);
            self.queue.push(at, pack(next, c, 0));
        }
        (writes, last, events)
    }
}
