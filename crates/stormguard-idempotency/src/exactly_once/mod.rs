//! Exactly-once side effects behind the idempotency layer: the payment case.
//!
//! The layer makes a *request* run once per key, within the lease. The business effect should
//! be exactly-once on its own as well, because a lease can be taken over from a holder that
//! was slow rather than dead, and because effects leave the process as messages:
//!
//! - [`insert_if_absent`](sqlite::insert_if_absent) (one per database) runs a plain `INSERT`
//!   inside a savepoint and tells you whether it inserted. A duplicate is recognised by its
//!   unique-violation error, never by an affected-row count: sqlx connects to MySQL with
//!   `CLIENT_FOUND_ROWS`, so `INSERT … ON DUPLICATE KEY UPDATE` reports 1 row for a duplicate
//!   exactly as for a new row. The savepoint keeps the caller's transaction usable after the
//!   duplicate (PostgreSQL would otherwise abort it).
//! - The **transactional outbox**: [`enqueue`](sqlite::enqueue) writes the outgoing message
//!   in the same transaction as the business row, so both or neither exist. A
//!   [`Relay`](sqlite::Relay) publishes pending messages in id order, at least once, each
//!   with the stable `event_id` it got at enqueue; a crash between publishing and marking
//!   means it is published again with the same id. The relay never makes the application's
//!   own writes wait or fail: on PostgreSQL and MySQL/MariaDB it locks the rows of its batch
//!   (`FOR UPDATE SKIP LOCKED`, so several relays share the work) in a READ COMMITTED
//!   transaction — under InnoDB's default REPEATABLE READ that locking read would also lock the
//!   index *gaps* and block every new outbox row until the pass ended; on SQLite, which has no
//!   row locks, it reads the batch and marks each message in its own short write, because one
//!   deferred transaction that reads and later writes fails with `SQLITE_BUSY_SNAPSHOT` as
//!   soon as anything else wrote in between.
//! - **Consumers deduplicate** with [`mark_processed`](sqlite::mark_processed) in the
//!   transaction that applies the event: `false` means the event was already applied.
//!
//! - **Real brokers** behind the relay ([`Publisher`] sinks that count a message published
//!   only once the broker took it): RabbitMQ with publisher confirms (`rabbitmq` feature,
//!   [`rabbitmq::RabbitMqPublisher`]) and NATS JetStream (`nats` feature,
//!   [`nats::JetStreamPublisher`]); both carry the event id for consumers to deduplicate by.
//!
//! The tables come with the stores' `migrate()` (files under `migrations/`).

use std::future::Future;

use axum::BoxError;

#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;

/// One outgoing message of the outbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxMessage {
    /// The stable id consumers deduplicate by; the same on every publication.
    pub event_id: String,
    /// Where it goes (a topic, a queue, a webhook name).
    pub topic: String,
    /// The message body.
    pub payload: Vec<u8>,
}

impl OutboxMessage {
    /// A message with a fresh random event id (32 hex digits).
    pub fn new(topic: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        let id: u128 = rand::random();
        OutboxMessage {
            event_id: format!("{id:032x}"),
            topic: topic.into(),
            payload: payload.into(),
        }
    }

    /// A message with a chosen event id (for example derived from the business key, so that
    /// even enqueueing twice yields one event).
    pub fn with_event_id(
        event_id: impl Into<String>,
        topic: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        OutboxMessage {
            event_id: event_id.into(),
            topic: topic.into(),
            payload: payload.into(),
        }
    }
}

/// Sends outbox messages to the outside world (a broker, a webhook).
pub trait Publisher: Send + Sync {
    /// Publishes one message. An error leaves it pending; it is tried again on a later pass.
    fn publish(&self, message: &OutboxMessage)
    -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// What one relay pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Messages published and marked.
    pub published: u64,
    /// The publisher's error that stopped the pass, if any (the message stays pending, and
    /// so do the ones after it, to keep order).
    pub failed: Option<String>,
}

/// An outbox relay failure in the database (publisher failures are in [`RelayReport`]).
#[derive(Debug, thiserror::Error)]
#[error("outbox relay database error: {0}")]
pub struct RelayError(#[from] pub sqlx::Error);

macro_rules! exactly_once_for {
    (
        module: $module:ident,
        feature: $feature:literal,
        db: $Db:ty,
        conn: $Conn:ty,
        pool: $Pool:ty,
        enqueue: $enqueue:literal,
        processed: $processed:literal,
        pending: $pending:literal,
        published: $published:literal,
        attempt: $attempt:literal,
        locking: $locking:literal,
        isolation: $isolation:literal $(,)?
    ) => {
        #[doc = concat!("The exactly-once helpers for ", $feature, ".")]
        #[cfg(feature = $feature)]
        pub mod $module {
            use sqlx::{Connection as _, Row as _};

            use super::{OutboxMessage, Publisher, RelayError, RelayReport};
            use crate::store::Millis;

            /// Runs `insert` (a plain `INSERT` of one row) in a savepoint: `Ok(true)` if it
            /// inserted, `Ok(false)` if a unique key already held the row. Any other error is
            /// returned, and the caller's transaction stays usable either way.
            pub async fn insert_if_absent<'q>(
                conn: &mut $Conn,
                insert: sqlx::query::Query<'q, $Db, <$Db as sqlx::Database>::Arguments<'q>>,
            ) -> Result<bool, sqlx::Error> {
                let mut sp = conn.begin().await?;
                match insert.execute(&mut *sp).await {
                    Ok(_) => {
                        sp.commit().await?;
                        Ok(true)
                    }
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                        sp.rollback().await?;
                        Ok(false)
                    }
                    Err(e) => Err(e),
                }
            }

            /// Writes `message` to the outbox on `conn`: call it inside the transaction that
            /// writes the business row.
            pub async fn enqueue(
                conn: &mut $Conn,
                message: &OutboxMessage,
                now: Millis,
            ) -> Result<(), sqlx::Error> {
                sqlx::query::<$Db>($enqueue)
                    .bind(&message.event_id)
                    .bind(&message.topic)
                    .bind(&message.payload)
                    .bind(now)
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            }

            /// Records that `consumer` processed `event_id`: `true` the first time, `false`
            /// for a duplicate delivery. Call it inside the transaction that applies the
            /// event, and skip the event on `false`.
            pub async fn mark_processed(
                conn: &mut $Conn,
                consumer: &str,
                event_id: &str,
                now: Millis,
            ) -> Result<bool, sqlx::Error> {
                insert_if_absent(
                    conn,
                    sqlx::query::<$Db>($processed)
                        .bind(consumer.to_owned())
                        .bind(event_id.to_owned())
                        .bind(now),
                )
                .await
            }

            /// Publishes pending outbox messages, at least once, in id order.
            #[derive(Clone, Debug)]
            pub struct Relay {
                pool: $Pool,
                batch: u32,
            }

            impl Relay {
                /// A relay over `pool`, 100 messages per pass.
                pub fn new(pool: $Pool) -> Self {
                    Relay { pool, batch: 100 }
                }

                /// Messages per pass (at least 1).
                pub fn with_batch(mut self, batch: u32) -> Self {
                    self.batch = batch.max(1);
                    self
                }

                /// One pass: takes up to a batch of pending messages, publishes them in
                /// order, and marks each published one; stops at the first publisher error.
                /// Where the database has row locks the batch stays locked for the pass
                /// (other relays skip it); see the [module docs](super) for why the
                /// application's writes never wait for a pass.
                pub async fn run_once(
                    &self,
                    publisher: &impl Publisher,
                    now: Millis,
                ) -> Result<RelayReport, RelayError> {
                    if !$locking {
                        return self.pass(None, publisher, now).await;
                    }
                    let mut conn = self.pool.acquire().await?;
                    if !$isolation.is_empty() {
                        // Applies to the next transaction on this connection only.
                        sqlx::query::<$Db>($isolation).execute(&mut *conn).await?;
                    }
                    let mut tx = conn.begin().await?;
                    let report = self.pass(Some(&mut tx), publisher, now).await?;
                    tx.commit().await?;
                    Ok(report)
                }

                /// One pass with every statement in `tx`, or (without one) each on a
                /// connection taken from the pool for that statement alone: then a pass never
                /// holds a connection, or SQLite's write lock, while it publishes.
                async fn pass(
                    &self,
                    mut tx: Option<&mut $Conn>,
                    publisher: &impl Publisher,
                    now: Millis,
                ) -> Result<RelayReport, RelayError> {
                    let pending = sqlx::query::<$Db>($pending).bind(i64::from(self.batch));
                    let rows = match tx.as_deref_mut() {
                        Some(conn) => pending.fetch_all(conn).await?,
                        None => pending.fetch_all(&mut *self.pool.acquire().await?).await?,
                    };
                    let mut report = RelayReport::default();
                    for row in rows {
                        let id: i64 = row.try_get(0)?;
                        let message = OutboxMessage {
                            event_id: row.try_get(1)?,
                            topic: row.try_get(2)?,
                            payload: row.try_get(3)?,
                        };
                        let published = publisher.publish(&message).await;
                        let mark = match &published {
                            Ok(()) => sqlx::query::<$Db>($published).bind(now).bind(id),
                            Err(_) => sqlx::query::<$Db>($attempt).bind(id),
                        };
                        match tx.as_deref_mut() {
                            Some(conn) => mark.execute(conn).await?,
                            None => mark.execute(&mut *self.pool.acquire().await?).await?,
                        };
                        match published {
                            Ok(()) => report.published += 1,
                            Err(e) => {
                                tracing::warn!(error = %e, event_id = message.event_id, "outbox publish failed; will retry");
                                report.failed = Some(e.to_string());
                                break;
                            }
                        }
                    }
                    Ok(report)
                }
            }
        }
    };
}

exactly_once_for! {
    module: sqlite,
    feature: "sqlite",
    db: sqlx::Sqlite,
    conn: sqlx::SqliteConnection,
    pool: sqlx::SqlitePool,
    enqueue: "INSERT INTO stormguard_outbox (event_id, topic, payload, created_at) VALUES (?, ?, ?, ?)",
    processed: "INSERT INTO stormguard_inbox (consumer, event_id, processed_at) VALUES (?, ?, ?)",
    // SQLite has one writer at a time and no row locks: two relays may both publish a
    // message, which at-least-once allows and consumers deduplicate.
    pending: "SELECT id, event_id, topic, payload FROM stormguard_outbox
        WHERE published_at IS NULL ORDER BY id LIMIT ?",
    published: "UPDATE stormguard_outbox SET published_at = ?, attempts = attempts + 1 WHERE id = ?",
    attempt: "UPDATE stormguard_outbox SET attempts = attempts + 1 WHERE id = ?",
    locking: false,
    isolation: "",
}

exactly_once_for! {
    module: postgres,
    feature: "postgres",
    db: sqlx::Postgres,
    conn: sqlx::PgConnection,
    pool: sqlx::PgPool,
    enqueue: "INSERT INTO stormguard_outbox (event_id, topic, payload, created_at) VALUES ($1, $2, $3, $4)",
    processed: "INSERT INTO stormguard_inbox (consumer, event_id, processed_at) VALUES ($1, $2, $3)",
    pending: "SELECT id, event_id, topic, payload FROM stormguard_outbox
        WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    published: "UPDATE stormguard_outbox SET published_at = $1, attempts = attempts + 1 WHERE id = $2",
    attempt: "UPDATE stormguard_outbox SET attempts = attempts + 1 WHERE id = $1",
    locking: true,
    // PostgreSQL's default; its locking reads never lock gaps.
    isolation: "",
}

exactly_once_for! {
    module: mysql,
    feature: "mysql",
    db: sqlx::MySql,
    conn: sqlx::MySqlConnection,
    pool: sqlx::MySqlPool,
    enqueue: "INSERT INTO stormguard_outbox (event_id, topic, payload, created_at) VALUES (?, ?, ?, ?)",
    processed: "INSERT INTO stormguard_inbox (consumer, event_id, processed_at) VALUES (?, ?, ?)",
    pending: "SELECT id, CAST(event_id AS CHAR), CAST(topic AS CHAR), payload FROM stormguard_outbox
        WHERE published_at IS NULL ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
    published: "UPDATE stormguard_outbox SET published_at = ?, attempts = attempts + 1 WHERE id = ?",
    attempt: "UPDATE stormguard_outbox SET attempts = attempts + 1 WHERE id = ?",
    locking: true,
    isolation: "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
}
