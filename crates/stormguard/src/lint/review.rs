//! Reviewing a change to a policy file: every changed field, judged, and a verdict a CI job
//! can gate on.
//!
//! The seeds' review case is the model: an interface's timeout went from 2 s to 5 s, and the
//! reviewer caught that its downstream's P99 is 1.8 s, so the retry window would grow far
//! larger than a healthy call needs; it became 3 s. [`review`] makes that catch mechanical:
//! it takes the [`PolicyDiff`] of two versions and judges the changes that move risk —
//!
//! - an attempt timeout raised past k × the downstream's P99 (k of [`LintConfig`], P99 from
//!   the call graph): error;
//! - more attempts or hedged copies: warning;
//! - a retry budget removed: error; loosened (a larger retry share) or changed kind: warning;
//! - jitter removed: warning;
//!
//! and lists every other changed field as a note. The [`Verdict`] is the worst of them.
//!
//! The downstream of a policy endpoint is found in the graph by the calls that use it: a call
//! whose `policy_ref` names the endpoint, or, failing that, calls to an endpoint of that name.
//!
//! ```
//! use stormguard::graph::CallGraph;
//! use stormguard::lint::LintConfig;
//! use stormguard::lint::review::{Verdict, review};
//! use stormguard::policy::PolicyFile;
//!
//! let graph = CallGraph::from_toml(r#"
//!     [[services.web.endpoints."GET /".calls]]
//!     to = "pay"
//!     endpoint = "POST /pay"
//!     policy = {}
//!     [services.pay.endpoints."POST /pay"]
//!     latency = { p99 = "1.8s" }
//! "#)?;
//! let v = |t: &str| PolicyFile::from_toml(&format!("[endpoints.\"POST /pay\"]\ntimeouts = {{ overall = \"{t}\" }}")).unwrap();
//! let config = LintConfig::default();
//! assert_eq!(review(&v("2s"), &v("5s"), Some(&graph), &config).verdict, Verdict::Fail);
//! assert_eq!(review(&v("2s"), &v("3s"), Some(&graph), &config).verdict, Verdict::Pass);
//! # Ok::<(), stormguard::graph::GraphError>(())
//! ```

use std::time::Duration;

use serde::Serialize;

use super::rules::{attempt_timeout, attempts, budget_share};
use super::{LintConfig, Severity};
use crate::backoff::Jitter;
use crate::graph::{CallGraph, PolicyOrigin};
use crate::policy::diff::{EndpointChange, PolicyDiff};
use crate::policy::{EndpointPolicy, PolicyFile};

/// The outcome of a review.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Review {
    /// What changed.
    pub diff: PolicyDiff,
    /// Each change, judged, in endpoint and field order.
    pub judgements: Vec<Judgement>,
    /// The worst judgement.
    pub verdict: Verdict,
}

/// One change, judged.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Judgement {
    /// The endpoint.
    pub endpoint: String,
    /// The field within it (`timeouts.overall`), or empty for the endpoint as a whole.
    pub field: String,
    /// The old value, as the file writes it.
    pub old: Option<String>,
    /// The new value.
    pub new: Option<String>,
    /// How risky.
    pub severity: Severity,
    /// Why.
    pub message: String,
}

/// What a CI job does with a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Nothing risky: merge (exit status 0).
    Pass,
    /// Risky changes a person should look at (warnings; exit status 1 with `--fail-on warning`).
    Review,
    /// A change that will hurt (errors; exit status 1).
    Fail,
}

/// Judges the change from `old` to `new`, with latency from `graph` when given.
pub fn review(
    old: &PolicyFile,
    new: &PolicyFile,
    graph: Option<&CallGraph>,
    config: &LintConfig,
) -> Review {
    let diff = PolicyDiff::between(old, new);
    let mut judgements = Vec::new();
    for endpoint in &diff.endpoints {
        let name = &endpoint.endpoint;
        let mut judged: Vec<(String, Severity, String)> = Vec::new();
        match endpoint.change {
            EndpointChange::Added => {
                judged.push((
                    String::new(),
                    Severity::Note,
                    "new endpoint policy".to_owned(),
                ));
                // A new policy has no old one to be judged against: it is judged by the rules
                // a policy breaks on its own, as `policy lint` would.
                if let Some(policy) = new.endpoint(name) {
                    let idempotent = crate::graph::idempotent_by_name(name);
                    super::rules::intrinsic(policy, "", idempotent, &mut |rule, field, message| {
                        judged.push((
                            field.trim_start_matches('.').to_owned(),
                            rule.severity(),
                            format!("{}: {message}", rule.id()),
                        ));
                    });
                }
            }
            EndpointChange::Removed => judged.push((
                String::new(),
                Severity::Note,
                "endpoint policy removed: its calls fall back to the default policy".to_owned(),
            )),
            EndpointChange::Changed => {
                if let (Some(a), Some(b)) = (old.endpoint(name), new.endpoint(name)) {
                    let p99 = graph.and_then(|g| downstream_p99(g, name));
                    judge(a, b, p99, config, &mut judged);
                }
            }
        }
        for (field, severity, message) in judged.iter() {
            let change = endpoint.fields.iter().find(|f| &f.field == field);
            judgements.push(Judgement {
                endpoint: name.clone(),
                field: field.clone(),
                old: change.and_then(|c| c.old.clone()),
                new: change.and_then(|c| c.new.clone()),
                severity: *severity,
                message: message.clone(),
            });
        }
        for change in &endpoint.fields {
            if endpoint.change == EndpointChange::Changed
                && !judged.iter().any(|(f, _, _)| f == &change.field)
            {
                judgements.push(Judgement {
                    endpoint: name.clone(),
                    field: change.field.clone(),
                    old: change.old.clone(),
                    new: change.new.clone(),
                    severity: Severity::Note,
                    message: "changed".to_owned(),
                });
            }
        }
    }
    let verdict = match judgements.iter().map(|j| j.severity).max() {
        Some(Severity::Error) => Verdict::Fail,
        Some(Severity::Warning) => Verdict::Review,
        _ => Verdict::Pass,
    };
    Review {
        diff,
        judgements,
        verdict,
    }
}

/// The largest P99 among the endpoints the graph calls with the policy named `name`.
fn downstream_p99(graph: &CallGraph, name: &str) -> Option<Duration> {
    let by_ref = graph
        .calls()
        .filter(|(_, _, c)| matches!(&c.origin, PolicyOrigin::File { endpoint, .. } if endpoint == name))
        .filter_map(|(_, _, c)| graph.callee(c).and_then(|e| e.latency.p99))
        .max();
    by_ref.or_else(|| {
        graph
            .calls()
            .filter(|(_, _, c)| c.endpoint == name)
            .filter_map(|(_, _, c)| graph.callee(c).and_then(|e| e.latency.p99))
            .max()
    })
}

fn judge(
    old: &EndpointPolicy,
    new: &EndpointPolicy,
    p99: Option<Duration>,
    config: &LintConfig,
    out: &mut Vec<(String, Severity, String)>,
) {
    if let (Some((before, _)), Some((after, field))) = (attempt_timeout(old), attempt_timeout(new))
    {
        if after > before {
            match p99 {
                Some(p99) if after.as_secs_f64() > config.p99_factor * p99.as_secs_f64() => {
                    out.push((
                        field.to_owned(),
                        Severity::Error,
                        format!(
                            "attempt timeout raised {before:?} -> {after:?}, past {} x the downstream's P99 {p99:?}: the retry window grows far beyond what a healthy call needs",
                            config.p99_factor
                        ),
                    ));
                }
                Some(p99) => out.push((
                    field.to_owned(),
                    Severity::Note,
                    format!(
                        "attempt timeout raised {before:?} -> {after:?}, within {} x the downstream's P99 {p99:?}",
                        config.p99_factor
                    ),
                )),
                None => out.push((
                    field.to_owned(),
                    Severity::Warning,
                    format!(
                        "attempt timeout raised {before:?} -> {after:?}; no latency data to judge it (pass --graph)"
                    ),
                )),
            }
        }
    }
    let (a, b) = (attempts(old), attempts(new));
    if b > a {
        let field = if new.hedge().is_some() {
            "hedge.max_attempts"
        } else {
            "retry.max_attempts"
        };
        out.push((
            field.to_owned(),
            Severity::Warning,
            format!(
                "attempts up {a} -> {b}: a failing downstream sees up to {b}x its traffic from here"
            ),
        ));
    }
    match (old.budget(), new.budget()) {
        (Some(_), None) if b > 1 => out.push((
            "budget.kind".to_owned(),
            Severity::Error,
            "retry budget removed: nothing bounds the retries when the downstream fails".to_owned(),
        )),
        (Some(x), Some(y)) if budget_share(y) > budget_share(x) => out.push((
            budget_field(y).to_owned(),
            Severity::Warning,
            format!(
                "retry budget loosened: retries may reach {:.0}% of requests, was {:.0}%",
                budget_share(y) * 100.0,
                budget_share(x) * 100.0
            ),
        )),
        (Some(x), Some(y)) if std::mem::discriminant(x) != std::mem::discriminant(y) => out.push((
            "budget.kind".to_owned(),
            Severity::Warning,
            "retry budget kind changed".to_owned(),
        )),
        _ => {}
    }
    if old.backoff().jitter() != Jitter::None && new.backoff().jitter() == Jitter::None && b > 1 {
        out.push((
            "backoff.jitter".to_owned(),
            Severity::Warning,
            "jitter removed: clients that fail together will retry together".to_owned(),
        ));
    }
}

/// The field that sets a budget's retry share.
fn budget_field(budget: &crate::policy::BudgetSpec) -> &'static str {
    use crate::policy::BudgetSpec;
    match budget {
        BudgetSpec::Grpc { .. } | BudgetSpec::SpendPerRetry { .. } => "budget.token_ratio",
        BudgetSpec::AwsStandard => "budget.kind",
        BudgetSpec::Ratio { .. } => "budget.retry_ratio",
        BudgetSpec::Concurrency { .. } => "budget.budget_percent",
    }
}
