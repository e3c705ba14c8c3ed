//! Carrying out one firing or revert: a version written through the one publish path, or an
//! audit record when there is nothing to publish, or a `rule-failed` record naming why.
//!
//! The rule runner calls it for what the engine decides; the rule routes call it to revert
//! a fired rule that is edited to change something else, or deleted. Either way the version
//! is by `rule:<name>` and its audit record holds what the next revert needs
//! ([`super::state`]).

use serde_json::{Value, json};
use stormguard::policy::PolicyFile;
use stormguard::rules::{FieldEdit, Firing, RevertedField, Rule, apply, revert};

use super::state::{self, actor};
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
    if !rule.dry_run && state::active(center, service, &rule.name).await?.is_some() {
        // Fired already, and not reverted (by another replica's runner): its record is
        // what the revert needs; a second firing would find nothing to change and hide it.
        detail["note"] = json!("the rule had fired already; nothing changed");
        return Ok(Done {
            action: "rule-fire",
            version: None,
            detail: detail.to_string(),
        });
    }
    let action = if rule.dry_run {
        "rule-dry-run"
    } else {
        "rule-fire"
    };
    carry_out(
        center,
        service,
        &rule.name,
        action,
        detail,
        |file, detail| {
            let (new, edits) =
                apply(file, &rule.endpoint, &rule.actions).map_err(|e| e.to_string())?;
            detail["changes"] = json!(&edits);
            Ok(Plan {
                file: (!edits.is_empty() && !rule.dry_run).then_some(new),
                message: fired_message(&rule.name, &edits),
                handed: Vec::new(),
            })
        },
    )
    .await
}

/// Reverts what rule `name` of `service` changed, as its last record says; `detail` says
/// why (the observed values, or the edit that made the revert) and receives what was done
/// with each field. A rule that is not active has nothing to revert: a `rule-revert` record
/// saying so, and no version.
pub(crate) async fn undo(
    center: &Center,
    service: &str,
    name: &str,
    mut detail: Value,
) -> Result<Done, StoreError> {
    let Some(active) = state::active(center, service, name).await? else {
        detail["changes"] = json!([]);
        detail["note"] = json!("the rule had no change in place to revert");
        let detail = detail.to_string();
        audit(center, service, name, "rule-revert", None, &detail).await?;
        return Ok(Done {
            action: "rule-revert",
            version: None,
            detail,
        });
    };
    let others = state::others(center, service, name).await?;
    detail["endpoint"] = json!(active.firing.endpoint);
    detail["fired_in"] = json!(active.version);
    let reason = detail["reason"].as_str().map(str::to_owned);
    let done = carry_out(
        center,
        service,
        name,
        "rule-revert",
        detail,
        |file, detail| {
            let reverted = revert(file, &active.firing, &others).map_err(|e| e.to_string())?;
            detail["changes"] = reverted_json(&reverted.fields);
            Ok(Plan {
                file: reverted.file,
                message: reverted_message(name, reason.as_deref(), &reverted.fields),
                handed: reverted.handed,
            })
        },
    )
    .await?;
    Ok(done)
}

/// Tries `plan` on the latest version until its publish wins the compare-and-set (or
/// [`PUBLISH_TRIES`] times), and writes the audit records.
async fn carry_out(
    center: &Center,
    service: &str,
    name: &str,
    action: &'static str,
    mut detail: Value,
    mut plan: impl FnMut(&PolicyFile, &mut Value) -> Result<Plan, String>,
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
        let planned = PolicyFile::from_toml(&latest.policy)
            .map_err(|error| format!("version {base} does not read: {error}"))
            .and_then(|file| plan(&file, &mut detail));
        let Plan {
            file,
            message,
            handed,
        } = match planned {
            Ok(planned) => planned,
            Err(error) => {
                last_error = error;
                break;
            }
        };
        let detail_text = detail.to_string();
        let version = match file {
            None => {
                audit(center, service, name, action, Some(base), &detail_text).await?;
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
        for firing in &handed {
            hand_over(center, service, name, firing).await?;
        }
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

/// Records that `firing`'s rule now holds a value before handed over by rule `from`: its
/// `rule-handoff` record is its firing as it now stands, read by its own revert.
async fn hand_over(
    center: &Center,
    service: &str,
    from: &str,
    firing: &Firing,
) -> Result<(), StoreError> {
    let detail = json!({
        "rule": firing.rule,
        "endpoint": firing.endpoint,
        "changes": firing.edits,
        "handed_over_by": from,
    })
    .to_string();
    audit(center, service, &firing.rule, "rule-handoff", None, &detail).await
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
        .insert_audit(&NewAudit {
            at_ms: now_ms(),
            actor: &actor(rule),
            action,
            service,
            version,
            instance: None,
            detail,
        })
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
