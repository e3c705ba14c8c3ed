//! The database: SQLite (embedded, the default), PostgreSQL or MariaDB/MySQL behind one type.
//!
//! # Exactly once
//!
//! A payment is one `INSERT` keyed by `out_trade_no` (the primary key), run through
//! stormguard-idempotency's `insert_if_absent`: a duplicate is recognised by the
//! unique-violation error, never by an affected-row count (MariaDB reports 1 row for an
//! upsert of a duplicate). Only when the row is new does the same transaction enqueue the
//! `order.paid` message in the transactional outbox, so a payment and its event exist together
//! or not at all — a crash between them is impossible.
//!
//! # Three databases, one code path
//!
//! [`Store`] holds an enum over the three sqlx pools and runs each operation through one macro
//! (`on_pool!`) that expands the same body once per database, with that database's
//! exactly-once module (`exactly_once::sqlite`, `::postgres`, `::mysql`) in scope. The SQL is
//! written once with `?` placeholders and rewritten to `$n` for PostgreSQL at start-up; only
//! the table definitions differ per database.
//!
//! # The broker table
//!
//! The relay publishes to a *broker*: by default a queue table (`payment_broker`) in the same
//! database, which an in-process consumer drains. The relay of stormguard-idempotency never
//! holds SQLite's write lock while it publishes, and takes no gap locks on MariaDB, so
//! publishing into the same database neither fails nor waits.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use stormguard_idempotency::exactly_once::{OutboxMessage, Publisher, RelayError, RelayReport};
use stormguard_idempotency::store::Millis;
use stormguard_idempotency::store::mysql::MySqlStore;
use stormguard_idempotency::store::postgres::PostgresStore;
use stormguard_idempotency::store::sqlite::SqliteStore;

use crate::broker::BrokerCounts;
use crate::callback::{ORDER_PAID, PaymentCallback};

/// The consumer name under which the notifier records processed events.
pub const CONSUMER: &str = "payment-notifier";

mod schema;
mod url;

use schema::{MYSQL_TABLES, POSTGRES_TABLES, SQLITE_TABLES};
pub use url::{BadDatabaseUrl, DatabaseUrl};

/// A database failure, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Connecting or running a statement failed.
    #[error("database: {what}: {source}")]
    Sql {
        /// What was being done.
        what: &'static str,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// Creating the idempotency crate's outbox/inbox tables failed.
    #[error("database: migrating the outbox tables: {0}")]
    Migrate(#[from] stormguard_idempotency::StoreError),
}

fn sql_err(what: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Sql { what, source }
}

/// One of the three pools.
#[derive(Clone, Debug)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
    MySql(MySqlPool),
}

/// Expands `$body` once per database, with `$p` the pool, `$eo` that database's
/// `exactly_once` module and `$Db` its sqlx database type.
macro_rules! on_pool {
    ($pool:expr, |$p:ident, $eo:ident, $Db:ident| $body:expr) => {
        match $pool {
            Pool::Sqlite($p) => {
                #[allow(unused_imports)]
                use stormguard_idempotency::exactly_once::sqlite as $eo;
                #[allow(dead_code)]
                type $Db = sqlx::Sqlite;
                $body
            }
            Pool::Postgres($p) => {
                #[allow(unused_imports)]
                use stormguard_idempotency::exactly_once::postgres as $eo;
                #[allow(dead_code)]
                type $Db = sqlx::Postgres;
                $body
            }
            Pool::MySql($p) => {
                #[allow(unused_imports)]
                use stormguard_idempotency::exactly_once::mysql as $eo;
                #[allow(dead_code)]
                type $Db = sqlx::MySql;
                $body
            }
        }
    };
}

/// The statements, with placeholders in the pool's syntax.
#[derive(Debug)]
struct Sql {
    insert_order: String,
    publish: String,
    unacked: String,
    ack: String,
    apply: String,
    count_orders: String,
    find_order: String,
    count_outbox: String,
    count_broker: String,
    count_applied: String,
    reset_business: String,
    reset_broker: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dialect {
    Sqlite,
    Postgres,
    MySql,
}

impl Sql {
    fn new(dialect: Dialect) -> Sql {
        let q = |s: &str| match dialect {
            Dialect::Postgres => dollar_placeholders(s),
            Dialect::Sqlite | Dialect::MySql => s.to_owned(),
        };
        // MariaDB reports a column with a binary collation (ascii_bin) as binary, which sqlx
        // will not decode as a String; CAST AS CHAR gives it a character set.
        let event_id = match dialect {
            Dialect::MySql => "CAST(event_id AS CHAR)",
            Dialect::Sqlite | Dialect::Postgres => "event_id",
        };
        Sql {
            insert_order: q(
                "INSERT INTO payment_orders (out_trade_no, trade_no, amount, status, paid_at) VALUES (?, ?, ?, ?, ?)",
            ),
            publish: q(
                "INSERT INTO payment_broker (event_id, topic, payload, published_at) VALUES (?, ?, ?, ?)",
            ),
            unacked: q(&format!(
                "SELECT id, {event_id}, payload FROM payment_broker WHERE acked_at IS NULL AND topic = ? ORDER BY id LIMIT ?"
            )),
            ack: q("UPDATE payment_broker SET acked_at = ? WHERE id = ?"),
            apply: q(
                "INSERT INTO payment_notifications (event_id, out_trade_no, applied_at) VALUES (?, ?, ?)",
            ),
            count_orders: q("SELECT COUNT(*) FROM payment_orders WHERE out_trade_no LIKE ?"),
            find_order: q("SELECT COUNT(*) FROM payment_orders WHERE out_trade_no = ?"),
            count_outbox: q(
                "SELECT COUNT(*), COUNT(published_at) FROM stormguard_outbox WHERE event_id LIKE ?",
            ),
            count_broker: q(
                "SELECT COUNT(*), COUNT(DISTINCT event_id), COUNT(acked_at) FROM payment_broker WHERE event_id LIKE ?",
            ),
            count_applied: q(
                "SELECT COUNT(*), COUNT(DISTINCT event_id) FROM payment_notifications WHERE event_id LIKE ?",
            ),
            reset_business: format!(
                "DELETE FROM payment_orders; DELETE FROM payment_notifications; \
                 DELETE FROM stormguard_outbox WHERE topic = '{ORDER_PAID}'; \
                 DELETE FROM stormguard_inbox WHERE consumer = '{CONSUMER}';"
            ),
            reset_broker: "DELETE FROM payment_broker;".to_owned(),
        }
    }
}

/// `?` → `$1, $2, …` (no statement here has a `?` inside a literal).
fn dollar_placeholders(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    let mut n = 0;
    for c in s.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether a callback made a new payment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// The row is new; its `order.paid` message is in the outbox.
    New,
    /// The order was already paid; nothing was written.
    Duplicate,
}

/// An `order.paid` message as the consumer receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The stable id it is deduplicated by.
    pub event_id: String,
    /// The callback that paid the order (JSON).
    pub payload: Vec<u8>,
}

/// What one consumer pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Consumed {
    /// Events received from the broker.
    pub received: u64,
    /// Events applied for the first time.
    pub applied: u64,
    /// Events skipped because the inbox already held their id.
    pub duplicates: u64,
}

/// Row counts for one run's orders (those whose number starts with a prefix); the broker's
/// are [`BrokerCounts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Payment rows.
    pub orders: i64,
    /// Outbox messages.
    pub outbox: i64,
    /// Outbox messages marked published.
    pub outbox_published: i64,
    /// Notifications the consumer applied (one per applied event).
    pub applied: i64,
    /// Distinct event ids among them.
    pub applied_distinct: i64,
}

/// Pool sizes and timeouts.
#[derive(Clone, Copy, Debug)]
pub struct StoreOptions {
    /// Longest wait for a pooled connection (the policy file's database `connect`).
    pub acquire_timeout: Duration,
    /// Connections per pool for PostgreSQL and MariaDB.
    pub max_connections: u32,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            acquire_timeout: Duration::from_secs(1),
            max_connections: 16,
        }
    }
}

/// The payment database.
#[derive(Clone, Debug)]
pub struct Store {
    pool: Pool,
    sql: Arc<Sql>,
    url: DatabaseUrl,
}

impl Store {
    /// Connects and creates the tables (the outbox and inbox through the idempotency crate's
    /// `migrate()`, the demo's own tables here).
    pub async fn connect(url: &DatabaseUrl, options: StoreOptions) -> Result<Store, StoreError> {
        let store = match url {
            DatabaseUrl::Sqlite(path) => {
                let pool = sqlite_pool(path, options).await?;
                SqliteStore::from_pool(pool.clone()).migrate().await?;
                sqlx::raw_sql(SQLITE_TABLES)
                    .execute(&pool)
                    .await
                    .map_err(sql_err("creating tables"))?;
                Store {
                    pool: Pool::Sqlite(pool),
                    sql: Arc::new(Sql::new(Dialect::Sqlite)),
                    url: url.clone(),
                }
            }
            DatabaseUrl::Postgres(u) => {
                let connect = PgConnectOptions::from_str(u).map_err(sql_err("parsing the URL"))?;
                let pool = PgPoolOptions::new()
                    .max_connections(options.max_connections)
                    .acquire_timeout(options.acquire_timeout)
                    .connect_with(connect)
                    .await
                    .map_err(sql_err("connecting to PostgreSQL"))?;
                PostgresStore::from_pool(pool.clone()).migrate().await?;
                sqlx::raw_sql(POSTGRES_TABLES)
                    .execute(&pool)
                    .await
                    .map_err(sql_err("creating tables"))?;
                Store {
                    pool: Pool::Postgres(pool),
                    sql: Arc::new(Sql::new(Dialect::Postgres)),
                    url: url.clone(),
                }
            }
            DatabaseUrl::MySql(u) => {
                let connect =
                    MySqlConnectOptions::from_str(u).map_err(sql_err("parsing the URL"))?;
                let pool = MySqlPoolOptions::new()
                    .max_connections(options.max_connections)
                    .acquire_timeout(options.acquire_timeout)
                    .connect_with(connect)
                    .await
                    .map_err(sql_err("connecting to MariaDB/MySQL"))?;
                MySqlStore::from_pool(pool.clone()).migrate().await?;
                sqlx::raw_sql(MYSQL_TABLES)
                    .execute(&pool)
                    .await
                    .map_err(sql_err("creating tables"))?;
                Store {
                    pool: Pool::MySql(pool),
                    sql: Arc::new(Sql::new(Dialect::MySql)),
                    url: url.clone(),
                }
            }
        };
        Ok(store)
    }

    /// Where this store connects.
    pub fn url(&self) -> &DatabaseUrl {
        &self.url
    }

    /// Records a paid order exactly once: the payment row and, only if it is new, the
    /// `order.paid` message, in one transaction.
    pub async fn record_payment(
        &self,
        cb: &PaymentCallback,
        now: Millis,
    ) -> Result<Recorded, sqlx::Error> {
        let message = OutboxMessage::with_event_id(cb.event_id(), ORDER_PAID, cb.to_json());
        on_pool!(&self.pool, |p, eo, Db| {
            let mut tx = p.begin().await?;
            let insert = sqlx::query::<Db>(&self.sql.insert_order)
                .bind(cb.out_trade_no.as_str())
                .bind(cb.trade_no.as_str())
                .bind(cb.amount_i64())
                .bind("PAID")
                .bind(now);
            let new = eo::insert_if_absent(&mut tx, insert).await?;
            if new {
                eo::enqueue(&mut tx, &message, now).await?;
            }
            tx.commit().await?;
            Ok(if new {
                Recorded::New
            } else {
                Recorded::Duplicate
            })
        })
    }

    /// Whether `out_trade_no` is already recorded as paid: a plain read, no lock, so a
    /// duplicate of a paid order is answered without calling anything else.
    pub async fn is_paid(&self, out_trade_no: &str) -> Result<bool, sqlx::Error> {
        let found: (i64,) = on_pool!(&self.pool, |p, eo, Db| {
            sqlx::query_as::<Db, (i64,)>(&self.sql.find_order)
                .bind(out_trade_no)
                .fetch_one(p)
                .await
        })?;
        Ok(found.0 > 0)
    }

    /// One outbox relay pass (the idempotency crate's `Relay`), publishing with `publisher`.
    pub async fn relay_once(
        &self,
        publisher: &impl Publisher,
        now: Millis,
    ) -> Result<RelayReport, RelayError> {
        on_pool!(&self.pool, |p, eo, Db| {
            eo::Relay::new(p.clone())
                .with_batch(100)
                .run_once(publisher, now)
                .await
        })
    }

    /// Appends `message` to the broker table (what the relay's publisher does).
    pub async fn publish(&self, message: &OutboxMessage, now: Millis) -> Result<(), sqlx::Error> {
        on_pool!(&self.pool, |p, eo, Db| {
            sqlx::query::<Db>(&self.sql.publish)
                .bind(message.event_id.as_str())
                .bind(message.topic.as_str())
                .bind(message.payload.as_slice())
                .bind(now)
                .execute(p)
                .await
                .map(|_| ())
        })
    }

    /// Up to `batch` unacknowledged `order.paid` messages from the broker table, oldest first,
    /// with their row ids (to acknowledge).
    pub async fn receive(&self, batch: i64) -> Result<Vec<(i64, Event)>, sqlx::Error> {
        let rows: Vec<(i64, String, Vec<u8>)> = on_pool!(&self.pool, |p, eo, Db| {
            sqlx::query_as::<Db, (i64, String, Vec<u8>)>(&self.sql.unacked)
                .bind(ORDER_PAID)
                .bind(batch)
                .fetch_all(p)
                .await
        })?;
        Ok(rows
            .into_iter()
            .map(|(id, event_id, payload)| (id, Event { event_id, payload }))
            .collect())
    }

    /// Acknowledges broker-table messages by row id.
    pub async fn acknowledge(&self, ids: &[i64], now: Millis) -> Result<(), sqlx::Error> {
        if ids.is_empty() {
            return Ok(());
        }
        on_pool!(&self.pool, |p, eo, Db| {
            let mut tx = p.begin().await?;
            for id in ids {
                sqlx::query::<Db>(&self.sql.ack)
                    .bind(now)
                    .bind(*id)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        })
    }

    /// Applies received events exactly once: in one transaction, `mark_processed` for each,
    /// and the event's effect (a notification row) only the first time. Acknowledge them
    /// after this returns; a crash in between means they are received again and skipped.
    pub async fn apply(&self, events: &[Event], now: Millis) -> Result<Consumed, sqlx::Error> {
        let mut done = Consumed {
            received: events.len() as u64,
            ..Consumed::default()
        };
        if events.is_empty() {
            return Ok(done);
        }
        on_pool!(&self.pool, |p, eo, Db| {
            let mut tx = p.begin().await?;
            for event in events {
                if eo::mark_processed(&mut tx, CONSUMER, &event.event_id, now).await? {
                    // The effect of the event: here, the customer's "order paid"
                    // notification, recorded as a row.
                    let order = PaymentCallback::parse(&event.payload)
                        .map(|cb| cb.out_trade_no)
                        .unwrap_or_default();
                    sqlx::query::<Db>(&self.sql.apply)
                        .bind(event.event_id.as_str())
                        .bind(order)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                    done.applied += 1;
                } else {
                    done.duplicates += 1;
                }
            }
            tx.commit().await
        })?;
        Ok(done)
    }

    /// Counts the rows of the orders whose `out_trade_no` starts with `prefix` (letters,
    /// digits, `-` and `.` only, so it needs no escaping in `LIKE`).
    pub async fn counts(&self, prefix: &str) -> Result<Counts, StoreError> {
        let orders_like = format!("{prefix}%");
        let events_like = format!("{ORDER_PAID}/{prefix}%");
        let orders: (i64,) = on_pool!(&self.pool, |p, eo, Db| {
            sqlx::query_as::<Db, (i64,)>(&self.sql.count_orders)
                .bind(orders_like.as_str())
                .fetch_one(p)
                .await
        })
        .map_err(sql_err("counting orders"))?;
        let outbox: (i64, i64) = on_pool!(&self.pool, |p, eo, Db| {
            sqlx::query_as::<Db, (i64, i64)>(&self.sql.count_outbox)
                .bind(events_like.as_str())
                .fetch_one(p)
                .await
        })
        .map_err(sql_err("counting the outbox"))?;
        let applied: (i64, i64) = on_pool!(&self.pool, |p, eo, Db| {
            sqlx::query_as::<Db, (i64, i64)>(&self.sql.count_applied)
                .bind(events_like.as_str())
                .fetch_one(p)
                .await
        })
        .map_err(sql_err("counting notifications"))?;
        Ok(Counts {
            orders: orders.0,
            outbox: outbox.0,
            outbox_published: outbox.1,
            applied: applied.0,
            applied_distinct: applied.1,
        })
    }

    /// The broker table's messages for the orders whose number starts with `prefix`.
    pub async fn broker_counts(&self, prefix: &str) -> Result<BrokerCounts, StoreError> {
        let events_like = format!("{ORDER_PAID}/{prefix}%");
        let (messages, distinct, acked): (i64, i64, i64) = on_pool!(&self.pool, |p, eo, Db| {
            sqlx::query_as::<Db, (i64, i64, i64)>(&self.sql.count_broker)
                .bind(events_like.as_str())
                .fetch_one(p)
                .await
        })
        .map_err(sql_err("counting the broker"))?;
        Ok(BrokerCounts {
            messages,
            distinct,
            acked,
        })
    }

    /// Deletes every row of the demo's tables (and its outbox and inbox entries): a fresh
    /// start on a shared server. The broker table is [`reset_broker`](Self::reset_broker).
    pub async fn reset(&self) -> Result<(), StoreError> {
        on_pool!(&self.pool, |p, eo, Db| {
            sqlx::raw_sql(&self.sql.reset_business)
                .execute(p)
                .await
                .map(|_| ())
        })
        .map_err(sql_err("resetting tables"))
    }

    /// Deletes every message of the broker table.
    pub async fn reset_broker(&self) -> Result<(), StoreError> {
        on_pool!(&self.pool, |p, eo, Db| {
            sqlx::raw_sql(&self.sql.reset_broker)
                .execute(p)
                .await
                .map(|_| ())
        })
        .map_err(sql_err("resetting the broker"))
    }

    /// Closes the pool.
    pub async fn close(&self) {
        on_pool!(&self.pool, |p, eo, Db| p.close().await);
    }
}

async fn sqlite_pool(path: &Path, options: StoreOptions) -> Result<SqlitePool, StoreError> {
    let connect = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5));
    SqlitePoolOptions::new()
        .max_connections(4)
        .acquire_timeout(options.acquire_timeout.max(Duration::from_secs(1)))
        .connect_with(connect)
        .await
        .map_err(sql_err("opening SQLite"))
}

/// What a database error means for retrying (the database policy allows no retry by
/// default, so this matters only if the policy file is changed): pool exhaustion and
/// deadlocks are retryable — the transaction rolled back, and `insert_if_absent` makes a
/// repeat harmless — a lost connection is in doubt, anything else deterministic.
pub fn classify_db_error(e: &sqlx::Error) -> stormguard::classify::Outcome {
    use stormguard::classify::Outcome;
    match e {
        sqlx::Error::PoolTimedOut => Outcome::Retryable,
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => Outcome::InDoubt,
        sqlx::Error::Database(db)
            if matches!(db.code().as_deref(), Some("40001" | "40P01" | "1213")) =>
        {
            Outcome::Retryable
        }
        _ => Outcome::NeverRetry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_parse_by_scheme() {
        assert_eq!(
            "sqlite:pay.db".parse(),
            Ok(DatabaseUrl::Sqlite("pay.db".into()))
        );
        assert_eq!(
            "sqlite:///tmp/p.db".parse(),
            Ok(DatabaseUrl::Sqlite("/tmp/p.db".into()))
        );
        assert_eq!(
            "postgres://postgres@127.0.0.1:5432/test"
                .parse::<DatabaseUrl>()
                .map(|u| u.kind()),
            Ok("postgres")
        );
        assert_eq!(
            "mariadb://root@127.0.0.1/test".parse(),
            Ok(DatabaseUrl::MySql("mysql://root@127.0.0.1/test".into()))
        );
        for bad in ["", "sqlite:", "redis://x", "pay.db", "http://db"] {
            assert!(bad.parse::<DatabaseUrl>().is_err(), "{bad}");
        }
        let url = DatabaseUrl::Sqlite("a b.db".into());
        assert_eq!(url.to_string().parse(), Ok(url));
    }

    #[test]
    fn placeholders_are_rewritten_for_postgres() {
        assert_eq!(
            dollar_placeholders("VALUES (?, ?, ?)"),
            "VALUES ($1, $2, $3)"
        );
    }
}
