//! `stormguard policy diff`.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use comfy_table::Table;
use comfy_table::presets::UTF8_FULL_CONDENSED;
use stormguard::lint::LintConfig;
use stormguard::lint::review::{Review, Verdict, review};

use super::{FailOn, gate, load_graph, load_policy};
use crate::run::Failure;

pub(super) const HELP: &str = "\
Judge every changed field between two versions of a policy file.

  stormguard policy diff old.toml new.toml --graph graph.toml --format markdown

Every field that differs, endpoint by endpoint, is listed; changes that move risk are judged
against the graph's latency data: an attempt timeout raised past --p99-factor x the
downstream's P99 (error), attempts up (warning), a retry budget removed (error) or loosened
(warning), jitter removed (warning); other changes are notes. The verdict is the worst:
pass, review (warnings) or fail (errors).

Exit status: 0 nothing at or above --fail-on (default warning), 1 otherwise, 2 bad input.
--format markdown writes a review comment for a pull request.";

/// Output format of `policy diff`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum DiffFormat {
    /// A table.
    Table,
    /// The review as JSON (diff, judgements, verdict).
    Json,
    /// A markdown review comment.
    Markdown,
}

/// `policy diff`.
#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    /// The policy file before the change.
    #[arg(value_name = "OLD")]
    old: PathBuf,
    /// The policy file after the change.
    #[arg(value_name = "NEW")]
    new: PathBuf,
    /// A call graph giving the downstream latency of each endpoint.
    #[arg(long, value_name = "GRAPH")]
    graph: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = DiffFormat::Table)]
    format: DiffFormat,
    /// The lowest severity that makes the exit status 1.
    #[arg(long, value_enum, default_value_t = FailOn::Warning)]
    fail_on: FailOn,
    /// A raised timeout is an error above this many times the downstream's P99.
    #[arg(long, default_value_t = 2.0)]
    p99_factor: f64,
}

pub(super) fn run(args: &DiffArgs) -> Result<String, Failure> {
    if !(args.p99_factor.is_finite() && args.p99_factor >= 1.0) {
        return Err(Failure::Usage(format!(
            "invalid value for --p99-factor: a finite number >= 1, got {}",
            args.p99_factor
        )));
    }
    let (old, _) = load_policy(&args.old)?;
    let (new, _) = load_policy(&args.new)?;
    let graph = args.graph.as_deref().map(load_graph).transpose()?;
    let config = LintConfig {
        p99_factor: args.p99_factor,
        ..LintConfig::default()
    };
    let review = review(&old, &new, graph.as_ref(), &config);
    let report = match args.format {
        DiffFormat::Table => table(&review),
        DiffFormat::Json => serde_json::to_string_pretty(&review)
            .map(|s| s + "\n")
            .map_err(|e| Failure::Io(format!("JSON encoding failed: {e}")))?,
        DiffFormat::Markdown => markdown(&review, args),
    };
    let failed = review
        .judgements
        .iter()
        .any(|j| args.fail_on.fails(j.severity));
    gate(report, failed)
}

fn verdict(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "pass",
        Verdict::Review => "review",
        Verdict::Fail => "fail",
    }
}

fn value(v: Option<&String>) -> String {
    v.map_or_else(|| "-".to_owned(), Clone::clone)
}

fn table(review: &Review) -> String {
    if review.judgements.is_empty() {
        return "no changes\nverdict: pass\n".to_owned();
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(["endpoint", "field", "old", "new", "severity", "judgement"]);
    for j in &review.judgements {
        t.add_row([
            j.endpoint.clone(),
            j.field.clone(),
            value(j.old.as_ref()),
            value(j.new.as_ref()),
            j.severity.to_string(),
            j.message.clone(),
        ]);
    }
    format!("{t}\nverdict: {}\n", verdict(review.verdict))
}

/// A markdown cell: pipes escaped, newlines flattened.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn markdown(review: &Review, args: &DiffArgs) -> String {
    let icon = match review.verdict {
        Verdict::Pass => "✅",
        Verdict::Review => "⚠️",
        Verdict::Fail => "❌",
    };
    let mut out = format!(
        "### {icon} Policy review: **{}**\n\n`{}` → `{}`\n\n",
        verdict(review.verdict),
        args.old.display(),
        args.new.display()
    );
    if review.judgements.is_empty() {
        out.push_str("No policy changed.\n");
        return out;
    }
    out.push_str("| endpoint | field | old | new | severity | judgement |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for j in &review.judgements {
        let _ = writeln!(
            out,
            "| `{}` | `{}` | {} | {} | {} | {} |",
            cell(&j.endpoint),
            cell(&j.field),
            cell(&value(j.old.as_ref())),
            cell(&value(j.new.as_ref())),
            j.severity,
            cell(&j.message)
        );
    }
    out
}
