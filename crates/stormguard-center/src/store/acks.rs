//! Group commit of acknowledgements (see [`Store`]'s docs).
//!
//! Every ACK or NACK goes, with a one-shot channel for its outcome, to one writer task per
//! store. The writer takes the next record, waits for the write turn, and takes every record
//! that arrived meanwhile: one transaction, one commit for the group. A record handed over
//! is written even if its caller goes away (its request dropped), so no caller's departure
//! can strand or lose another's. When a group fails, its records are written again one by
//! one, so a record the database refuses fails alone. The records are written in (service,
//! instance) order: two PostgreSQL replicas writing overlapping groups take row locks in the
//! same order and cannot deadlock.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::{Backend, NewAudit, Store, StoreError, StoreKind, as_i64, lock};

/// The most records one group transaction writes.
const MAX_GROUP: usize = 512;

/// The channel to a store's ACK writer, started by the first acknowledgement (and again if
/// the runtime it ran on has gone).
pub(super) type AckWriter = std::sync::Mutex<Option<mpsc::UnboundedSender<PendingAck>>>;

/// An acknowledgement on its way to the writer, with the channel for its outcome.
#[derive(Debug)]
pub(super) struct PendingAck {
    record: AckRecord,
    done: oneshot::Sender<Result<(), StoreError>>,
}

/// An ACK or NACK and its audit record, owned (it outlives its request).
#[derive(Debug)]
struct AckRecord {
    applied: bool,
    at_ms: i64,
    actor: String,
    action: String,
    service: String,
    version: Option<u64>,
    instance: String,
    detail: String,
}

impl AckRecord {
    fn new(applied: bool, audit: &NewAudit<'_>) -> AckRecord {
        AckRecord {
            applied,
            at_ms: audit.at_ms,
            actor: audit.actor.to_owned(),
            action: audit.action.to_owned(),
            service: audit.service.to_owned(),
            version: audit.version,
            instance: audit.instance.unwrap_or_default().to_owned(),
            detail: audit.detail.to_owned(),
        }
    }

    fn audit(&self) -> NewAudit<'_> {
        NewAudit {
            at_ms: self.at_ms,
            actor: &self.actor,
            action: &self.action,
            service: &self.service,
            version: self.version,
            instance: Some(&self.instance),
            detail: &self.detail,
        }
    }
}

impl Store {
    /// Records an instance's ACK or NACK of a version, with its audit record, committed
    /// with whatever other acknowledgements arrive meanwhile (see the
    /// [module docs](self)). Returns once the record is committed.
    pub(crate) async fn acknowledge(
        &self,
        applied: bool,
        audit: &NewAudit<'_>,
    ) -> Result<(), StoreError> {
        let (done, outcome) = oneshot::channel();
        let pending = PendingAck {
            record: AckRecord::new(applied, audit),
            done,
        };
        {
            let mut writer = lock(&self.ack_writer);
            let unsent = match writer.as_ref() {
                Some(sender) => match sender.send(pending) {
                    Ok(()) => None,
                    // The writer's runtime has gone: start another on this one.
                    Err(mpsc::error::SendError(back)) => Some(back),
                },
                None => Some(pending),
            };
            if let Some(pending) = unsent {
                let sender = self.start_ack_writer();
                // A channel just made, its receiver held by the task: the send cannot fail.
                let _ = sender.send(pending);
                *writer = Some(sender);
            }
        }
        outcome.await.unwrap_or(Err(StoreError::Abandoned))
    }

    fn start_ack_writer(&self) -> mpsc::UnboundedSender<PendingAck> {
        let (sender, mut receiver) = mpsc::unbounded_channel::<PendingAck>();
        // The writer holds the database and the write turn, not the channel's sender: the
        // task ends when the last clone of the store (and its sender) is dropped.
        let writer = Store {
            backend: self.backend.clone(),
            writes: Arc::clone(&self.writes),
            ack_writer: Arc::default(),
        };
        tokio::spawn(async move {
            while let Some(first) = receiver.recv().await {
                let _turn = writer.write_turn().await;
                let mut group = vec![first];
                while group.len() < MAX_GROUP {
                    match receiver.try_recv() {
                        Ok(next) => group.push(next),
                        Err(_) => break,
                    }
                }
                writer.write_group(group).await;
            }
        });
        sender
    }

    /// Writes the group in one transaction, or, if that fails, each record in its own.
    async fn write_group(&self, mut group: Vec<PendingAck>) {
        group.sort_by(|a, b| {
            (&a.record.service, &a.record.instance).cmp(&(&b.record.service, &b.record.instance))
        });
        let records: Vec<&AckRecord> = group.iter().map(|p| &p.record).collect();
        if self.write_acks(&records).await.is_ok() {
            for pending in group {
                let _ = pending.done.send(Ok(()));
            }
            return;
        }
        for pending in group {
            let alone = self.write_acks(&[&pending.record]).await;
            let _ = pending.done.send(alone);
        }
    }

    /// One transaction for these acknowledgements.
    async fn write_acks(&self, records: &[&AckRecord]) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO center_instances (service, instance, labels, version, applied, reason, seen_ms)
            VALUES ($1, $2, '{}', $3, $4, $5, $6)
            ON CONFLICT (service, instance) DO UPDATE
            SET version = $3, applied = $4, reason = $5, seen_ms = $6";
        on_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            for record in records {
                let audit = record.audit();
                sqlx::query(SQL)
                    .bind(audit.service)
                    .bind(audit.instance.unwrap_or_default())
                    .bind(audit.version.map(as_i64))
                    .bind(i64::from(record.applied))
                    .bind((!record.applied).then_some(audit.detail))
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
