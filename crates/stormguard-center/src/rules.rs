//! The rules of each service, run against observations: firings and reverts become versions.
//!
//! The decisions are [`stormguard::rules::RuleEngine`]'s, a pure function of what the
//! collectors observed and the instant they give; this module only carries them out, so
//! that a rule's change is like any person's: a version written through the one publish
//! path (validated, linted, audited, compare-and-set on the latest version, pushed to the
//! watchers), whose author is `rule:<name>` and whose audit record holds the values that
//! fired it. A publish that loses the compare-and-set to someone else's is tried again on
//! the new latest version (a few times), so a rule never overwrites an edit it did not see.
//!
//! A dry-run rule publishes nothing: each firing or revert it would have made is an audit
//! record with action `rule-dry-run`. A firing that cannot be published (the service has no
//! policy yet, the endpoint is missing, the result would not validate) is recorded as
//! `rule-failed` and taken back in the engine, which tries again at the next observation.
//!
//! What each active rule changed is kept in memory (the fields and their values before), so
//! a revert restores those fields only, to the values of the version the rule fired on; a
//! field someone changed since keeps their value ([`stormguard::rules::revert`]). That
//! memory does not outlive the process: a center restarted while a rule is active does not
//! revert it by itself.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::{Value, json};
use stormguard::policy::PolicyFile;
use stormguard::rules::{
    Decision, FieldEdit, Observations, RevertedField, Rule, RuleEngine, Verdict, apply, revert,
};

use crate::api::versions::{Release, refuse_lint_findings};
use crate::auth::{Caller, Role};
use crate::error::ApiError;
use crate::server::{Center, now_ms};
use crate::store::{NewAudit, StoreError};

/// How many times a firing or revert is tried on a newer latest version after losing the
/// compare-and-set.
const PUBLISH_TRIES: usize = 5;

/// What became of one rule's firing or revert at one observation.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleEvent {
    /// The rule.
    pub rule: String,
    /// What the engine decided ([`Verdict::Fire`] or [`Verdict::Revert`]).
    pub verdict: Verdict,
    /// The version published, if one was (none for a dry run, a failure, or nothing to do).
    pub version: Option<u64>,
    /// The audit action written: `rule-fire`, `rule-revert`, `rule-dry-run`, `rule-failed`.
    pub action: &'static str,
    /// The audit detail (JSON: the rule, the observed values, the fields changed).
    pub detail: String,
}

/// Runs every service's stored rules against the observations the collectors hand it.
///
/// ```no_run
/// # async fn run(center: stormguard_center::Center) -> Result<(), stormguard_center::StoreError> {
/// use std::time::Instant;
/// use stormguard::rules::{Observations, Series};
/// use stormguard_center::RuleRunner;
///
/// let runner = RuleRunner::new(center, 6);
/// let mut seen = Observations::new();
/// seen.set_endpoint("GET /img/*", Series::ErrorRatioCode(504), 0.4);
/// for event in runner.observe("web", &seen, Instant::now()).await? {
///     println!("{} {:?} -> {:?}", event.rule, event.verdict, event.version);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct RuleRunner {
    center: Center,
    max_changes_per_hour: u32,
    services: tokio::sync::Mutex<HashMap<String, ServiceRules>>,
}

#[derive(Debug)]
struct ServiceRules {
    engine: RuleEngine,
    cap: Option<u32>,
    /// What each active (non-dry-run) rule changed, and on which version.
    fired: HashMap<String, Fired>,
}

#[derive(Clone, Debug)]
struct Fired {
    on_version: u64,
    endpoint: String,
    edits: Vec<FieldEdit>,
}

impl RuleRunner {
    /// A runner for `center`'s rules; each service makes at most `max_changes_per_hour`
    /// automatic changes in any hour unless [`RuleRunner::set_cap`] says otherwise.
    pub fn new(center: Center, max_changes_per_hour: u32) -> Self {
        RuleRunner {
            center,
            max_changes_per_hour,
            services: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Sets the hourly cap of one service.
    pub async fn set_cap(&self, service: &str, max_changes_per_hour: u32) {
        let mut services = self.services.lock().await;
        let entry = services
            .entry(service.to_owned())
            .or_insert_with(|| ServiceRules {
                engine: RuleEngine::new(Vec::new(), max_changes_per_hour),
                cap: None,
                fired: HashMap::new(),
            });
        entry.cap = Some(max_changes_per_hour);
    }

    /// Runs `service`'s rules (as stored now) on what was observed at `now`, and publishes
    /// or records what they decide. Returns what was done for each firing or revert.
    pub async fn observe(
        &self,
        service: &str,
        seen: &Observations,
        now: Instant,
    ) -> Result<Vec<RuleEvent>, StoreError> {
        let rules = self.stored_rules(service).await?;
        let mut services = self.services.lock().await;
        let state = services
            .entry(service.to_owned())
            .or_insert_with(|| ServiceRules {
                engine: RuleEngine::new(Vec::new(), self.max_changes_per_hour),
                cap: None,
                fired: HashMap::new(),
            });
        let cap = state.cap.unwrap_or(self.max_changes_per_hour);
        state.engine.set_rules(rules, cap);
        let changes: Vec<_> = state
            .engine
            .decide(seen, now)
            .into_iter()
            .filter(|d| matches!(d.verdict, Verdict::Fire | Verdict::Revert))
            .collect();
        let mut events = Vec::new();
        for (index, decision) in changes.iter().enumerate() {
            let Some(rule) = state
                .engine
                .rules()
                .find(|r| r.name == decision.rule)
                .cloned()
            else {
                continue;
            };
            match self.carry_out(service, &rule, decision, state).await {
                Ok(event) => {
                    if event.action == "rule-failed" {
                        state.engine.undo(&rule.name);
                    }
                    events.push(event);
                }
                Err(error) => {
                    // The store failed: this change and the ones after it were not carried
                    // out. The engine takes them back (they are tried again at the next
                    // observation, and stop counting toward the cap).
                    for undone in &changes[index..] {
                        state.engine.undo(&undone.rule);
                    }
                    return Err(error);
                }
            }
        }
        Ok(events)
    }

    /// The service's stored rules that read; one that does not (written by an older
    /// version) is logged and left out.
    async fn stored_rules(&self, service: &str) -> Result<Vec<Rule>, StoreError> {
        let rows = self.center.store().rules(service).await?;
        Ok(rows
            .into_iter()
            .filter_map(|row| match Rule::from_json(&row.rule) {
                Ok(rule) if rule.service == service => Some(rule),
                Ok(_) => None,
                Err(error) => {
                    tracing::warn!(%error, service, rule = row.name, "stormguard center: a stored rule does not read; skipped");
                    None
                }
            })
            .collect())
    }

    async fn carry_out(
        &self,
        service: &str,
        rule: &Rule,
        decision: &Decision,
        state: &mut ServiceRules,
    ) -> Result<RuleEvent, StoreError> {
        let firing = decision.verdict == Verdict::Fire;
        let observed: serde_json::Map<String, Value> = decision
            .observed
            .iter()
            .map(|(series, value)| (series.to_string(), json!(value)))
            .collect();
        let mut detail = json!({
            "rule": rule.name,
            "endpoint": rule.endpoint,
            "verdict": if firing { "fire" } else { "revert" },
            "observed": observed,
        });
        let author = format!("rule:{}", rule.name);
        let caller = Caller {
            name: author.clone(),
            role: Role::Editor,
            service: None,
        };
        let mut last_error = String::new();
        for _ in 0..PUBLISH_TRIES {
            let latest = self.center.store().latest(service).await?;
            let Some(latest) = latest else {
                last_error = format!("{service} has no published policy to change");
                break;
            };
            let base = latest.version();
            let file = match PolicyFile::from_toml(&latest.policy) {
                Ok(file) => file,
                Err(error) => {
                    last_error = format!("version {base} does not read: {error}");
                    break;
                }
            };
            let planned = if firing {
                apply(&file, &rule.endpoint, &rule.actions).map(|(new, edits)| {
                    detail["changes"] = edits_json(&edits);
                    (Some(new), edits, Vec::new())
                })
            } else {
                let edits = state
                    .fired
                    .get(&rule.name)
                    .filter(|f| f.endpoint == rule.endpoint)
                    .map(|f| {
                        detail["fired_on"] = json!(f.on_version);
                        f.edits.clone()
                    })
                    .unwrap_or_default();
                revert(&file, &rule.endpoint, &edits).map(|(new, report)| {
                    detail["changes"] = reverted_json(&report);
                    (new, Vec::new(), report)
                })
            };
            let (new, edits, report) = match planned {
                Ok(planned) => planned,
                Err(error) => {
                    last_error = error.to_string();
                    break;
                }
            };
            let detail_text = detail.to_string();
            let nothing = new.is_none() || (firing && edits.is_empty());
            if rule.dry_run || nothing {
                let action = match (rule.dry_run, firing) {
                    (true, _) => "rule-dry-run",
                    (false, true) => "rule-fire",
                    (false, false) => "rule-revert",
                };
                self.audit(service, &author, action, Some(base), &detail_text)
                    .await?;
                if firing && !rule.dry_run {
                    state
                        .fired
                        .insert(rule.name.clone(), fired(rule, base, edits));
                } else {
                    state.fired.remove(&rule.name);
                }
                return Ok(event(rule, decision, None, action, detail_text));
            }
            let Some(new) = new else { break };
            if let Err(error) = refuse_lint_findings(&new, self.center.config().lint_blocks) {
                last_error = error.to_string();
                break;
            }
            let message = message(rule, firing, &edits, &report);
            let action = if firing { "rule-fire" } else { "rule-revert" };
            let release = Release {
                service,
                base,
                file: &new,
                message: &message,
                rollback_of: None,
                canary: None,
                action,
                detail: Some(&detail_text),
            };
            match release.write(&self.center, &caller).await {
                Ok(version) => {
                    if firing {
                        state
                            .fired
                            .insert(rule.name.clone(), fired(rule, base, edits));
                    } else {
                        state.fired.remove(&rule.name);
                    }
                    return Ok(event(
                        rule,
                        decision,
                        Some(version.version),
                        action,
                        detail_text,
                    ));
                }
                Err(ApiError::Conflict(_)) => {
                    last_error = "lost the compare-and-set on every try".to_owned();
                }
                Err(error) => {
                    last_error = error.to_string();
                    break;
                }
            }
        }
        detail["error"] = json!(last_error);
        let detail_text = detail.to_string();
        self.audit(service, &author, "rule-failed", None, &detail_text)
            .await?;
        Ok(event(rule, decision, None, "rule-failed", detail_text))
    }

    async fn audit(
        &self,
        service: &str,
        actor: &str,
        action: &str,
        version: Option<u64>,
        detail: &str,
    ) -> Result<(), StoreError> {
        self.center
            .store()
            .insert_audit(&NewAudit {
                at_ms: now_ms(),
                actor,
                action,
                service,
                version,
                instance: None,
                detail,
            })
            .await
    }
}

fn fired(rule: &Rule, on_version: u64, edits: Vec<FieldEdit>) -> Fired {
    Fired {
        on_version,
        endpoint: rule.endpoint.clone(),
        edits,
    }
}

fn event(
    rule: &Rule,
    decision: &Decision,
    version: Option<u64>,
    action: &'static str,
    detail: String,
) -> RuleEvent {
    RuleEvent {
        rule: rule.name.clone(),
        verdict: decision.verdict,
        version,
        action,
        detail,
    }
}

fn edits_json(edits: &[FieldEdit]) -> Value {
    Value::Array(
        edits
            .iter()
            .map(|e| json!({"field": e.field, "before": e.before, "after": e.after}))
            .collect(),
    )
}

fn reverted_json(report: &[RevertedField]) -> Value {
    Value::Array(
        report
            .iter()
            .map(|r| match r {
                RevertedField::Restored(e) => {
                    json!({"field": e.field, "restored": e.before, "from": e.after})
                }
                RevertedField::Kept { edit, now } => {
                    json!({"field": edit.field, "kept": now, "changed_since_firing": true})
                }
            })
            .collect(),
    )
}

fn show(value: Option<&Value>) -> String {
    value.map_or_else(|| "(unset)".to_owned(), Value::to_string)
}

/// The version's message: `rule cdn-504 fired: retry.max_attempts 3 -> 1, …`.
fn message(rule: &Rule, firing: bool, edits: &[FieldEdit], report: &[RevertedField]) -> String {
    if firing {
        let changes: Vec<String> = edits
            .iter()
            .map(|e| {
                format!(
                    "{} {} -> {}",
                    e.field,
                    show(e.before.as_ref()),
                    show(e.after.as_ref())
                )
            })
            .collect();
        format!("rule {} fired: {}", rule.name, changes.join(", "))
    } else {
        let changes: Vec<String> = report
            .iter()
            .map(|r| match r {
                RevertedField::Restored(e) => {
                    format!(
                        "{} {} -> {}",
                        e.field,
                        show(e.after.as_ref()),
                        show(e.before.as_ref())
                    )
                }
                RevertedField::Kept { edit, now } => {
                    format!(
                        "{} kept at {} (changed since the firing)",
                        edit.field,
                        show(now.as_ref())
                    )
                }
            })
            .collect();
        format!("rule {} reverted: {}", rule.name, changes.join(", "))
    }
}
