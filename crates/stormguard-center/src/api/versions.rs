//! Publishing, rolling back, the history, and canary steps.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use stormguard::policy::PolicyFile;

use super::check_name;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::fanout::NatsFanout;
use crate::hub::Selector;
use crate::metric_names::{CONFLICTS, VERSIONS};
use crate::server::{Center, now_ms};
use crate::store::{NewAudit, NewVersion, StoreError};
use crate::version::{Snapshot, Version, canonical_text, changed_fields, content_hash};

/// The format of a published policy text.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Format {
    #[default]
    Toml,
    Json,
}

/// The body of `POST /v1/services/{service}/versions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Publish {
    /// The latest version the editor saw (0 for the first publish).
    base: u64,
    policy: String,
    #[serde(default)]
    format: Format,
    #[serde(default)]
    message: String,
    /// Publish as a canary for these instances only.
    #[serde(default)]
    canary: Option<Selector>,
}

/// The body of `POST /v1/services/{service}/rollback`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Rollback {
    base: u64,
    /// The version whose policies are published again.
    to: u64,
    #[serde(default)]
    message: String,
}

/// The body of a canary step.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Step {
    #[serde(default)]
    message: String,
    /// The canary the step is meant for: refused (409) when another one runs by now.
    #[serde(default)]
    version: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Limit {
    limit: Option<u32>,
}

const MAX_MESSAGE: usize = 4096;

pub(crate) async fn publish(
    State(center): State<Center>,
    caller: Caller,
    Path(service): Path<String>,
    Json(body): Json<Publish>,
) -> Result<(StatusCode, Json<Version>), ApiError> {
    let version = publish_text(&center, &caller, &service, &body).await?;
    Ok((StatusCode::CREATED, Json(version)))
}

impl Publish {
    /// A publish of `policy` (TOML) on `base`, for everyone or for a canary share.
    pub(crate) fn toml(base: u64, policy: String, message: String, share: Option<u8>) -> Self {
        Publish {
            base,
            policy,
            format: Format::Toml,
            message,
            canary: share.map(Selector::Share),
        }
    }
}

/// Checks and publishes one new version as `caller`: the API's publish and the dashboard's.
pub(crate) async fn publish_text(
    center: &Center,
    caller: &Caller,
    service: &str,
    body: &Publish,
) -> Result<Version, ApiError> {
    caller.may_edit()?;
    check_name("service", service)?;
    let file = match body.format {
        Format::Toml => PolicyFile::from_toml(&body.policy),
        Format::Json => PolicyFile::from_json(&body.policy),
    }
    .map_err(|e| ApiError::InvalidPolicy(e.to_string()))?;
    refuse_lint_findings(&file, center.config().lint_blocks)?;
    if let Some(Selector::Share(percent @ 101..)) = &body.canary {
        return Err(ApiError::BadRequest(format!(
            "canary share {percent}: expected 0 to 100"
        )));
    }
    let action = if body.canary.is_some() {
        "canary"
    } else {
        "publish"
    };
    let release = Release {
        service,
        base: body.base,
        file: &file,
        message: &body.message,
        rollback_of: None,
        canary: body.canary.as_ref(),
        action,
        detail: None,
        also: &[],
    };
    release.write(center, caller).await
}

/// The findings of the policy linter at or above `blocks`, as one 422 naming each (rule, field,
/// message); none, or no `blocks`, lets the publish go on.
pub(crate) fn refuse_lint_findings(
    file: &PolicyFile,
    blocks: Option<stormguard::lint::Severity>,
) -> Result<(), ApiError> {
    let Some(blocks) = blocks else {
        return Ok(());
    };
    let blocking: Vec<String> = stormguard::lint::lint_policy_file(file, None)
        .into_iter()
        .filter(|f| f.severity >= blocks)
        .map(|f| {
            format!(
                "{} {} at {}: {}",
                f.severity,
                f.rule.id(),
                f.field,
                f.message
            )
        })
        .collect();
    if blocking.is_empty() {
        return Ok(());
    }
    Err(ApiError::InvalidPolicy(format!(
        "lint: {}",
        blocking.join("; ")
    )))
}

pub(crate) async fn rollback(
    State(center): State<Center>,
    caller: Caller,
    Path(service): Path<String>,
    Json(body): Json<Rollback>,
) -> Result<(StatusCode, Json<Version>), ApiError> {
    let version = roll_back(&center, &caller, &service, &body).await?;
    Ok((StatusCode::CREATED, Json(version)))
}

impl Rollback {
    /// A rollback to `to` on `base`, with the default message.
    pub(crate) fn to(base: u64, to: u64) -> Self {
        Rollback {
            base,
            to,
            message: String::new(),
        }
    }
}

/// Publishes version `to`'s policies again, as a new version on `base`, as `caller`: the
/// API's rollback and the dashboard's.
pub(crate) async fn roll_back(
    center: &Center,
    caller: &Caller,
    service: &str,
    body: &Rollback,
) -> Result<Version, ApiError> {
    caller.may_edit()?;
    check_name("service", service)?;
    let old = center
        .store()
        .version(service, body.to)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("{service} has no version {}", body.to)))?;
    let file = PolicyFile::from_toml(&old.policy)
        .map_err(|e| ApiError::InvalidPolicy(format!("version {}: {e}", body.to)))?;
    let message = if body.message.is_empty() {
        format!("rollback to version {}", body.to)
    } else {
        body.message.clone()
    };
    let release = Release {
        service,
        base: body.base,
        file: &file,
        message: &message,
        rollback_of: Some(body.to),
        canary: None,
        action: "rollback",
        detail: None,
        also: &[],
    };
    release.write(center, caller).await
}

/// One new version, about to be written: the one path every publish takes (the API's
/// publish and rollback, and the rules' firings and reverts).
pub(crate) struct Release<'a> {
    pub(crate) service: &'a str,
    pub(crate) base: u64,
    pub(crate) file: &'a PolicyFile,
    pub(crate) message: &'a str,
    pub(crate) rollback_of: Option<u64>,
    pub(crate) canary: Option<&'a Selector>,
    pub(crate) action: &'a str,
    /// The audit record's detail when it is not the message.
    pub(crate) detail: Option<&'a str>,
    /// More audit records written in the version's transaction (the `rule-handoff` records
    /// of a rule's revert): all of them, or none with the version.
    pub(crate) also: &'a [NewAudit<'a>],
}

impl Release<'_> {
    /// Writes the version on `base` (409 when `base` is not the latest) as `caller`, and
    /// tells the watchers.
    pub(crate) async fn write(
        &self,
        center: &Center,
        caller: &Caller,
    ) -> Result<Version, ApiError> {
        if self.message.len() > MAX_MESSAGE {
            return Err(ApiError::BadRequest(format!(
                "message: longer than {MAX_MESSAGE} bytes"
            )));
        }
        let store = center.store();
        let latest = store.latest(self.service).await?;
        let latest_number = latest.as_ref().map_or(0, |row| row.version());
        if latest_number != self.base {
            metrics::counter!(CONFLICTS).increment(1);
            return Err(StoreError::Conflict {
                base: self.base,
                latest: latest_number,
            }
            .into());
        }
        let previous = latest.and_then(|row| PolicyFile::from_toml(&row.policy).ok());
        let diff = changed_fields(previous.as_ref(), self.file);
        let policy = canonical_text(self.file);
        let hash = content_hash(&policy);
        let diff_text = serde_json::to_string(&diff).unwrap_or_else(|_| "[]".to_owned());
        let selector = self
            .canary
            .map(|s| serde_json::to_string(s).unwrap_or_default());
        let new = NewVersion {
            service: self.service,
            base: self.base,
            hash: &hash,
            policy: &policy,
            author: &caller.name,
            message: self.message,
            diff: &diff_text,
            rollback_of: self.rollback_of,
            canary: selector.as_deref(),
            now_ms: now_ms(),
            action: self.action,
            detail: self.detail,
            also: self.also,
        };
        let (now_ms, published) = (new.now_ms, store.publish(&new).await);
        let number = match published {
            Ok(number) => number,
            Err(error) => {
                if matches!(error, StoreError::Conflict { .. }) {
                    metrics::counter!(CONFLICTS).increment(1);
                }
                return Err(error.into());
            }
        };
        metrics::counter!(VERSIONS).increment(1);
        refresh(center, self.service).await;
        Ok(Version {
            service: self.service.to_owned(),
            version: number,
            hash,
            policy,
            author: caller.name.clone(),
            message: self.message.to_owned(),
            diff,
            rollback_of: self.rollback_of,
            created_ms: now_ms,
        })
    }
}

/// Tells this replica's watchers; a failure here is logged, the version exists and the next
/// refresh (or the watchers' poll) carries it.
async fn refresh(center: &Center, service: &str) {
    if let Err(error) = center.hub().refresh(service).await {
        tracing::warn!(%error, service, "stormguard center: refreshing watchers failed");
    }
    if let Some(fanout) = &center.config().fanout {
        if let Err(error) = fan_out(center, fanout, service).await {
            tracing::warn!(%error, service, "stormguard center: NATS fanout failed");
        }
    }
}

/// Puts the service's stable version into the NATS bucket.
async fn fan_out(center: &Center, fanout: &NatsFanout, service: &str) -> Result<(), String> {
    let store = center.store();
    let stable = store
        .release(service)
        .await
        .map_err(|e| e.to_string())?
        .and_then(|release| release.stable)
        .and_then(|v| u64::try_from(v).ok());
    let Some(stable) = stable else { return Ok(()) };
    let Some(row) = store
        .version(service, stable)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(());
    };
    fanout
        .put(&Snapshot::from(row))
        .await
        .map_err(|e| e.to_string())
}

pub(crate) async fn history(
    State(center): State<Center>,
    caller: Caller,
    Path(service): Path<String>,
    Query(limit): Query<Limit>,
) -> Result<Json<Vec<Version>>, ApiError> {
    caller.may_read(&service)?;
    let rows = center
        .store()
        .history(&service, limit.limit.unwrap_or(50).min(1000))
        .await?;
    Ok(Json(rows.into_iter().map(Version::from).collect()))
}

pub(crate) async fn one(
    State(center): State<Center>,
    caller: Caller,
    Path((service, version)): Path<(String, u64)>,
) -> Result<Json<Version>, ApiError> {
    caller.may_read(&service)?;
    let row = center
        .store()
        .version(&service, version)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("{service} has no version {version}")))?;
    Ok(Json(row.into()))
}

pub(crate) async fn promote(
    State(center): State<Center>,
    caller: Caller,
    Path(service): Path<String>,
    body: Option<Json<Step>>,
) -> Result<StatusCode, ApiError> {
    end_canary(center, caller, service, body, true).await
}

pub(crate) async fn abort(
    State(center): State<Center>,
    caller: Caller,
    Path(service): Path<String>,
    body: Option<Json<Step>>,
) -> Result<StatusCode, ApiError> {
    end_canary(center, caller, service, body, false).await
}

async fn end_canary(
    center: Center,
    caller: Caller,
    service: String,
    body: Option<Json<Step>>,
    promote: bool,
) -> Result<StatusCode, ApiError> {
    let Step { message, version } = body.map(|Json(step)| step).unwrap_or_default();
    end_canary_as(&center, &caller, &service, &message, promote, version).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Promotes (or aborts) `service`'s canary as `caller`: the API's step and the dashboard's.
///
/// With `expected`, only that canary: a page (or a script) that saw v5 must not promote the
/// v6 another editor started since, so a different canary is a conflict, as is one that
/// changes between the read and the step.
pub(crate) async fn end_canary_as(
    center: &Center,
    caller: &Caller,
    service: &str,
    message: &str,
    promote: bool,
    expected: Option<u64>,
) -> Result<(), ApiError> {
    caller.may_edit()?;
    check_name("service", service)?;
    let Some(canary) = center
        .store()
        .release(service)
        .await?
        .and_then(|release| release.canary)
        .and_then(|v| u64::try_from(v).ok())
    else {
        return Err(ApiError::NotFound(format!("{service} has no canary")));
    };
    if let Some(expected) = expected.filter(|e| *e != canary) {
        return Err(ApiError::Conflict(format!(
            "{service}'s canary is v{canary} now, not v{expected}: look at it before this step"
        )));
    }
    let audit = NewAudit {
        at_ms: now_ms(),
        actor: &caller.name,
        action: if promote {
            "canary-promote"
        } else {
            "canary-abort"
        },
        service,
        version: Some(canary),
        instance: None,
        detail: message,
    };
    if !center.store().end_canary(promote, canary, &audit).await? {
        return Err(ApiError::Conflict(format!(
            "{service}'s canary v{canary} ended or changed during this step"
        )));
    }
    refresh(center, service).await;
    Ok(())
}
