//! Status, audit, tokens and metrics.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::check_name;
use crate::auth::{Caller, Role};
use crate::error::ApiError;
use crate::hub::Selector;
use crate::server::Center;
use crate::store::AuditRow;

/// The answer of `GET /v1/services/{service}/status`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    /// The service.
    pub service: String,
    /// The version every instance outside the canary should run.
    pub stable: Option<u64>,
    /// The canary version and the instances it is for.
    pub canary: Option<(u64, Selector)>,
    /// Every instance that watched or acknowledged.
    pub instances: Vec<InstanceStatus>,
}

/// One instance's state in a [`Status`].
#[derive(Debug, Serialize, Deserialize)]
pub struct InstanceStatus {
    /// The instance's id.
    pub instance: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// The version it should run (stable, or the canary if selected).
    pub target: Option<u64>,
    /// The version it last acknowledged (ACK or NACK).
    pub version: Option<u64>,
    /// Whether it applied that version (false: NACK).
    pub applied: Option<bool>,
    /// Why it could not, for a NACK.
    pub reason: Option<String>,
    /// When it last watched or acknowledged, in milliseconds since the Unix epoch.
    pub seen_ms: i64,
}

/// One audit record.
#[derive(Debug, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Its number, increasing.
    pub id: i64,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// Who: the token's name.
    pub actor: String,
    /// What: `publish`, `rollback`, `canary`, `canary-promote`, `canary-abort`, `ack`, `nack`.
    pub action: String,
    /// The service.
    pub service: String,
    /// The version concerned.
    pub version: Option<u64>,
    /// The instance, for an ACK or NACK.
    pub instance: Option<String>,
    /// The message of a publish, the reason of a NACK.
    pub detail: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditQuery {
    service: Option<String>,
    limit: Option<u32>,
}

/// The body of `POST /v1/tokens`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewToken {
    name: String,
    role: Role,
    service: Option<String>,
}

pub(crate) async fn status(
    State(center): State<Center>,
    caller: Caller,
    axum::extract::Path(service): axum::extract::Path<String>,
) -> Result<Json<Status>, ApiError> {
    caller.may_read(&service)?;
    Ok(Json(service_status(&center, service).await?))
}

/// What `service`'s instances should run and run: the API's status and the dashboard's.
pub(crate) async fn service_status(center: &Center, service: String) -> Result<Status, ApiError> {
    check_name("service", &service)?;
    let release = center.hub().current(&service).await?;
    let rows = center.store().instances(&service).await?;
    let instances = rows
        .into_iter()
        .map(|row| {
            let labels: BTreeMap<String, String> =
                serde_json::from_str(&row.labels).unwrap_or_default();
            InstanceStatus {
                target: release.target(&row.instance, &labels).map(|s| s.version),
                instance: row.instance,
                labels,
                version: row.version.and_then(|v| u64::try_from(v).ok()),
                applied: row.applied.map(|a| a != 0),
                reason: row.reason,
                seen_ms: row.seen_ms,
            }
        })
        .collect();
    Ok(Status {
        service,
        stable: release.stable.as_ref().map(|s| s.version),
        canary: release
            .canary
            .as_ref()
            .map(|(s, selector)| (s.version, selector.clone())),
        instances,
    })
}

pub(crate) async fn audit(
    State(center): State<Center>,
    caller: Caller,
    Query(query): Query<AuditQuery>,
) -> Result<Json<Vec<AuditRecord>>, ApiError> {
    match &query.service {
        Some(service) => caller.may_read(service)?,
        None => caller.may_read_all()?,
    }
    let rows = center
        .store()
        .audit_log(
            query.service.as_deref(),
            query.limit.unwrap_or(100).min(10_000),
        )
        .await?;
    Ok(Json(rows.into_iter().map(AuditRecord::from).collect()))
}

impl From<AuditRow> for AuditRecord {
    fn from(row: AuditRow) -> AuditRecord {
        AuditRecord {
            id: row.id,
            at_ms: row.at_ms,
            actor: row.actor,
            action: row.action,
            service: row.service,
            version: row.version.and_then(|v| u64::try_from(v).ok()),
            instance: row.instance,
            detail: row.detail,
        }
    }
}

pub(crate) async fn create_token(
    State(center): State<Center>,
    caller: Caller,
    Json(body): Json<NewToken>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    caller.may_admin()?;
    check_name("token name", &body.name)?;
    match (&body.role, &body.service) {
        (Role::Instance, None) => {
            return Err(ApiError::BadRequest(
                "an instance token needs its service".to_owned(),
            ));
        }
        (Role::Instance, Some(service)) => check_name("service", service)?,
        (_, Some(_)) => {
            return Err(ApiError::BadRequest(
                "only an instance token is bound to a service".to_owned(),
            ));
        }
        (_, None) => {}
    }
    let token = center
        .create_token(&body.name, body.role, body.service.as_deref())
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "token": token, "name": body.name, "role": body.role })),
    ))
}

pub(crate) async fn metrics(
    State(center): State<Center>,
    caller: Caller,
) -> Result<Response, ApiError> {
    caller.may_read_all()?;
    match &center.config().metrics {
        Some(handle) => Ok(handle.render().into_response()),
        None => Err(ApiError::NotFound(
            "metrics are not exported by this center".to_owned(),
        )),
    }
}
