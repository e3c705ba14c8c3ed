//! Carrying out one firing or revert: a version written through the one publish path, or an
//! audit record when there is nothing to publish, or a `rule-failed` record naming why.
//!
//! The rule runner calls it for what the engine decides; the rule routes call it to revert
//! a fired rule that is edited to change something else, or deleted. Either way the version
//! is by `rule:<name>` and its audit record holds what the next revert needs
//! ([`super::state`]).

use serde_json::{Value, json};
use stormguard::policy::PolicyFile;
use stormguard::rules::{FieldEdit, Firing, RevertedField, Rule, apply_among, revert};

use super::state::{self, Active, actor};
use crate::api::versions::{Release, refuse_lint_findings};
use crate::auth::{Caller, Role};
use crate::error::ApiError;
use crate::server::{Center, now_ms};
use crate::store::{NewAudit, StoreError};

/// How many times a firing or revert is tried on a newer latest version after losing the
/// compare-and-set.
const PUBLISH_TRIES: usize = 5;

/// What was done: the audit action written, the version published if one was, and the
/// record's detail.
#[derive(Clone, Debug)]
pub(crate) struct Done {
    pub(crate) action: &'static str,
    pub(crate) version: Option<u64>,
    pub(crate) detail: String,
}

/// What one try plans on the latest version: the policy to publish (`None`: nothing to
/// change) with its message, and the firings other rules took over.
struct Plan {
    file: Option<PolicyFile>,
    message: String,
    handed: Vec<Firing>,
}

/// What is carried out, planned again on each try.
enum Job<'a> {
    /// Fire the rule (or record what it would change, for a dry run).
    Fire(&'a Rule),
    /// Revert what the rule's active firing changed; the reason when it is not the rule's
    /// own condition.
    Undo(Option<String>),
}

/// Where the rule stands at one try, read after the latest version (so that the record
/// which went with that version is seen): its firing, and the other rules' that are
/// active (a firing holds a field one of them set to the same value, a revert hands
/// values to them).
struct Standing {
    active: Option<Active>,
    others: Vec<Active>,
}

impl Standing {
    /// The other active rules' firings, oldest first.
    fn other_firings(&self) -> Vec<Firing> {
        self.others.iter().map(|a| a.firing.clone()).collect()
    }
}

/// Fires `rule` on `service`'s latest version; `detail` holds the observed values and
/// receives the changes. A dry run records what it would change and publishes nothing; a
/// rule whose last record says it fired already writes nothing.
pub(crate) async fn fire(
    center: &Center,
    service: &str,
    rule: &Rule,
    mut detail: Value,
) -> Result<Done, StoreError> {
    detail["endpoint"] = json!(rule.endpoint);
    let action = if rule.dry_run {
        "rule-dry-run"
    } else {
        "rule-fire"
    };
    carry_out(center, service, &rule.name, action, Job::Fire(rule), detail).await
}

/// Reverts what rule `name` of `service` changed, as its last record says; `detail` says
/// why (the observed values, or the edit that made the revert) and receives what was done
/// with each field. A rule that is not active has nothing to revert: a `rule-revert` record
/// saying so, and no version.
pub(crate) async fn undo(
    center: &Center,
    service: &str,
    name: &str,
    detail: Value,
) -> Result<Done, StoreError> {
    let reason = detail["reason"].as_str().map(str::to_owned);
    carry_out(
        center,
        service,
        name,
        "rule-revert",
        Job::Undo(reason),
        detail,
    )
    .await
}

/// What `job` does on `file` with the rule standing as `standing` says: `Ok(None)` when
/// there is nothing to write at all (the rule fired already, by another replica's runner
/// that won the race: its record is what the revert needs, and a second `rule-fire` record
/// with no changes over it would hide it).
fn plan(
    job: &Job<'_>,
    name: &str,
    file: &PolicyFile,
    standing: &Standing,
    detail: &mut Value,
) -> Result<Option<Plan>, String> {
    match job {
        Job::Fire(rule) => {
            if !rule.dry_run && standing.active.is_some() {
                return Ok(None);
            }
            let (new, edits) = apply_among(
                file,
                &rule.endpoint,
                &rule.actions,
                &standing.other_firings(),
            )
            .map_err(|e| e.to_string())?;
            detail["changes"] = json!(&edits);
            let changed: Vec<FieldEdit> = edits.into_iter().filter(FieldEdit::changed).collect();
            Ok(Some(Plan {
                file: (!changed.is_empty() && !rule.dry_run).then_some(new),
                message: fired_message(&rule.name, &changed),
                handed: Vec::new(),
            }))
        }
        Job::Undo(reason) => {
            let Some(active) = &standing.active else {
                detail["changes"] = json!([]);
                detail["note"] = json!("the rule had no change in place to revert");
                return Ok(Some(Plan {
                    file: None,
                    message: String::new(),
                    handed: Vec::new(),
                }));
            };
            detail["endpoint"] = json!(active.firing.endpoint);
            detail["fired_in"] = json!(active.version);
            let reverted = revert(file, &active.firing, &standing.other_firings())
                .map_err(|e| e.to_string())?;
            detail["changes"] = reverted_json(&reverted.fields);
            Ok(Some(Plan {
                file: reverted.file,
                message: reverted_message(name, reason.as_deref(), &reverted.fields),
                handed: reverted.handed,
            }))
        }
    }
}

/// Tries `job` on the latest version until its publish wins the compare-and-set (or
/// [`PUBLISH_TRIES`] times), reading where the rule stands again on each try, and writes
/// the audit records: the version's, with the `rule-handoff` records of a revert in the
/// same transaction.
async fn carry_out(
    center: &Center,
    service: &str,
    name: &str,
    action: &'static str,
    job: Job<'_>,
    mut detail: Value,
) -> Result<Done, StoreError> {
    let caller = Caller {
        name: actor(name),
        role: Role::Editor,
        service: None,
    };
    let mut last_error = String::new();
    for _ in 0..PUBLISH_TRIES {
        let Some(latest) = center.store().latest(service).await? else {
            last_error = format!("{service} has no published policy to change");
            break;
        };
        let base = latest.version();
        let standing = Standing {
            active: state::active(center, service, name).await?,
            others: state::others(center, service, name).await?,
        };
        let planned = PolicyFile::from_toml(&latest.policy)
            .map_err(|error| format!("version {base} does not read: {error}"))
            .and_then(|file| plan(&job, name, &file, &standing, &mut detail));
        let Plan {
            file,
            message,
            handed,
        } = match planned {
            Ok(Some(planned)) => planned,
            Ok(None) => {
                detail["note"] = json!("the rule had fired already; nothing changed");
                return Ok(Done {
                    action,
                    version: None,
                    detail: detail.to_string(),
                });
            }
            Err(error) => {
                last_error = error;
                break;
            }
        };
        let detail_text = detail.to_string();
        let handoffs: Vec<(String, String)> = handed
            .iter()
            .map(|firing| handoff(name, firing, &standing.others))
            .collect();
        let now = now_ms();
        let handoffs: Vec<NewAudit<'_>> = handoffs
            .iter()
            .map(|(actor, detail)| NewAudit {
                at_ms: now,
                actor,
                action: "rule-handoff",
                service,
                version: None,
                instance: None,
                detail,
            })
            .collect();
        let version = match file {
            None => {
                let own = NewAudit {
                    at_ms: now,
                    actor: &caller.name,
                    action,
                    service,
                    // A revert with nothing in place went with no version.
                    version: (standing.active.is_some() || matches!(job, Job::Fire(_)))
                        .then_some(base),
                    instance: None,
                    detail: &detail_text,
                };
                let records: Vec<NewAudit<'_>> = std::iter::once(own).chain(handoffs).collect();
                center.store().insert_audits(&records).await?;
                None
            }
            Some(new) => {
                if let Err(error) = refuse_lint_findings(&new, center.config().lint_blocks) {
                    last_error = error.to_string();
                    break;
                }
                let release = Release {
                    service,
                    base,
                    file: &new,
                    message: &message,
                    rollback_of: None,
                    canary: None,
                    action,
                    detail: Some(&detail_text),
                    also: &handoffs,
                };
                match release.write(center, &caller).await {
                    Ok(version) => Some(version.version),
                    Err(ApiError::Conflict(_)) => {
                        last_error = "lost the compare-and-set on every try".to_owned();
                        continue;
                    }
                    Err(error) => {
                        last_error = error.to_string();
                        break;
                    }
                }
            }
        };
        return Ok(Done {
            action,
            version,
            detail: detail_text,
        });
    }
    detail["error"] = json!(last_error);
    let detail = detail.to_string();
    audit(center, service, name, "rule-failed", None, &detail).await?;
    Ok(Done {
        action: "rule-failed",
        version: None,
        detail,
    })
}

/// The `rule-handoff` record (actor, detail) saying that `firing`'s rule now holds a value
/// before handed over by rule `from`: its firing as it now stands, read by its own revert,
/// with when and in which order it first fired (from `active`, the heir's current
/// standing), so that its `min_hold` and its place among the firings do not restart at
/// the hand-over.
fn handoff(from: &str, firing: &Firing, active: &[Active]) -> (String, String) {
    let origin = active.iter().find(|a| a.firing.rule == firing.rule);
    let detail = json!({
        "rule": firing.rule,
        "endpoint": firing.endpoint,
        "changes": firing.edits,
        "handed_over_by": from,
        "fired_ms": origin.map(|a| a.fired_ms),
        "fired_id": origin.map(|a| a.fired_id),
    })
    .to_string();
    (actor(&firing.rule), detail)
}

/// Writes one audit record by rule `rule` with no version published.
pub(super) async fn audit(
    center: &Center,
    service: &str,
    rule: &str,
    action: &str,
    version: Option<u64>,
    detail: &str,
) -> Result<(), StoreError> {
    center
        .store()
        .insert_audits(&[NewAudit {
            at_ms: now_ms(),
            actor: &actor(rule),
            action,
            service,
            version,
            instance: None,
            detail,
        }])
        .await
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
                RevertedField::HandedOver { edit, to } => {
                    json!({"field": edit.field, "handed_to": to, "before": edit.before})
                }
            })
            .collect(),
    )
}

fn show(value: Option<&Value>) -> String {
    value.map_or_else(|| "(unset)".to_owned(), Value::to_string)
}

/// The version's message: `rule cdn-504 fired: retry.max_attempts 3 -> 1, …`.
fn fired_message(rule: &str, edits: &[FieldEdit]) -> String {
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
    format!("rule {rule} fired: {}", changes.join(", "))
}

/// The version's message: `rule cdn-504 reverted: retry.max_attempts 1 -> 3, …`, with the
/// reason when it was not the rule's own condition (`rule cdn-504 reverted (deleted by
/// alice): …`).
fn reverted_message(rule: &str, reason: Option<&str>, report: &[RevertedField]) -> String {
    let changes: Vec<String> = report
        .iter()
        .map(|r| match r {
            RevertedField::Restored(e) => format!(
                "{} {} -> {}",
                e.field,
                show(e.after.as_ref()),
                show(e.before.as_ref())
            ),
            RevertedField::Kept { edit, now } => format!(
                "{} kept at {} (changed since the firing)",
                edit.field,
                show(now.as_ref())
            ),
            RevertedField::HandedOver { edit, to } => format!(
                "{} left to rule {to}, which restores {} when it reverts",
                edit.field,
                show(edit.before.as_ref())
            ),
        })
        .collect();
    let why = reason.map(|r| format!(" ({r})")).unwrap_or_default();
    format!("rule {rule} reverted{why}: {}", changes.join(", "))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use stormguard::rules::apply;

    use super::*;

    const POLICY: &str = r#"
[endpoints."GET /img/*"]
idempotency = "idempotent"
retry = { max_attempts = 3 }
timeouts = { per_try = "300ms", overall = "1s" }
"#;

    fn rule() -> Rule {
        Rule::from_json(
            &json!({
                "name": "cut", "service": "web", "endpoint": "GET /img/*", "for": "10s",
                "exit_for": "20s",
                "when": { "series": "error_ratio", "code": 504, "above": 0.1, "exit_below": 0.02 },
                "actions": [{ "set": "attempts", "max_attempts": 1 }],
            })
            .to_string(),
        )
        .unwrap()
    }

    /// The try of a runner that lost the compare-and-set to another replica's firing of the
    /// same rule: the latest version holds the rule's values already, and the rule's newest
    /// record is the other runner's firing. It plans nothing at all, rather than a second
    /// `rule-fire` record with no changes that would hide the first from the revert.
    #[test]
    fn a_try_that_finds_the_rule_fired_by_another_runner_writes_nothing() {
        let rule = rule();
        let base = PolicyFile::from_toml(POLICY).unwrap();
        let (fired, edits) = apply(&base, &rule.endpoint, &rule.actions).unwrap();
        let other_runner = Active {
            firing: Firing {
                rule: rule.name.clone(),
                endpoint: rule.endpoint.clone(),
                edits,
            },
            version: Some(2),
            fired_ms: 1,
            fired_id: 7,
        };
        let standing = Standing {
            active: Some(other_runner),
            others: Vec::new(),
        };
        let mut detail = json!({});
        let planned = plan(
            &Job::Fire(&rule),
            &rule.name,
            &fired,
            &standing,
            &mut detail,
        );
        assert!(planned.unwrap().is_none(), "{detail}");
        // Idle, the same try fires.
        let idle = Standing {
            active: None,
            others: Vec::new(),
        };
        let planned = plan(&Job::Fire(&rule), &rule.name, &base, &idle, &mut detail).unwrap();
        assert!(planned.unwrap().file.is_some(), "{detail}");
    }
}
