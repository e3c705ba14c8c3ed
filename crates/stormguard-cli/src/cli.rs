//! The command line, declared with clap's derive API.
//!
//! Defaults here are the scenarios' documented set-ups; a test checks that parsing no flags
//! gives exactly each scenario's `Default` config, so the two cannot drift apart.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use stormguard_sim::budgets::{BudgetKind, BudgetParams};
use stormguard_sim::scenario::budget::{BudgetConfig, FailurePattern};
use stormguard_sim::scenario::chain::{ChainConfig, ChainMode};
use stormguard_sim::scenario::converge::ConvergeConfig;
use stormguard_sim::scenario::occ::OccConfig;
use stormguard_sim::scenario::overload::{LimitKind, OverloadConfig, Protection, Trigger};
use stormguard_sim::scenario::storm::StormConfig;
use stormguard_sim::scenario::whatif::{Injection, WhatIfConfig};
use stormguard_sim::strategy::Strategy;

use crate::help;
use crate::parse;

/// stormguard: keep timeouts and retries from turning a small fault into an outage.
#[derive(Debug, Parser)]
#[command(name = "stormguard", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
// Parsed once per run: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Command {
    /// Simulate retry storms, amplification, budgets and overload on a virtual clock.
    #[command(long_about = help::SIMULATE)]
    Simulate {
        /// The scenario.
        #[command(subcommand)]
        scenario: Scenario,
    },
    /// Run a policy center: versioned policies pushed to every instance.
    Center(crate::center::CenterArgs),
    /// Policy files: lint and review them (`lint`, `diff`), and manage them on a policy
    /// center (`push`, `get`, `history`, `rollback`, `status`, `audit`, `promote`, `abort`,
    /// `rules`).
    Policy {
        /// Where the center is, and who asks (the center commands only).
        #[command(flatten)]
        remote: crate::policy_center::Remote,
        /// The command.
        #[command(subcommand)]
        command: crate::governance::PolicyCommand,
    },
    /// Advise policy values from measured data: `advise timeouts`.
    Advise {
        /// The advice.
        #[command(subcommand)]
        command: crate::governance::advise::AdviseCommand,
    },
    /// Run a reference service under load and faults, and check its invariants.
    Demo {
        /// The demo.
        #[command(subcommand)]
        demo: crate::demo::Demo,
    },
    /// Run the sidecar proxy: egress (the client stack for any language) or ingress.
    Proxy {
        /// The direction.
        #[command(subcommand)]
        proxy: crate::proxy::ProxyCommand,
    },
}

/// The scenarios of `simulate`.
#[derive(Debug, Subcommand)]
pub(crate) enum Scenario {
    /// N clients fail at once and retry R times: peak per bin per backoff strategy.
    #[command(long_about = help::STORM)]
    Storm(StormArgs),
    /// Layers retrying over a failing service: traffic each layer sees.
    #[command(long_about = help::CHAIN)]
    Chain(ChainArgs),
    /// Success rate drops: how fast each retry budget kind shuts retries off.
    #[command(long_about = help::BUDGET)]
    Budget(BudgetArgs),
    /// A trigger pushes a server over capacity: does it come back, with and without protection?
    #[command(long_about = help::OVERLOAD)]
    Overload(OverloadArgs),
    /// Clients contending on optimistic concurrency: calls per jitter kind.
    #[command(long_about = help::OCC)]
    Occ(OccArgs),
    /// A server's handler gets slower mid-run: how fast the adaptive concurrency limit follows.
    #[command(long_about = help::CONVERGE)]
    Converge(ConvergeArgs),
    /// Your call graph and policy files under injected faults (the what-if), side by side
    /// with another version.
    #[command(long_about = help::POLICY)]
    Policy(PolicyArgs),
}

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Human-readable tables.
    Table,
    /// One JSON array of row objects (schema in --help).
    Json,
}

/// Flags every scenario has.
#[derive(Debug, Args)]
pub(crate) struct Output {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub(crate) format: Format,
    /// Draw the time series to this file (.svg or .png).
    #[arg(long, value_name = "FILE")]
    pub(crate) plot: Option<PathBuf>,
    /// Seed of every random draw: the same seed prints the same bytes.
    #[arg(long, default_value_t = 42, allow_negative_numbers = true)]
    pub(crate) seed: u64,
}

/// `simulate storm`.
#[derive(Debug, Args)]
pub(crate) struct StormArgs {
    /// Clients failing at t = 0.
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true)]
    clients: u64,
    /// Retries per client.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true)]
    retries: u32,
    /// Backoff base.
    #[arg(long, default_value = "1s", value_parser = parse::duration, allow_hyphen_values = true)]
    base: Duration,
    /// Backoff cap.
    #[arg(long, default_value = "30s", value_parser = parse::duration, allow_hyphen_values = true)]
    cap: Duration,
    /// Bin width.
    #[arg(long, default_value = "100ms", value_parser = parse::duration, allow_hyphen_values = true)]
    bin: Duration,
    /// Rows: comma-separated of none, fixed, linear, exponential, full, equal, decorrelated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fixed,linear,exponential,full,equal,decorrelated",
        value_parser = parse::strategy
    )]
    strategy: Vec<Strategy>,
    /// Threads sharing the clients, 0..=64 (0: one per core). Does not change the figures.
    #[arg(
        long,
        default_value_t = 0,
        allow_negative_numbers = true,
        value_parser = clap::builder::RangedI64ValueParser::<usize>::new().range(0..=64)
    )]
    threads: usize,
    #[command(flatten)]
    pub(crate) out: Output,
}

impl StormArgs {
    pub(crate) fn config(&self) -> StormConfig {
        let threads = match self.threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        };
        StormConfig {
            clients: self.clients,
            retries: self.retries,
            base: self.base,
            cap: self.cap,
            bin: self.bin,
            strategies: self.strategy.clone(),
            seed: self.out.seed,
            threads,
        }
    }
}

/// `simulate chain`.
#[derive(Debug, Args)]
pub(crate) struct ChainArgs {
    /// Layers that retry (entry first).
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    layers: u32,
    /// Retries per layer: one value for all, or one per layer (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "2",
        allow_negative_numbers = true
    )]
    retries: Vec<u32>,
    /// Entry requests per second.
    #[arg(long, default_value_t = 10_000.0, allow_negative_numbers = true)]
    rate: f64,
    /// How long entry requests arrive.
    #[arg(long, default_value = "1s", value_parser = parse::duration, allow_hyphen_values = true)]
    duration: Duration,
    /// Probability that the service fails an attempt (1 = down).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    fail_prob: f64,
    /// The service's response time.
    #[arg(long, default_value = "1ms", value_parser = parse::duration, allow_hyphen_values = true)]
    latency: Duration,
    /// Backoff base (exponential, full jitter).
    #[arg(long, default_value = "10ms", value_parser = parse::duration, allow_hyphen_values = true)]
    base: Duration,
    /// Backoff cap.
    #[arg(long, default_value = "1s", value_parser = parse::duration, allow_hyphen_values = true)]
    cap: Duration,
    /// Ratio budget per layer in the budget modes: retries as a fraction of requests, 0..=1
    /// (0.1 = 10 %).
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    retry_ratio: f64,
    /// Rows: comma-separated of every-layer, entry-only, budget, budget-nack [default: all
    /// four; the budget modes only up to 4 layers].
    #[arg(long, value_delimiter = ',', value_parser = parse::chain_mode)]
    mode: Option<Vec<ChainMode>>,
    #[command(flatten)]
    pub(crate) out: Output,
}

impl ChainArgs {
    pub(crate) fn config(&self) -> ChainConfig {
        let modes = match &self.mode {
            Some(modes) => modes.clone(),
            None => ChainMode::ALL.to_vec(),
        };
        ChainConfig {
            layers: self.layers,
            retries: self.retries.clone(),
            rate: self.rate,
            duration: self.duration,
            fail_prob: self.fail_prob,
            latency: self.latency,
            base: self.base,
            cap: self.cap,
            retry_ratio: self.retry_ratio,
            modes,
            seed: self.out.seed,
        }
    }
}

/// `simulate policy`.
#[derive(Debug, Args)]
pub(crate) struct PolicyArgs {
    /// The call graph (TOML or JSON), with its policies inline or by `policy_ref`.
    #[arg(long, value_name = "FILE")]
    pub(crate) graph: PathBuf,
    /// Another version of the graph, run the same way and printed beside it.
    #[arg(long, value_name = "FILE")]
    pub(crate) against: Option<PathBuf>,
    /// A fault: KIND:SERVICE@START+DURATION, KIND one of outage, latency+DURATION,
    /// latency*FACTOR, 503=SHARE (repeat the flag for several).
    #[arg(long, value_name = "FAULT", value_parser = parse::injection)]
    pub(crate) inject: Vec<Injection>,
    /// Entry requests per second in all [default: the entries' requests_per_sec].
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) rate: Option<f64>,
    /// How long entry requests arrive.
    #[arg(long, default_value = "60s", value_parser = parse::duration, allow_hyphen_values = true)]
    pub(crate) duration: Duration,
    /// The width of the time bins (series, recovery).
    #[arg(long, default_value = "1s", value_parser = parse::duration, allow_hyphen_values = true)]
    pub(crate) bin: Duration,
    #[command(flatten)]
    pub(crate) out: Output,
}

impl PolicyArgs {
    pub(crate) fn config(&self) -> WhatIfConfig {
        WhatIfConfig {
            rate: self.rate,
            duration: self.duration,
            bin: self.bin,
            injections: self.inject.clone(),
            seed: self.out.seed,
        }
    }
}

/// The numbers budgets are built with.
#[derive(Debug, Args)]
pub(crate) struct BudgetFlags {
    /// Token buckets (seeds, grpc): capacity, 1..=1000.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true)]
    max_tokens: u32,
    /// Token buckets (seeds, grpc): tokens refunded per success, 0.001..=1.
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    token_ratio: f64,
    /// Ratio budget: retries as a fraction of requests, 0..=1 (0.2 = 20 %).
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    retry_ratio: f64,
    /// Ratio budget: window, 1s..=60s.
    #[arg(long, default_value = "10s", value_parser = parse::duration, allow_hyphen_values = true)]
    ttl: Duration,
    /// Ratio budget: retries per second always allowed.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true)]
    min_retries_per_sec: u32,
    /// Concurrency budget: retries in flight as a percentage of requests in flight, 0..=100
    /// (20 = 20 %).
    #[arg(long, default_value_t = 20.0, allow_negative_numbers = true)]
    budget_percent: f64,
    /// Concurrency budget: retries in flight always allowed.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    min_retry_concurrency: u32,
}

impl BudgetFlags {
    fn params(&self) -> BudgetParams {
        BudgetParams {
            max_tokens: self.max_tokens,
            token_ratio: self.token_ratio,
            retry_ratio: self.retry_ratio,
            ttl: self.ttl,
            min_retries_per_sec: self.min_retries_per_sec,
            budget_percent: self.budget_percent,
            min_retry_concurrency: self.min_retry_concurrency,
        }
    }
}

/// `simulate budget`.
#[derive(Debug, Args)]
pub(crate) struct BudgetArgs {
    /// Requests per second.
    #[arg(long, default_value_t = 1000.0, allow_negative_numbers = true)]
    rate: f64,
    /// Success rate before the step.
    #[arg(long, default_value_t = 0.99, allow_negative_numbers = true)]
    before: f64,
    /// Success rate from the step on.
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    after: f64,
    /// When the success rate steps.
    #[arg(long, default_value = "1s", value_parser = parse::duration, allow_hyphen_values = true)]
    step_at: Duration,
    /// Length of the run.
    #[arg(long, default_value = "5s", value_parser = parse::duration, allow_hyphen_values = true)]
    duration: Duration,
    /// Time an attempt takes.
    #[arg(long, default_value = "10ms", value_parser = parse::duration, allow_hyphen_values = true)]
    latency: Duration,
    /// Retries per request.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
    retries: u32,
    /// Backoff base (exponential, full jitter).
    #[arg(long, default_value = "20ms", value_parser = parse::duration, allow_hyphen_values = true)]
    base: Duration,
    /// Backoff cap.
    #[arg(long, default_value = "1s", value_parser = parse::duration, allow_hyphen_values = true)]
    cap: Duration,
    /// Bin width of the retries-per-second series.
    #[arg(long, default_value = "250ms", value_parser = parse::duration, allow_hyphen_values = true)]
    bin: Duration,
    /// How failures are laid out: spread (exact rate) or random.
    #[arg(long, default_value = "spread", value_parser = parse::failures)]
    failures: FailurePattern,
    /// Rows: comma-separated of none, seeds, grpc, aws, ratio, concurrency.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,seeds,grpc,aws,ratio,concurrency",
        value_parser = parse::budget_kind
    )]
    budget: Vec<BudgetKind>,
    #[command(flatten)]
    numbers: BudgetFlags,
    #[command(flatten)]
    pub(crate) out: Output,
}

impl BudgetArgs {
    pub(crate) fn config(&self) -> BudgetConfig {
        BudgetConfig {
            rate: self.rate,
            before: self.before,
            after: self.after,
            step_at: self.step_at,
            duration: self.duration,
            latency: self.latency,
            retries: self.retries,
            base: self.base,
            cap: self.cap,
            bin: self.bin,
            failures: self.failures,
            budget: self.numbers.params(),
            kinds: self.budget.clone(),
            seed: self.out.seed,
        }
    }
}

/// `simulate overload`.
#[derive(Debug, Args)]
pub(crate) struct OverloadArgs {
    /// New requests per second.
    #[arg(long, default_value_t = 280.0, allow_negative_numbers = true)]
    rate: f64,
    /// Requests per second the server serves while not overloaded.
    #[arg(long, default_value_t = 300.0, allow_negative_numbers = true)]
    capacity: f64,
    /// How many times slower the server gets above capacity.
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
    slowdown: f64,
    /// Per-attempt timeout.
    #[arg(long, default_value = "1s", value_parser = parse::duration, allow_hyphen_values = true)]
    timeout: Duration,
    /// Retries per request.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    retries: u32,
    /// What pushes the system over the edge: outage, capacity-drop or spike.
    #[arg(long, default_value = "outage", value_parser = parse::trigger)]
    trigger: Trigger,
    /// When the trigger starts.
    #[arg(long, default_value = "10s", value_parser = parse::duration, allow_hyphen_values = true)]
    trigger_at: Duration,
    /// How long the trigger lasts.
    #[arg(long, default_value = "10s", value_parser = parse::duration, allow_hyphen_values = true)]
    trigger_for: Duration,
    /// Capacity factor during a capacity drop.
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    drop_to: f64,
    /// Extra requests per second during a spike.
    #[arg(long, default_value_t = 200.0, allow_negative_numbers = true)]
    spike: f64,
    /// Length of the run.
    #[arg(long, default_value = "60s", value_parser = parse::duration, allow_hyphen_values = true)]
    duration: Duration,
    /// Bin width of the time series.
    #[arg(long, default_value = "1s", value_parser = parse::duration, allow_hyphen_values = true)]
    bin: Duration,
    /// The caller's deadline (jitter-deadline, all).
    #[arg(long, default_value = "1s", value_parser = parse::duration, allow_hyphen_values = true)]
    deadline: Duration,
    /// Minimum useful call time: no retry with less left (jitter-deadline, all); shorter
    /// than --deadline.
    #[arg(long, default_value = "50ms", value_parser = parse::duration, allow_hyphen_values = true)]
    min_call: Duration,
    /// Backoff base (jitter-deadline, all; exponential, full jitter).
    #[arg(long, default_value = "100ms", value_parser = parse::duration, allow_hyphen_values = true)]
    base: Duration,
    /// Backoff cap.
    #[arg(long, default_value = "1s", value_parser = parse::duration, allow_hyphen_values = true)]
    cap: Duration,
    /// The budget of the budget protections: none, seeds, grpc, aws, ratio, concurrency.
    #[arg(long, default_value = "grpc", value_parser = parse::budget_kind)]
    budget: BudgetKind,
    /// The server's limit algorithm in the limit protection: aimd, vegas, gradient2.
    #[arg(long, default_value = "vegas", value_parser = parse::limit_kind)]
    limit_algorithm: LimitKind,
    /// Rows: comma-separated of none, budget, jitter-deadline, all, limit.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,budget,jitter-deadline,limit",
        value_parser = parse::protection
    )]
    protection: Vec<Protection>,
    #[command(flatten)]
    numbers: BudgetFlags,
    #[command(flatten)]
    pub(crate) out: Output,
}

impl OverloadArgs {
    pub(crate) fn config(&self) -> OverloadConfig {
        OverloadConfig {
            rate: self.rate,
            capacity: self.capacity,
            slowdown: self.slowdown,
            timeout: self.timeout,
            retries: self.retries,
            trigger: self.trigger,
            trigger_at: self.trigger_at,
            trigger_for: self.trigger_for,
            drop_to: self.drop_to,
            spike: self.spike,
            duration: self.duration,
            bin: self.bin,
            deadline: self.deadline,
            min_call: self.min_call,
            base: self.base,
            cap: self.cap,
            budget: self.budget,
            budget_params: self.numbers.params(),
            limit: self.limit_algorithm,
            protections: self.protection.clone(),
            seed: self.out.seed,
        }
    }
}

/// `simulate occ`.
#[derive(Debug, Args)]
pub(crate) struct OccArgs {
    /// Contending clients: one row per value (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "100",
        allow_negative_numbers = true
    )]
    clients: Vec<u32>,
    /// Runs averaged per row.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true)]
    runs: u32,
    /// Backoff base.
    #[arg(long, default_value = "5ms", value_parser = parse::duration, allow_hyphen_values = true)]
    base: Duration,
    /// Backoff cap.
    #[arg(long, default_value = "2s", value_parser = parse::duration, allow_hyphen_values = true)]
    cap: Duration,
    /// Mean one-way network delay.
    #[arg(long, default_value = "10ms", value_parser = parse::duration, allow_hyphen_values = true)]
    delay: Duration,
    /// Standard deviation of the network delay.
    #[arg(long, default_value = "2ms", value_parser = parse::duration, allow_hyphen_values = true)]
    delay_sd: Duration,
    /// Rows: comma-separated of none, fixed, linear, exponential, full, equal, decorrelated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "exponential,full,equal,decorrelated",
        value_parser = parse::strategy
    )]
    strategy: Vec<Strategy>,
    #[command(flatten)]
    pub(crate) out: Output,
}

impl OccArgs {
    pub(crate) fn config(&self) -> OccConfig {
        OccConfig {
            clients: self.clients.clone(),
            runs: self.runs,
            base: self.base,
            cap: self.cap,
            delay: self.delay,
            delay_sd: self.delay_sd,
            strategies: self.strategy.clone(),
            seed: self.out.seed,
        }
    }
}

/// `simulate converge`.
#[derive(Debug, Args)]
pub(crate) struct ConvergeArgs {
    /// Requests the server serves at once.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true)]
    workers: u32,
    /// Work per request before the change.
    #[arg(long, default_value = "10ms", value_parser = parse::duration, allow_hyphen_values = true)]
    service: Duration,
    /// How many times more work per request from the change on.
    #[arg(long, default_value_t = 2.0, allow_negative_numbers = true)]
    slowdown: f64,
    /// When the handler gets slower.
    #[arg(long, default_value = "10s", value_parser = parse::duration, allow_hyphen_values = true)]
    change_at: Duration,
    /// Offered load, as a multiple of the capacity before the change.
    #[arg(long, default_value_t = 3.0, allow_negative_numbers = true)]
    load: f64,
    /// Callers give up on a request after this long.
    #[arg(long, default_value = "1s", value_parser = parse::duration, allow_hyphen_values = true)]
    timeout: Duration,
    /// Length of the run.
    #[arg(long, default_value = "30s", value_parser = parse::duration, allow_hyphen_values = true)]
    duration: Duration,
    /// Bin width of the time series.
    #[arg(long, default_value = "100ms", value_parser = parse::duration, allow_hyphen_values = true)]
    bin: Duration,
    /// Rows: comma-separated of aimd, vegas, gradient2.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "vegas,gradient2,aimd",
        value_parser = parse::limit_kind
    )]
    limit_algorithm: Vec<LimitKind>,
    #[command(flatten)]
    pub(crate) out: Output,
}

impl ConvergeArgs {
    pub(crate) fn config(&self) -> ConvergeConfig {
        ConvergeConfig {
            workers: self.workers,
            service: self.service,
            slowdown: self.slowdown,
            change_at: self.change_at,
            load: self.load,
            timeout: self.timeout,
            duration: self.duration,
            bin: self.bin,
            limits: self.limit_algorithm.clone(),
            seed: self.out.seed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn scenario(args: &[&str]) -> Scenario {
        let cli =
            Cli::try_parse_from(["stormguard", "simulate"].iter().chain(args)).expect("parses");
        let Command::Simulate { scenario } = cli.command else {
            panic!("simulate parses as simulate");
        };
        scenario
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_flags_give_each_scenarios_documented_defaults() {
        let Scenario::Storm(a) = scenario(&["storm", "--threads", "1"]) else {
            panic!("storm");
        };
        assert_eq!(a.config(), StormConfig::default());
        let Scenario::Chain(a) = scenario(&["chain"]) else {
            panic!("chain");
        };
        assert_eq!(a.config(), ChainConfig::default());
        let Scenario::Budget(a) = scenario(&["budget"]) else {
            panic!("budget");
        };
        assert_eq!(a.config(), BudgetConfig::default());
        let Scenario::Overload(a) = scenario(&["overload"]) else {
            panic!("overload");
        };
        assert_eq!(a.config(), OverloadConfig::default());
        let Scenario::Occ(a) = scenario(&["occ"]) else {
            panic!("occ");
        };
        assert_eq!(a.config(), OccConfig::default());
        let Scenario::Converge(a) = scenario(&["converge"]) else {
            panic!("converge");
        };
        assert_eq!(a.config(), ConvergeConfig::default());
    }
}
