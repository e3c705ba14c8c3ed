//! The rules of a service: list (viewer), put and delete (editor).
//!
//! A rule is sent as the JSON shape of `stormguard::rules` (the same fields as a rule
//! file's `[[rules]]` table), checked before it is stored (422 naming the field); its
//! `service` and `name` must be those of the URL, so a rule cannot be filed under another
//! service than the one it changes. Each change is an audit record (`rule-put`,
//! `rule-delete`).
//!
//! A fired rule that is deleted, or edited to change something else (another endpoint,
//! other actions, dry run on or off), first has its change reverted: a version by
//! `rule:<name>` whose `rule-revert` record names the editor (see [`crate::rules`]); if that
//! revert cannot be published, the edit is refused with 409. The edit takes this replica's
//! rule turn only: see [`crate::rules`] for what that orders across replicas and what not.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;
use serde_json::Value;
use stormguard::rules::Rule;

use super::check_name;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::rules::revert_before_edit;
use crate::server::{Center, now_ms};
use crate::store::NewAudit;

/// One stored rule, as `GET /v1/services/{service}/rules` lists it.
#[derive(Debug, Serialize)]
pub(crate) struct StoredRule {
    name: String,
    rule: Value,
    updated_ms: i64,
}

pub(crate) async fn list(
    State(center): State<Center>,
    caller: Caller,
    Path(service): Path<String>,
) -> Result<Json<Vec<StoredRule>>, ApiError> {
    caller.may_read(&service)?;
    check_name("service", &service)?;
    let rows = center.store().rules(&service).await?;
    Ok(Json(
        rows.into_iter()
            .map(|row| StoredRule {
                name: row.name,
                rule: serde_json::from_str(&row.rule).unwrap_or(Value::Null),
                updated_ms: row.updated_ms,
            })
            .collect(),
    ))
}

pub(crate) async fn put(
    State(center): State<Center>,
    caller: Caller,
    Path((service, name)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Result<StatusCode, ApiError> {
    caller.may_edit()?;
    check_name("service", &service)?;
    check_name("rule", &name)?;
    let rule = Rule::from_json(&body.to_string())
        .map_err(|e| ApiError::InvalidPolicy(format!("rule: {e}")))?;
    if rule.service != service || rule.name != name {
        return Err(ApiError::BadRequest(format!(
            "the rule says service {:?} and name {:?}; the URL says {service:?} and {name:?}",
            rule.service, rule.name
        )));
    }
    let text = rule.to_json();
    let _turn = center.rule_turn().await;
    if let Some(old) = stored(&center, &service, &name).await? {
        revert_before_edit(&center, &service, &old, Some(&rule), &caller.name).await?;
    }
    let audit = NewAudit {
        at_ms: now_ms(),
        actor: &caller.name,
        action: "rule-put",
        service: &service,
        version: None,
        instance: None,
        detail: &text,
    };
    center.store().put_rule(&name, &text, &audit).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn delete(
    State(center): State<Center>,
    caller: Caller,
    Path((service, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    caller.may_edit()?;
    check_name("service", &service)?;
    let _turn = center.rule_turn().await;
    if let Some(old) = stored(&center, &service, &name).await? {
        revert_before_edit(&center, &service, &old, None, &caller.name).await?;
    }
    let audit = NewAudit {
        at_ms: now_ms(),
        actor: &caller.name,
        action: "rule-delete",
        service: &service,
        version: None,
        instance: None,
        detail: &name,
    };
    if center.store().delete_rule(&name, &audit).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound(format!(
            "{service} has no rule {name:?}"
        )))
    }
}

/// The stored rule `name` of `service`, if there is one that reads (one that does not was
/// never run, so it has nothing to revert).
async fn stored(center: &Center, service: &str, name: &str) -> Result<Option<Rule>, ApiError> {
    let rows = center.store().rules(service).await?;
    Ok(rows
        .into_iter()
        .find(|row| row.name == name)
        .and_then(|row| Rule::from_json(&row.rule).ok()))
}
