//! The rows the store reads, as the database holds them (signed integers, JSON as text).

use crate::version::{FieldChange, Version};

/// A row of `center_versions`.
#[derive(Clone, Debug, sqlx::FromRow)]
pub(crate) struct VersionRow {
    pub(crate) service: String,
    pub(crate) version: i64,
    pub(crate) hash: String,
    pub(crate) policy: String,
    pub(crate) author: String,
    pub(crate) message: String,
    pub(crate) diff: String,
    pub(crate) rollback_of: Option<i64>,
    pub(crate) created_ms: i64,
}

impl VersionRow {
    pub(crate) fn version(&self) -> u64 {
        u64::try_from(self.version).unwrap_or(0)
    }
}

impl From<VersionRow> for Version {
    fn from(row: VersionRow) -> Version {
        let diff: Vec<FieldChange> = serde_json::from_str(&row.diff).unwrap_or_default();
        Version {
            version: row.version(),
            service: row.service,
            hash: row.hash,
            policy: row.policy,
            author: row.author,
            message: row.message,
            diff,
            rollback_of: row.rollback_of.and_then(|v| u64::try_from(v).ok()),
            created_ms: row.created_ms,
        }
    }
}

/// A row of `center_services`: which versions the service's instances should run.
#[derive(Clone, Debug, sqlx::FromRow)]
pub(crate) struct ReleaseRow {
    pub(crate) stable: Option<i64>,
    pub(crate) canary: Option<i64>,
    pub(crate) selector: Option<String>,
}

/// A row of `center_instances`.
#[derive(Clone, Debug, sqlx::FromRow)]
pub(crate) struct InstanceRow {
    pub(crate) instance: String,
    pub(crate) labels: String,
    pub(crate) version: Option<i64>,
    pub(crate) applied: Option<i64>,
    pub(crate) reason: Option<String>,
    pub(crate) seen_ms: i64,
}

/// A row of `center_audit`.
#[derive(Clone, Debug, sqlx::FromRow)]
pub(crate) struct AuditRow {
    pub(crate) id: i64,
    pub(crate) at_ms: i64,
    pub(crate) actor: String,
    pub(crate) action: String,
    pub(crate) service: String,
    pub(crate) version: Option<i64>,
    pub(crate) instance: Option<String>,
    pub(crate) detail: String,
}

/// A row of `center_tokens`.
#[derive(Clone, Debug, sqlx::FromRow)]
pub(crate) struct TokenRow {
    pub(crate) hash: String,
    pub(crate) name: String,
    pub(crate) role: String,
    pub(crate) service: Option<String>,
}

/// A row of `center_rules`.
#[derive(Clone, Debug, sqlx::FromRow)]
pub(crate) struct RuleRow {
    pub(crate) name: String,
    pub(crate) rule: String,
    pub(crate) updated_ms: i64,
}
