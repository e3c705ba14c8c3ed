//! `stormguard policy lint`, `stormguard policy diff` and `stormguard advise timeouts`: the
//! policy governance commands, for people reviewing a change and for CI jobs gating on it.
//!
//! The judging is done by the core crate ([`stormguard::lint`], [`stormguard::lint::review`],
//! [`stormguard::policy::diff`], [`stormguard::graph`]); this module parses arguments, reads
//! files and renders tables, JSON, SARIF 2.1.0 and markdown.
//!
//! # Exit status (for CI)
//!
//! | status | meaning |
//! | --- | --- |
//! | 0 | nothing at or above `--fail-on` (default `warning`) |
//! | 1 | lint: a finding at or above `--fail-on`; diff: a judged change at or above it (verdict `fail` for errors, `review` for warnings) |
//! | 2 | bad input: a file that cannot be read or breaks a rule of its loader, a bad flag |
//!
//! The report is printed on stdout in every case, so a CI job can both gate on the status and
//! upload the SARIF or post the markdown.

pub(crate) mod advise;
mod diff;
mod hdr_log;
mod lint;
mod sarif;

use std::path::Path;

use clap::{Subcommand, ValueEnum};
use stormguard::graph::{CallGraph, Source};
use stormguard::lint::Severity;
use stormguard::policy::PolicyFile;

use crate::run::Failure;

/// `stormguard policy …`.
#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// Lint a policy file, a call graph, or a policy file in place in a call graph.
    #[command(long_about = lint::HELP)]
    Lint(lint::LintArgs),
    /// Judge every changed field between two versions of a policy file.
    #[command(long_about = diff::HELP)]
    Diff(diff::DiffArgs),
    /// The commands that talk to a policy center.
    #[command(flatten)]
    Center(crate::policy_center::PolicyCenter),
}

/// The lowest severity that fails the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum FailOn {
    /// Any finding, notes included.
    Note,
    /// Warnings and errors.
    Warning,
    /// Errors only.
    Error,
    /// Never: always exit 0 once the files were read.
    Never,
}

impl FailOn {
    /// The lowest severity that fails, or `None` for never.
    pub(crate) fn threshold(self) -> Option<Severity> {
        match self {
            FailOn::Note => Some(Severity::Note),
            FailOn::Warning => Some(Severity::Warning),
            FailOn::Error => Some(Severity::Error),
            FailOn::Never => None,
        }
    }

    fn fails(self, severity: Severity) -> bool {
        self.threshold().is_some_and(|least| severity >= least)
    }
}

/// Runs a `policy` subcommand.
pub(crate) fn run_policy(
    remote: crate::policy_center::Remote,
    command: PolicyCommand,
) -> Result<String, Failure> {
    match command {
        PolicyCommand::Center(command) => crate::policy_center::run(remote, command),
        PolicyCommand::Lint(args) => {
            remote.refuse_for_local_files()?;
            lint::run(&args)
        }
        PolicyCommand::Diff(args) => {
            remote.refuse_for_local_files()?;
            diff::run(&args)
        }
    }
}

/// `report` printed, then exit status 1 when `failed`.
fn gate(report: String, failed: bool) -> Result<String, Failure> {
    if !failed {
        return Ok(report);
    }
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(report.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| Failure::Io(format!("writing the report: {e}")))?;
    Err(Failure::Exit(1))
}

fn load_policy(path: &Path) -> Result<(PolicyFile, Source), Failure> {
    let file = PolicyFile::load(path).map_err(|e| Failure::Usage(e.to_string()))?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
    let json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    Ok((
        file,
        Source {
            file: Some(path.to_owned()),
            text,
            json,
        },
    ))
}

fn load_graph(path: &Path) -> Result<CallGraph, Failure> {
    CallGraph::load(path).map_err(|e| Failure::Usage(e.to_string()))
}
