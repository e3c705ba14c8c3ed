//! `stormguard policy lint`.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use comfy_table::Table;
use comfy_table::presets::UTF8_FULL_CONDENSED;
use stormguard::lint::{Finding, LintConfig, lint_graph, lint_policy_file};

use super::{FailOn, gate, load_graph, load_policy, sarif};
use crate::run::Failure;

pub(super) const HELP: &str = "\
Lint a policy file, a call graph, or a policy file in place in a call graph.

  stormguard policy lint policies.toml               rules that need no graph
  stormguard policy lint --graph graph.toml          every rule over the graph
  stormguard policy lint policies.toml --graph g.toml  the file's policies in place of those
                                                     the graph's calls refer to by name

Rules (id, name, default severity):
  SG001 retry-amplification     error   attempts multiplied along a path above --max-amplification,
                                        with and without budgets and the don't-retry signal
  SG002 layered-retries         warning more than one layer of a path retries without the signal
  SG003 inner-retries-dead      warning the caller's attempt timeout leaves no room for the callee's retries
  SG004 timeout-above-p99       warning attempt timeout above --p99-factor x the downstream's P99
  SG005 timeout-below-p99       error   attempt timeout below the downstream's P99
  SG006 retry-non-idempotent    error   in-doubt failures retried on a non-idempotent endpoint
  SG007 retry-on-4xx            error   a call retries a 4xx other than 408/429
  SG008 retry-without-budget    warning retries without a retry budget
  SG009 retry-without-jitter    warning backoff without jitter
  SG010 retries-impossible      warning attempts the per-try timeouts and min_call leave no room for

Exit status: 0 no finding at or above --fail-on (default warning), 1 findings, 2 bad input.
--format sarif writes SARIF 2.1.0 for code-scanning annotations on a pull request.";

/// Output format of `policy lint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LintFormat {
    /// A table.
    Table,
    /// A JSON array of findings.
    Json,
    /// SARIF 2.1.0.
    Sarif,
}

/// `policy lint`.
#[derive(Debug, Args)]
pub(crate) struct LintArgs {
    /// The policy file (.toml or .json).
    #[arg(value_name = "POLICY", required_unless_present = "graph")]
    policy: Option<PathBuf>,
    /// The call graph (.toml or .json).
    #[arg(long, value_name = "GRAPH")]
    graph: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = LintFormat::Table)]
    format: LintFormat,
    /// The lowest severity that makes the exit status 1.
    #[arg(long, value_enum, default_value_t = FailOn::Warning)]
    fail_on: FailOn,
    /// SG001 flags paths amplifying more than this.
    #[arg(long, default_value_t = 10.0)]
    max_amplification: f64,
    /// SG004 flags attempt timeouts above this many times the downstream's P99.
    #[arg(long, default_value_t = 2.0)]
    p99_factor: f64,
}

pub(super) fn run(args: &LintArgs) -> Result<String, Failure> {
    for (flag, value) in [
        ("--max-amplification", args.max_amplification),
        ("--p99-factor", args.p99_factor),
    ] {
        if !(value.is_finite() && value >= 1.0) {
            return Err(Failure::Usage(format!(
                "invalid value for {flag}: a finite number >= 1, got {value}"
            )));
        }
    }
    let config = LintConfig {
        max_amplification: args.max_amplification,
        p99_factor: args.p99_factor,
    };
    let findings = match (&args.policy, &args.graph) {
        (Some(policy), None) => {
            let (file, source) = load_policy(policy)?;
            lint_policy_file(&file, Some(&source))
        }
        (policy, Some(graph)) => {
            let mut graph = load_graph(graph)?;
            if let Some(path) = policy {
                let (file, _) = load_policy(path)?;
                graph = graph.with_policy_file(&file, path);
            }
            lint_graph(&graph, &config)
        }
        (None, None) => {
            return Err(Failure::Usage(
                "give a policy file, --graph, or both".to_owned(),
            ));
        }
    };
    let report = match args.format {
        LintFormat::Table => table(&findings),
        LintFormat::Json => json(&findings)?,
        LintFormat::Sarif => sarif::render(&findings)?,
    };
    let failed = findings.iter().any(|f| args.fail_on.fails(f.severity));
    gate(report, failed)
}

fn json(findings: &[Finding]) -> Result<String, Failure> {
    serde_json::to_string_pretty(findings)
        .map(|s| s + "\n")
        .map_err(|e| Failure::Io(format!("JSON encoding failed: {e}")))
}

fn table(findings: &[Finding]) -> String {
    if findings.is_empty() {
        return "no findings\n".to_owned();
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(["where", "field", "rule", "severity", "finding"]);
    for f in findings {
        let file = f
            .file
            .as_ref()
            .map_or_else(String::new, |p| p.display().to_string());
        let place = match f.line {
            Some(line) => format!("{file}:{line}"),
            None => file,
        };
        t.add_row([
            place,
            f.field.clone(),
            f.rule.to_string(),
            f.severity.to_string(),
            f.message.clone(),
        ]);
    }
    let mut out = format!("{t}\n");
    let count = |s| findings.iter().filter(|f| f.severity == s).count();
    let _ = writeln!(
        out,
        "{} errors, {} warnings, {} notes",
        count(stormguard::lint::Severity::Error),
        count(stormguard::lint::Severity::Warning),
        count(stormguard::lint::Severity::Note)
    );
    out
}
