//! `stormguard demo self-heal`: the seeds' CDN outage, healed by a rule with nobody
//! touching anything, end to end on 127.0.0.1.
//!
//! # The story
//!
//! An image service sits behind a CDN node, with a backup source holding a copy of every
//! image. Client instances of the web service fetch images through the one client stack
//! (`stormguard_tower::client`: four attempts, a retry budget, the backup source installed
//! as the fallback but off by policy) and follow a policy center. The center scrapes each
//! instance's `/metrics` and runs a rule over what it reads (`assets/self-heal/rules.toml`).
//!
//! Then the CDN node starts answering 504. Users see errors, each one after four attempts;
//! the instances' error ratio climbs; the rule holds for its `for` and fires: the center
//! publishes a version with one attempt and the fallback on, the instances apply it within a
//! round trip, and from then on every image the CDN fails is fetched from the backup
//! source: retries drop from 3 to 0 and users stop seeing errors. When the CDN recovers,
//! the next rounds show it, and the rule reverts by publishing the first policy's values
//! again.
//!
//! # Real parts, and one clock for the test
//!
//! Every part is the real one, talking over 127.0.0.1 sockets as across hosts: the center
//! is the `stormguard center` program (a child process with its SQLite store in a temporary
//! directory, its HTTP API, push and collection loop); the CDN stand-in, the origin and the
//! backup source are axum servers; each client instance has its stack, its watch and its
//! `/metrics`. The test (`tests.rs`) runs the same story under tokio's paused clock, with
//! the same center served in the test's process (a child process cannot share the paused
//! clock) and its collector started on the same defaults; the demo runs it in real time.
//! Both report the switch time: from the first 504 the CDN answered to the moment every
//! instance runs the rule's version. A second test (`browser_tests.rs`) plays the same
//! story and watches it on the center's dashboard in a headless chromium: the rule firing,
//! active, and reverted.

#[cfg(test)]
mod browser_tests;
mod center;
mod fleet;
mod report;
mod scenario;
mod servers;
#[cfg(test)]
mod tests;
mod timeline;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

pub(crate) use report::{Bin, Summary};

use crate::cli::Output;
use crate::parse;
use crate::run::{Failure, finish, open_plot};

/// The options of `stormguard demo self-heal`.
#[derive(Debug, Args)]
pub(crate) struct SelfHealArgs {
    /// Client instances, each with its own stack, watch and /metrics.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    clients: usize,
    /// Image requests per second per instance.
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
    rate: f64,
    /// When the CDN starts answering 504.
    #[arg(long, default_value = "10s", value_parser = parse::duration, allow_hyphen_values = true)]
    outage_at: Duration,
    /// How long it answers 504.
    #[arg(long, default_value = "30s", value_parser = parse::duration, allow_hyphen_values = true)]
    outage_for: Duration,
    /// How long the users send requests.
    #[arg(long, default_value = "70s", value_parser = parse::duration, allow_hyphen_values = true)]
    duration: Duration,
    /// The policy the center publishes first (TOML; default: the demo's own).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// The rule file the center runs (TOML, as `policy rules put` reads; default: the
    /// demo's own).
    #[arg(long, value_name = "FILE")]
    rules: Option<PathBuf>,
    /// Output and plot.
    #[command(flatten)]
    out: Output,
}

/// What `--format json` prints.
#[derive(Serialize)]
struct Json<'a> {
    summary: &'a Summary,
    bins: &'a [Bin],
}

/// Runs the demo in real time and renders what happened; a switch slower than the goal, or
/// errors after it, exit 1 after the output is printed.
pub(crate) fn run(args: SelfHealArgs) -> Result<String, Failure> {
    let read = |flag: &str, path: &Option<PathBuf>, default: &str| match path {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| Failure::Usage(format!("{flag} {}: {e}", path.display()))),
        None => Ok(default.to_owned()),
    };
    let config = scenario::Config {
        clients: args.clients,
        rate: args.rate,
        outage_at: args.outage_at,
        outage_for: args.outage_for,
        duration: args.duration,
        policy: read("--policy", &args.policy, scenario::POLICY)?,
        rules: read("--rules", &args.rules, scenario::RULES)?,
        seed: args.out.seed,
        // The center is the `stormguard center` program, as an operator runs it.
        center: center::CenterAt::Process(
            std::env::current_exe()
                .map_err(|e| Failure::Io(format!("cannot find the stormguard executable: {e}")))?,
        ),
    };
    config.validate().map_err(Failure::Usage)?;
    let plot = open_plot(&args.out)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Io(format!("tokio runtime: {e}")))?;
    eprintln!(
        "stormguard: self-heal demo, {} s in real time (the CDN fails at {} s for {} s)…",
        config.duration.as_secs(),
        config.outage_at.as_secs(),
        config.outage_for.as_secs()
    );
    let run = runtime
        .block_on(scenario::run(&config))
        .map_err(Failure::Failed)?;
    let (bins, summary) = report::read(&run);
    let printed = finish(
        &args.out,
        plot,
        &Json {
            summary: &summary,
            bins: &bins,
        },
        || report::table(&bins, &summary),
        || crate::plot::self_heal(&bins, &summary),
    )?;
    match report::verdict(&summary) {
        Ok(()) => Ok(printed),
        Err(why) => {
            print!("{printed}");
            Err(Failure::Failed(why))
        }
    }
}
