//! `storm`: N clients fail at the same instant and each retries R times.
//!
//! This is the seeds' table. Every client starts a logical request at t = 0 whose every
//! attempt fails; the core's retry decision ([`RetryRun::finish_attempt`]) says how long to
//! wait before each retry, and each retry is counted in the bin of the instant it is sent.
//! The figures per strategy are the total number of retries, the fullest bin (the peak the
//! downstream must absorb) and the instant of the last retry.
//!
//! # Why no event queue
//!
//! Storm clients do not interact: nothing one client does changes another's delays (there is
//! no budget and no downstream state). So each client's retry instants are generated in order
//! and binned directly, one client after the other. That gives exactly the bins an event
//! queue would, with O(1) memory per client in flight (one per thread) plus the bins — ten
//! million clients need a few kilobytes besides them — and no queue traffic. Clients are cut
//! into chunks of [`CHUNK`], each drawing from its own random stream, so several threads can
//! share the work and the figures do not depend on how many do. The scenarios where requests
//! interact (`budget`, `overload`, `chain`, `occ`) run on the
//! [`EventQueue`](crate::queue::EventQueue).
//!
//! # Reading the figures
//!
//! Fixed and exponential delays leave the peak at N: every client's *k*-th retry lands in the
//! same instant; exponential only moves the instants later. Only jitter spreads them: full
//! jitter gives the lowest peaks, equal jitter keeps a minimum gap at the price of a higher
//! peak, decorrelated jitter spreads from the first retry on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use stormguard::budget::Unlimited;
use stormguard::classify::Outcome;
use stormguard::retry::{AttemptOutcome, Decision, RetryPolicy, RetryRun};

use crate::bins::Bins;
use crate::error::{self, InvalidParam};
use crate::progress::Progress;
use crate::rng;
use crate::strategy::Strategy;
use crate::time::{Nanos, nanos, seconds};

/// Parameters of a storm.
///
/// `threads` is not a parameter of the model and is not serialised.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StormConfig {
    /// Clients failing at t = 0 (at least 1).
    pub clients: u64,
    /// Retries per client (at most 10 000).
    pub retries: u32,
    /// Backoff base.
    #[serde(with = "crate::report::seconds")]
    pub base: Duration,
    /// Backoff cap.
    #[serde(with = "crate::report::seconds")]
    pub cap: Duration,
    /// Bin width.
    #[serde(with = "crate::report::seconds")]
    pub bin: Duration,
    /// Rows of the table.
    #[serde(skip)]
    pub strategies: Vec<Strategy>,
    /// Seed of every random draw.
    pub seed: u64,
    /// Threads sharing the clients (1 = this thread only). The figures do not depend on it:
    /// clients are cut into chunks of [`CHUNK`], each with its own random stream.
    #[serde(skip)]
    pub threads: usize,
}

impl Default for StormConfig {
    /// The seeds' table: 1000 clients, 4 retries, base 1 s, cap 30 s, 100 ms bins, all six
    /// strategies (the seeds' fixed, exponential and full jitter, plus linear, equal and
    /// decorrelated), seed 42.
    fn default() -> Self {
        StormConfig {
            clients: 1000,
            retries: 4,
            base: Duration::from_secs(1),
            cap: Duration::from_secs(30),
            bin: Duration::from_millis(100),
            strategies: vec![
                Strategy::Fixed,
                Strategy::Linear,
                Strategy::Exponential,
                Strategy::Full,
                Strategy::Equal,
                Strategy::Decorrelated,
            ],
            seed: 42,
            threads: 1,
        }
    }
}

/// The most retries per client a storm accepts.
pub const MAX_RETRIES: u32 = 10_000;

/// The most clients a storm accepts.
pub const MAX_CLIENTS: u64 = 1_000_000_000;

impl StormConfig {
    /// The longest a storm can last: every retry waits the cap.
    pub fn horizon(&self) -> Nanos {
        nanos(self.cap).saturating_mul(u64::from(self.retries))
    }

    /// Checks every parameter; the error names the flag.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return Err(InvalidParam::new(
                "clients",
                format!("must be between 1 and {MAX_CLIENTS}"),
            ));
        }
        if self.retries == 0 || self.retries > MAX_RETRIES {
            return Err(InvalidParam::new(
                "retries",
                format!("must be between 1 and {MAX_RETRIES}"),
            ));
        }
        error::backoff_range(self.base, self.cap)?;
        error::non_empty("strategy", &self.strategies)?;
        error::bin_width(self.bin, self.horizon())?;
        Ok(())
    }
}

/// One strategy's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StormRow {
    /// Always `"storm"`.
    pub scenario: &'static str,
    /// The strategy's command-line name.
    pub strategy: Strategy,
    /// The table label.
    pub label: &'static str,
    /// The run's parameters.
    pub parameters: StormConfig,
    /// Retries sent by all clients.
    pub total_retries: u64,
    /// Retries in the fullest bin.
    pub peak_per_bin: u64,
    /// Start of the fullest bin, in seconds.
    pub peak_at_s: f64,
    /// Instant of the last retry, in seconds.
    pub last_retry_s: f64,
    /// Retries per bin, bin 0 first (not serialised: the plot draws it).
    #[serde(skip)]
    pub per_bin: Vec<u64>,
}

/// A storm's result: one row per strategy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StormReport {
    /// One row per strategy, in the order asked for.
    pub rows: Vec<StormRow>,
    /// Retry decisions simulated (the storm's events).
    #[serde(skip)]
    pub events: u64,
}

/// Clients per chunk. Each chunk draws from its own random stream, so the figures do not
/// depend on how many threads share the work.
pub const CHUNK: u64 = 1 << 16;

/// Runs a storm.
///
/// ```
/// use stormguard_sim::progress::NoProgress;
/// use stormguard_sim::scenario::storm::{StormConfig, run};
/// use stormguard_sim::strategy::Strategy;
///
/// let cfg = StormConfig { strategies: vec![Strategy::Exponential], ..StormConfig::default() };
/// let report = run(&cfg, &mut NoProgress)?;
/// let row = &report.rows[0];
/// assert_eq!((row.total_retries, row.peak_per_bin, row.last_retry_s), (4000, 1000, 15.0));
/// # Ok::<(), stormguard_sim::error::InvalidParam>(())
/// ```
pub fn run(cfg: &StormConfig, progress: &mut dyn Progress) -> Result<StormReport, InvalidParam> {
    cfg.validate()?;
    progress.start(cfg.clients.saturating_mul(cfg.strategies.len() as u64));
    let mut rows = Vec::with_capacity(cfg.strategies.len());
    let mut events = 0;
    for (i, &strategy) in cfg.strategies.iter().enumerate() {
        let row = run_strategy(cfg, strategy, &mut |done| {
            progress.set(cfg.clients * i as u64 + done);
        })?;
        events += row.total_retries;
        rows.push(row);
    }
    progress.finish();
    Ok(StormReport { rows, events })
}

/// What one thread gathered over the chunks it ran.
struct Partial {
    bins: Bins,
    total: u64,
    last: Nanos,
}

fn run_strategy(
    cfg: &StormConfig,
    strategy: Strategy,
    progress: &mut dyn FnMut(u64),
) -> Result<StormRow, InvalidParam> {
    let backoff = strategy
        .backoff(cfg.base, cfg.cap)
        .map_err(|e| InvalidParam::new("cap", e.to_string()))?;
    let policy = RetryPolicy::new(cfg.retries + 1).with_backoff(backoff);
    policy
        .validate()
        .map_err(|e| InvalidParam::new("retries", e.to_string()))?;
    let chunks = cfg.clients.div_ceil(CHUNK);
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let new_partial = || Partial {
        bins: Bins::new(nanos(cfg.bin), cfg.horizon()),
        total: 0,
        last: 0,
    };
    // Takes chunks until none is left; `between` runs after each chunk.
    let work = |part: &mut Partial, between: &mut dyn FnMut()| {
        loop {
            let chunk = next.fetch_add(1, Ordering::Relaxed);
            if chunk >= chunks {
                break;
            }
            let first = chunk * CHUNK;
            let clients = CHUNK.min(cfg.clients - first);
            run_chunk(cfg, &policy, strategy, chunk, clients, part);
            done.fetch_add(clients, Ordering::Relaxed);
            between();
        }
    };
    let threads = cfg
        .threads
        .clamp(1, 64)
        .min(usize::try_from(chunks).unwrap_or(1));
    let mut total = new_partial();
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut part = new_partial();
                    work(&mut part, &mut || {});
                    part
                })
            })
            .collect();
        work(&mut total, &mut || progress(done.load(Ordering::Relaxed)));
        for helper in helpers {
            // A helper cannot panic short of a bug; its share is then simply missing and
            // the totals show it.
            if let Ok(part) = helper.join() {
                total.merge(&part);
            }
        }
    });
    progress(cfg.clients);
    let Partial {
        mut bins,
        total,
        last,
    } = total;
    let (peak_bin, peak) = bins.peak().unwrap_or((0, 0));
    bins.truncate_trailing_zeros(1);
    Ok(StormRow {
        scenario: "storm",
        strategy,
        label: strategy.label(),
        parameters: cfg.clone(),
        total_retries: total,
        peak_per_bin: peak,
        peak_at_s: seconds(peak_bin as u64 * nanos(cfg.bin)),
        last_retry_s: seconds(last),
        per_bin: bins.counts().to_vec(),
    })
}

/// Runs `clients` clients of chunk `chunk` into `part`.
fn run_chunk(
    cfg: &StormConfig,
    policy: &RetryPolicy,
    strategy: Strategy,
    chunk: u64,
    clients: u64,
    part: &mut Partial,
) {
    let mut rng = rng::stream(cfg.seed, rng::stream_id(&[strategy.index(), chunk]));
    let failed = AttemptOutcome::from(Outcome::Retryable);
    for _ in 0..clients {
        // Every attempt fails; the core decides each wait until it stops.
        let mut run = RetryRun::start(policy, &Unlimited, false);
        let mut at: Nanos = 0;
        while let Decision::Retry { delay, .. } = run.finish_attempt(failed, || None, &mut rng) {
            at = at.saturating_add(nanos(delay));
            part.bins.add(at);
            part.total += 1;
        }
        part.last = part.last.max(at);
    }
}

impl Partial {
    fn merge(&mut self, other: &Partial) {
        for (i, &c) in other.bins.counts().iter().enumerate() {
            if c > 0 {
                self.bins.add_n(i as u64 * self.bins.width(), c);
            }
        }
        self.total += other.total;
        self.last = self.last.max(other.last);
    }
}
