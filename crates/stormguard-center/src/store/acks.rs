//! Group commit of acknowledgements (see [`Store`]'s docs): each ACK or NACK joins the
//! pending list, and whichever caller gets the write turn writes the whole list in one
//! transaction.

use std::sync::Arc;

use super::{Backend, NewAudit, Store, StoreError, StoreKind, as_i64, lock};

/// An acknowledgement waiting for its group's commit.
#[derive(Debug)]
pub(super) struct PendingAck {
    applied: bool,
    audit: OwnedAudit,
    done: tokio::sync::oneshot::Sender<Result<(), Arc<StoreError>>>,
}

/// An audit record that outlives its request (one of a group commit).
#[derive(Debug)]
struct OwnedAudit {
    at_ms: i64,
    actor: String,
    action: String,
    service: String,
    version: Option<u64>,
    instance: Option<String>,
    detail: String,
}

impl OwnedAudit {
    fn new(audit: &NewAudit<'_>) -> OwnedAudit {
        OwnedAudit {
            at_ms: audit.at_ms,
            actor: audit.actor.to_owned(),
            action: audit.action.to_owned(),
            service: audit.service.to_owned(),
            version: audit.version,
            instance: audit.instance.map(str::to_owned),
            detail: audit.detail.to_owned(),
        }
    }

    fn borrowed(&self) -> NewAudit<'_> {
        NewAudit {
            at_ms: self.at_ms,
            actor: &self.actor,
            action: &self.action,
            service: &self.service,
            version: self.version,
            instance: self.instance.as_deref(),
            detail: &self.detail,
        }
    }
}

impl Store {
    /// Records an instance's ACK or NACK of a version, with its audit record, committed
    /// with whatever other acknowledgements are pending (see [`Store`]).
    pub(crate) async fn acknowledge(
        &self,
        applied: bool,
        audit: &NewAudit<'_>,
    ) -> Result<(), StoreError> {
        let (done, outcome) = tokio::sync::oneshot::channel();
        lock(&self.acks).push(PendingAck {
            applied,
            audit: OwnedAudit::new(audit),
            done,
        });
        // One group at a time on either database. The first caller to get the turn writes
        // every pending ACK, in a task of its own so that a caller that goes away (its
        // request dropped) cannot leave the others' records unwritten; the later callers
        // find theirs written.
        let turn = Arc::clone(&self.writes).lock_owned().await;
        let group = std::mem::take(&mut *lock(&self.acks));
        if !group.is_empty() {
            let store = self.clone();
            tokio::spawn(async move {
                let written = store.write_acks(&group).await.map_err(Arc::new);
                drop(turn);
                for pending in group {
                    let _ = pending.done.send(written.clone());
                }
            });
        }
        match outcome.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(StoreError::Group(error)),
            // The group's task ended without an answer (the runtime is shutting down).
            Err(_) => Err(StoreError::Group(Arc::new(StoreError::Abandoned))),
        }
    }

    /// One transaction for a group of acknowledgements.
    async fn write_acks(&self, group: &[PendingAck]) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO center_instances (service, instance, labels, version, applied, reason, seen_ms)
            VALUES ($1, $2, '{}', $3, $4, $5, $6)
            ON CONFLICT (service, instance) DO UPDATE
            SET version = $3, applied = $4, reason = $5, seen_ms = $6";
        on_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            for pending in group {
                let audit = pending.audit.borrowed();
                let reason = (!pending.applied).then_some(audit.detail);
                sqlx::query(SQL)
                    .bind(audit.service)
                    .bind(audit.instance.unwrap_or_default())
                    .bind(audit.version.map(as_i64))
                    .bind(i64::from(pending.applied))
                    .bind(reason)
                    .bind(audit.at_ms)
                    .execute(&mut *tx)
                    .await?;
                insert_audit!(audit).execute(&mut *tx).await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }
}
