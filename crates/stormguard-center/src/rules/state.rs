//! Where each rule stands, read back from the audit log: the store is the rule runner's
//! memory.
//!
//! Every firing writes a `rule-fire` record whose detail holds the endpoint and the fields
//! changed with their values before and after ([`Firing`]); every revert writes a
//! `rule-revert` record; a revert that hands a field's value before to another rule writes
//! a `rule-handoff` record holding that rule's firing as it now stands. So the newest of
//! those records by `rule:<name>` says whether the rule is active and what reverting it
//! undoes, for this process, a restarted one, or the rule routes reverting a rule that is
//! edited or deleted, without a second copy kept anywhere else.

use std::time::{Duration, Instant};

use serde::Deserialize;
use stormguard::rules::{FieldEdit, Firing};

use crate::server::{Center, now_ms};
use crate::store::StoreError;

/// The author of what rule `rule` publishes, and the actor of its audit records.
pub(crate) fn actor(rule: &str) -> String {
    format!("rule:{rule}")
}

/// A rule that fired and has not reverted, as its newest record says.
#[derive(Clone, Debug)]
pub(crate) struct Active {
    /// What reverting it undoes.
    pub(crate) firing: Firing,
    /// The version the record went with (the one the firing published, or the one it
    /// found already set).
    pub(crate) version: Option<u64>,
    /// When the rule fired (Unix ms): its `rule-fire` record's time, which a
    /// `rule-handoff` record carries on, so that `min_hold` counts from the firing.
    pub(crate) fired_ms: i64,
    /// The id of its `rule-fire` record (carried on by a `rule-handoff` record too):
    /// firings compare by it, oldest first.
    pub(crate) fired_id: i64,
}

impl Active {
    /// The instant of the record, on the clock of `now` (a record from the future, on a
    /// clock that went back, reads as now).
    pub(crate) fn instant(&self, now: Instant) -> Instant {
        let ago = u64::try_from(now_ms().saturating_sub(self.fired_ms)).unwrap_or(0);
        now.checked_sub(Duration::from_millis(ago)).unwrap_or(now)
    }
}

/// What a `rule-fire` or `rule-handoff` record's detail holds of the firing.
#[derive(Deserialize)]
struct Detail {
    endpoint: String,
    changes: Vec<FieldEdit>,
    /// In a `rule-handoff` record: when the rule fired (a record written before these
    /// were carried has none, and reads as fired at the hand-over).
    #[serde(default)]
    fired_ms: Option<i64>,
    /// In a `rule-handoff` record: the id of the rule's `rule-fire` record.
    #[serde(default)]
    fired_id: Option<i64>,
}

/// The firing of `rule` of `service` if it is active. A record whose detail does not read
/// (written by a version that did not keep the changes) is logged and read as not active:
/// there is nothing to revert it with.
pub(crate) async fn active(
    center: &Center,
    service: &str,
    rule: &str,
) -> Result<Option<Active>, StoreError> {
    let Some(row) = center
        .store()
        .last_rule_change(service, &actor(rule))
        .await?
    else {
        return Ok(None);
    };
    if row.action == "rule-revert" {
        return Ok(None);
    }
    match serde_json::from_str::<Detail>(&row.detail) {
        Ok(detail) => Ok(Some(Active {
            firing: Firing {
                rule: rule.to_owned(),
                endpoint: detail.endpoint,
                edits: detail.changes,
            },
            version: row.version.and_then(|v| u64::try_from(v).ok()),
            fired_ms: detail.fired_ms.unwrap_or(row.at_ms),
            fired_id: detail.fired_id.unwrap_or(row.id),
        })),
        Err(error) => {
            tracing::warn!(%error, service, rule, record = row.id, "stormguard center: a rule's last firing record does not read; it cannot be reverted");
            Ok(None)
        }
    }
}

/// The active firings of `service`'s stored rules other than `rule`, oldest firing first:
/// the rules a revert of `rule` may hand a value to.
pub(crate) async fn others(
    center: &Center,
    service: &str,
    rule: &str,
) -> Result<Vec<Active>, StoreError> {
    let mut found = Vec::new();
    for row in center.store().rules(service).await? {
        if row.name != rule
            && let Some(other) = active(center, service, &row.name).await?
        {
            found.push(other);
        }
    }
    found.sort_by_key(|a| a.fired_id);
    Ok(found)
}
