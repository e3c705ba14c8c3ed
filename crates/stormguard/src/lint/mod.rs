//! Policy lint: what a valid policy, or a whole call graph of them, does that is probably not
//! meant — before it reaches production.
//!
//! # Why lint what already validates
//!
//! [`PolicyFile`] refuses a policy that cannot work (zero attempts, `per_try` above
//! `overall`). What it cannot refuse is a policy that works exactly as written and still
//! causes an outage: three layers that each retry twice send 27 requests to a failing leaf;
//! a 5 s timeout over a downstream whose P99 is 1.8 s lets the retry window grow far past
//! what a healthy call needs (the seeds' review case); an outer timeout shorter than the
//! inner retries need makes those retries dead code. These depend on the policy's place in
//! a [`CallGraph`], so most rules read one; the rules that need no graph also run over a
//! single policy file ([`lint_policy_file`]).
//!
//! Each [`Finding`] names the file, the field path, the [`Rule`] (a stable id such as
//! `SG004` and a name such as `timeout-above-p99`) and a [`Severity`], so a CI job can gate
//! on it and annotate a pull request (the CLI writes SARIF 2.1.0 from these).
//!
//! | id | rule | severity | needs a graph |
//! | --- | --- | --- | --- |
//! | SG001 | `retry-amplification`: ∏ attempts along a path above the threshold, with and without budgets and the don't-retry signal | error (note when budgets bound it) | yes |
//! | SG002 | `layered-retries`: more than one layer of a path retries, not all with the don't-retry signal | warning | yes |
//! | SG003 | `inner-retries-dead`: the caller's attempt timeout is shorter than the callee's own retries need | warning | yes |
//! | SG004 | `timeout-above-p99`: an attempt timeout above k × the downstream's P99 (default k = 2) | warning | yes |
//! | SG005 | `timeout-below-p99`: an attempt timeout below the downstream's P99: > 1 % time out by construction | error | yes |
//! | SG006 | `retry-non-idempotent`: in-doubt failures retried (`idempotency = "idempotent"`) on a non-idempotent endpoint | error | no |
//! | SG007 | `retry-on-4xx`: a call retries a 4xx status other than 408 and 429 | error | yes |
//! | SG008 | `retry-without-budget`: retries or hedges without a retry budget | warning | no |
//! | SG009 | `retry-without-jitter`: retries with a backoff without jitter | warning | no |
//! | SG010 | `retries-impossible`: attempts that `min_call` and the per-try timeouts leave no room for | warning | no |
//!
//! ```
//! use stormguard::lint::{LintConfig, Rule, lint_graph};
//! use stormguard::graph::CallGraph;
//!
//! let graph = CallGraph::from_toml(r#"
//!     [[services.web.endpoints."GET /".calls]]
//!     to = "pay"
//!     endpoint = "POST /pay"
//!     policy = { timeouts = { overall = "5s" }, retry = { max_attempts = 1 } }
//!
//!     [services.pay.endpoints."POST /pay"]
//!     latency = { p99 = "1.8s" }
//! "#)?;
//! let findings = lint_graph(&graph, &LintConfig::default());
//! assert_eq!(findings.len(), 1);
//! assert_eq!(findings[0].rule, Rule::TimeoutAboveP99);
//! assert_eq!(findings[0].field, r#"services."web".endpoints."GET /".calls[0].policy.timeouts.overall"#);
//! # Ok::<(), stormguard::graph::GraphError>(())
//! ```

pub mod review;
mod rules;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::graph::{CallGraph, Source};
use crate::policy::{Location, PolicyFile};

/// The rules (see the [module docs](self) for what each finds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(into = "&'static str")]
pub enum Rule {
    /// SG001.
    Amplification,
    /// SG002.
    LayeredRetries,
    /// SG003.
    InnerRetriesDead,
    /// SG004.
    TimeoutAboveP99,
    /// SG005.
    TimeoutBelowP99,
    /// SG006.
    RetryNonIdempotent,
    /// SG007.
    RetryOn4xx,
    /// SG008.
    RetryWithoutBudget,
    /// SG009.
    RetryWithoutJitter,
    /// SG010.
    RetriesImpossible,
}

impl Rule {
    /// Every rule, in id order.
    pub const ALL: [Rule; 10] = [
        Rule::Amplification,
        Rule::LayeredRetries,
        Rule::InnerRetriesDead,
        Rule::TimeoutAboveP99,
        Rule::TimeoutBelowP99,
        Rule::RetryNonIdempotent,
        Rule::RetryOn4xx,
        Rule::RetryWithoutBudget,
        Rule::RetryWithoutJitter,
        Rule::RetriesImpossible,
    ];

    /// The stable id, `SG001`…
    pub const fn id(self) -> &'static str {
        match self {
            Rule::Amplification => "SG001",
            Rule::LayeredRetries => "SG002",
            Rule::InnerRetriesDead => "SG003",
            Rule::TimeoutAboveP99 => "SG004",
            Rule::TimeoutBelowP99 => "SG005",
            Rule::RetryNonIdempotent => "SG006",
            Rule::RetryOn4xx => "SG007",
            Rule::RetryWithoutBudget => "SG008",
            Rule::RetryWithoutJitter => "SG009",
            Rule::RetriesImpossible => "SG010",
        }
    }

    /// The name, `retry-amplification`…
    pub const fn name(self) -> &'static str {
        match self {
            Rule::Amplification => "retry-amplification",
            Rule::LayeredRetries => "layered-retries",
            Rule::InnerRetriesDead => "inner-retries-dead",
            Rule::TimeoutAboveP99 => "timeout-above-p99",
            Rule::TimeoutBelowP99 => "timeout-below-p99",
            Rule::RetryNonIdempotent => "retry-non-idempotent",
            Rule::RetryOn4xx => "retry-on-4xx",
            Rule::RetryWithoutBudget => "retry-without-budget",
            Rule::RetryWithoutJitter => "retry-without-jitter",
            Rule::RetriesImpossible => "retries-impossible",
        }
    }

    /// One sentence on what the rule finds and why it matters.
    pub const fn description(self) -> &'static str {
        match self {
            Rule::Amplification => {
                "Retries multiply along a call path: a failing leaf sees the product of every layer's attempts."
            }
            Rule::LayeredRetries => {
                "More than one layer of a path retries without the don't-retry signal, so their retries multiply."
            }
            Rule::InnerRetriesDead => {
                "The caller gives up before the callee's own retries can run: those retries are dead code that still load the system."
            }
            Rule::TimeoutAboveP99 => {
                "An attempt timeout far above the downstream's P99 lets slow calls hold resources and the retry window grow."
            }
            Rule::TimeoutBelowP99 => {
                "An attempt timeout below the downstream's P99 makes more than 1% of calls time out by construction."
            }
            Rule::RetryNonIdempotent => {
                "In-doubt failures are retried on a non-idempotent endpoint: a retry may do the work twice."
            }
            Rule::RetryOn4xx => {
                "A client error (4xx other than 408/429) is deterministic: retrying it only adds load."
            }
            Rule::RetryWithoutBudget => {
                "Retries without a retry budget multiply load exactly when the downstream is failing."
            }
            Rule::RetryWithoutJitter => {
                "Backoff without jitter keeps clients that failed together retrying together."
            }
            Rule::RetriesImpossible => {
                "Some attempts can never run: the per-try timeouts and min_call before them fill the overall timeout."
            }
        }
    }

    /// How bad a finding of this rule is by default.
    pub const fn severity(self) -> Severity {
        match self {
            Rule::Amplification
            | Rule::TimeoutBelowP99
            | Rule::RetryNonIdempotent
            | Rule::RetryOn4xx => Severity::Error,
            Rule::LayeredRetries
            | Rule::InnerRetriesDead
            | Rule::TimeoutAboveP99
            | Rule::RetryWithoutBudget
            | Rule::RetryWithoutJitter
            | Rule::RetriesImpossible => Severity::Warning,
        }
    }
}

impl From<Rule> for &'static str {
    fn from(rule: Rule) -> Self {
        rule.name()
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.id(), self.name())
    }
}

/// How bad a finding is; ordered from the least to the most severe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; nothing to fix.
    Note,
    /// Probably not meant.
    Warning,
    /// Will hurt.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Note => "note",
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

/// One thing the lint found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// The rule.
    pub rule: Rule,
    /// How bad.
    pub severity: Severity,
    /// The file the field is in (the graph file, or the policy file a call refers to).
    pub file: Option<PathBuf>,
    /// The field path in that file: `endpoints."POST /pay".timeouts.overall`.
    pub field: String,
    /// The line (from 1) of the field, or of the nearest enclosing table the file writes.
    pub line: Option<usize>,
    /// The column (from 1).
    pub column: Option<usize>,
    /// What is wrong, with the figures.
    pub message: String,
}

/// The thresholds of the rules.
///
/// # Default
///
/// Amplification above 10x is flagged; an attempt timeout above 2 × the downstream's P99.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LintConfig {
    /// SG001 flags a path whose amplification is above this.
    pub max_amplification: f64,
    /// SG004 flags an attempt timeout above this many times the downstream's P99.
    pub p99_factor: f64,
}

impl Default for LintConfig {
    fn default() -> Self {
        LintConfig {
            max_amplification: 10.0,
            p99_factor: 2.0,
        }
    }
}

/// Lints one policy file with the rules that need no graph (SG006, SG008, SG009, SG010);
/// `source` is the file's text, for placing findings at lines, when there is one.
///
/// ```
/// use stormguard::lint::{Rule, lint_policy_file};
/// use stormguard::policy::PolicyFile;
///
/// let file = PolicyFile::from_toml(r#"
///     [endpoints."GET /a"]
///     retry = { max_attempts = 3 }
///     backoff = { jitter = "none" }
///     budget = { kind = "ratio", retry_ratio = 0.1, ttl = "10s" }
/// "#)?;
/// let findings = lint_policy_file(&file, None);
/// assert_eq!(findings[0].rule, Rule::RetryWithoutJitter);
/// # Ok::<(), stormguard::policy::PolicyError>(())
/// ```
pub fn lint_policy_file(file: &PolicyFile, source: Option<&Source>) -> Vec<Finding> {
    let mut out = Vec::new();
    for (name, policy) in file.endpoints() {
        let at = format!("endpoints.{name:?}");
        let idempotent = crate::graph::idempotent_by_name(name);
        rules::intrinsic(policy, &at, idempotent, &mut |rule, field, message| {
            out.push(raw(rule, field, message));
        });
    }
    finish(out, &mut Locator::with(source))
}

/// Lints a call graph with every rule; policies referred to by `policy_ref` are reported in
/// their own files.
pub fn lint_graph(graph: &CallGraph, config: &LintConfig) -> Vec<Finding> {
    let mut out = Vec::new();
    rules::graph(graph, config, &mut |finding| out.push(finding));
    finish(out, &mut Locator::with(graph.source()))
}

/// A finding before it is placed in a file.
pub(crate) struct Raw {
    rule: Rule,
    severity: Severity,
    file: Option<PathBuf>,
    field: String,
    message: String,
}

fn raw(rule: Rule, field: String, message: String) -> Raw {
    Raw {
        rule,
        severity: rule.severity(),
        file: None,
        field,
        message,
    }
}

/// Findings placed at lines, one per (file, field, rule), ordered by file, line and rule.
fn finish(raws: Vec<Raw>, locator: &mut Locator<'_>) -> Vec<Finding> {
    let mut seen = BTreeMap::new();
    for r in raws {
        seen.entry((r.file.clone(), r.field.clone(), r.rule))
            .or_insert(r);
    }
    let mut findings: Vec<Finding> = seen
        .into_values()
        .map(|r| {
            let at = locator.locate(r.file.as_deref(), &r.field);
            Finding {
                rule: r.rule,
                severity: r.severity,
                file: r.file.or_else(|| locator.main_file()),
                field: r.field,
                line: at.as_ref().map(|a| a.line),
                column: at.as_ref().map(|a| a.column),
                message: r.message,
            }
        })
        .collect();
    findings.sort_by(|a, b| {
        (&a.file, a.line, a.rule, &a.field).cmp(&(&b.file, b.line, b.rule, &b.field))
    });
    findings
}

/// Places fields at lines: in the main text (the graph or the linted policy file), or in a
/// referenced policy file, read once.
struct Locator<'a> {
    main: Option<&'a Source>,
    others: BTreeMap<PathBuf, Option<Source>>,
}

impl<'a> Locator<'a> {
    fn with(main: Option<&'a Source>) -> Self {
        Locator {
            main,
            others: BTreeMap::new(),
        }
    }

    fn main_file(&self) -> Option<PathBuf> {
        self.main.and_then(|s| s.file.clone())
    }

    fn locate(&mut self, file: Option<&Path>, field: &str) -> Option<Location> {
        let source = match file {
            None => self.main?,
            Some(path) => self
                .others
                .entry(path.to_owned())
                .or_insert_with(|| {
                    let text = std::fs::read_to_string(path).ok()?;
                    let json = path
                        .extension()
                        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
                    Some(Source {
                        file: Some(path.to_owned()),
                        text,
                        json,
                    })
                })
                .as_ref()?,
        };
        Some(source.locate(field))
    }
}
