//! The rules of each service, and audit records that go with no version.
//!
//! A rule is stored as the JSON the API accepted, one row per rule; a change of a rule and
//! its audit record are written in one transaction, as a publish is with its own.

use super::{AuditRow, RuleRow};
use super::{Backend, NewAudit, Store, StoreError, StoreKind, as_i64};

impl Store {
    /// The rules of `service`, by name.
    pub(crate) async fn rules(&self, service: &str) -> Result<Vec<RuleRow>, StoreError> {
        const SQL: &str =
            "SELECT name, rule, updated_ms FROM center_rules WHERE service = $1 ORDER BY name";
        Ok(on_pool!(self, |pool| sqlx::query_as(SQL)
            .bind(service)
            .fetch_all(pool)
            .await?))
    }

    /// The services with at least one rule, by name.
    pub(crate) async fn rule_services(&self) -> Result<Vec<String>, StoreError> {
        const SQL: &str = "SELECT DISTINCT service FROM center_rules ORDER BY service";
        let rows: Vec<(String,)> =
            on_pool!(self, |pool| sqlx::query_as(SQL).fetch_all(pool).await?);
        Ok(rows.into_iter().map(|(service,)| service).collect())
    }

    /// Writes (or replaces) one rule of the audit's service, with the audit record.
    pub(crate) async fn put_rule(
        &self,
        name: &str,
        rule: &str,
        audit: &NewAudit<'_>,
    ) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO center_rules (service, name, rule, updated_ms)
            VALUES ($1, $2, $3, $4)
            ON CONFLICT (service, name) DO UPDATE SET rule = $3, updated_ms = $4";
        let _turn = self.write_turn().await;
        on_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            sqlx::query(SQL)
                .bind(audit.service)
                .bind(name)
                .bind(rule)
                .bind(audit.at_ms)
                .execute(&mut *tx)
                .await?;
            insert_audit!(audit).execute(&mut *tx).await?;
            tx.commit().await?;
        });
        Ok(())
    }

    /// Deletes one rule of the audit's service, with the audit record; `false` when there
    /// was no such rule (and no record is written).
    pub(crate) async fn delete_rule(
        &self,
        name: &str,
        audit: &NewAudit<'_>,
    ) -> Result<bool, StoreError> {
        const SQL: &str = "DELETE FROM center_rules WHERE service = $1 AND name = $2";
        let _turn = self.write_turn().await;
        let deleted = on_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            let deleted = sqlx::query(SQL)
                .bind(audit.service)
                .bind(name)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if deleted > 0 {
                insert_audit!(audit).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            deleted
        });
        Ok(deleted > 0)
    }

    /// Writes audit records that go with no version (a dry-run firing, a revert with
    /// nothing left to publish and the `rule-handoff` records it made) in one transaction:
    /// all of them or none.
    pub(crate) async fn insert_audits(&self, audits: &[NewAudit<'_>]) -> Result<(), StoreError> {
        let _turn = self.write_turn().await;
        on_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            for audit in audits {
                insert_audit!(audit).execute(&mut *tx).await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// The audit records of `service` whose action starts with `prefix` (`rule-` for the
    /// firing history of its rules), newest first, at most `limit`: read by their own query
    /// so that a fleet's ACK records do not push them out of a page.
    pub(crate) async fn audit_actions(
        &self,
        service: &str,
        prefix: &str,
        limit: u32,
    ) -> Result<Vec<AuditRow>, StoreError> {
        const SQL: &str = "SELECT id, at_ms, actor, action, service, version, instance, detail
            FROM center_audit WHERE service = $1 AND action LIKE $2 ORDER BY id DESC LIMIT $3";
        Ok(on_pool!(self, |pool| sqlx::query_as(SQL)
            .bind(service)
            .bind(format!("{prefix}%"))
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?))
    }

    /// The newest record of `service` by `actor` that says where a rule stands: a
    /// `rule-fire`, `rule-revert` or `rule-handoff` (read on its own, not from a page of
    /// [`Store::audit_actions`], so that no number of `rule-failed` or ACK records pushes
    /// it out).
    pub(crate) async fn last_rule_change(
        &self,
        service: &str,
        actor: &str,
    ) -> Result<Option<AuditRow>, StoreError> {
        const SQL: &str = "SELECT id, at_ms, actor, action, service, version, instance, detail
            FROM center_audit WHERE service = $1 AND actor = $2
            AND action IN ('rule-fire', 'rule-revert', 'rule-handoff')
            ORDER BY id DESC LIMIT 1";
        Ok(on_pool!(self, |pool| sqlx::query_as(SQL)
            .bind(service)
            .bind(actor)
            .fetch_optional(pool)
            .await?))
    }

    /// Every service that has a version or a rule, by name.
    pub(crate) async fn services(&self) -> Result<Vec<String>, StoreError> {
        const SQL: &str = "SELECT service FROM center_services
            UNION SELECT service FROM center_rules ORDER BY 1";
        let rows: Vec<(String,)> =
            on_pool!(self, |pool| sqlx::query_as(SQL).fetch_all(pool).await?);
        Ok(rows.into_iter().map(|(service,)| service).collect())
    }
}
