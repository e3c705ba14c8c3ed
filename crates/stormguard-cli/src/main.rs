//! `stormguard`: the command line of the stormguard toolkit.
//!
//! `stormguard simulate <scenario>` runs one of the simulator's scenarios
//! ([`stormguard_sim::scenario`]) and prints a table (or JSON), optionally drawing its time
//! series to an SVG or PNG file. Bad input — a flag clap cannot parse, or a value a scenario
//! refuses — prints a message naming the flag and exits with status 2; an I/O failure
//! (writing the plot or stdout) exits with status 1.
//!
//! `stormguard demo payment-callback` runs the payment-callback reference service under its
//! load and chaos harness (the `payment-callback` program of `examples/payment-callback`, see
//! `demo.rs` for how it is found) and prints the verification table; a violated invariant
//! exits with status 1. `stormguard demo self-heal` runs the seeds' CDN outage healed by a
//! metric-driven rule (module `selfheal`): a `stormguard center` child process, the image
//! service's servers and client instances on 127.0.0.1, in real time; it prints the table
//! and the switch time, and exits 1 when the story did not hold.
//!
//! `stormguard policy lint` and `stormguard policy diff` lint and review policy files and
//! call graphs for CI (module `governance`): findings and judged changes as tables, JSON,
//! SARIF 2.1.0 or markdown; exit status 1 when something at or above `--fail-on` is found.
//! `stormguard proxy egress|ingress` runs the sidecar proxy of `stormguard-proxy` until
//! Ctrl-C.

mod bar;
mod center;
mod cli;
mod demo;
mod governance;
mod help;
mod parse;
mod plot;
mod policy_center;
mod proxy;
mod render;
mod run;
mod selfheal;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match run::run(cli) {
        Ok(output) => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            if out
                .write_all(output.as_bytes())
                .and_then(|()| out.flush())
                .is_err()
            {
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        // A demo program has already said why it failed.
        Err(run::Failure::Exit(code)) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.status())
        }
    }
}
