//! The exactly-once helpers on every SQL store: insert-if-absent (including MariaDB's
//! CLIENT_FOUND_ROWS trap), the transactional outbox, the relay and consumer deduplication.

#[path = "support/mod.rs"]
mod support;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::BoxError;
use stormguard_idempotency::exactly_once::{OutboxMessage, Publisher};
use support::Backend;

/// Records every delivery; fails once before delivering message number `fail_before`, and
/// once *after* delivering message number `ack_lost` (the broker got it, the relay did not
/// hear back).
struct FlakyBroker {
    delivered: Mutex<Vec<OutboxMessage>>,
    calls: AtomicUsize,
    fail_before: usize,
    ack_lost: usize,
    failed_before: AtomicUsize,
    lost_ack: AtomicUsize,
}

impl FlakyBroker {
    fn new(fail_before: usize, ack_lost: usize) -> Self {
        FlakyBroker {
            delivered: Mutex::new(Vec::new()),
            calls: AtomicUsize::new(0),
            fail_before,
            ack_lost,
            failed_before: AtomicUsize::new(0),
            lost_ack: AtomicUsize::new(0),
        }
    }

    fn deliveries(&self) -> Vec<OutboxMessage> {
        self.delivered.lock().map(|d| d.clone()).unwrap_or_default()
    }
}

impl Publisher for FlakyBroker {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let n: usize = String::from_utf8_lossy(&message.payload)
            .parse()
            .unwrap_or(0);
        if n == self.fail_before && self.failed_before.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err("broker unavailable".into());
        }
        if let Ok(mut d) = self.delivered.lock() {
            d.push(message.clone());
        }
        if n == self.ack_lost && self.lost_ack.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err("ack lost".into());
        }
        Ok(())
    }
}

/// Writes a new outbox message (on a connection of its own) every time it is asked to publish:
/// an application enqueueing payments while a relay pass is publishing.
struct WritingBroker<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    /// Run first on the writing connection: a short lock wait, so a blocked insert fails
    /// instead of hanging the test.
    lock_wait: &'static str,
    writes: Mutex<Vec<Result<(), String>>>,
}

macro_rules! sql_suite {
    ($module:ident, $feature:literal, $backend:expr, $pool:ident, $Db:ty, $ph:expr, $lock_wait:literal) => {
        /// Says loudly that this store's exactly-once tests did not run.
        #[cfg(not(feature = $feature))]
        mod $module {
            #[test]
            fn skipped_feature_not_enabled() {
                use std::io::Write as _;
                if std::env::var("STORMGUARD_REQUIRE_ALL_STORES").as_deref() == Ok("1") {
                    panic!(concat!("the `", $feature, "` feature is not enabled but STORMGUARD_REQUIRE_ALL_STORES=1"));
                }
                let _ = writeln!(
                    std::io::stderr(),
                    concat!("SKIPPED: exactly_once::", stringify!($module), ": the `", $feature, "` feature is not enabled (run with --all-features)")
                );
            }
        }

        #[cfg(feature = $feature)]
        mod $module {
            use super::*;
            use stormguard_idempotency::exactly_once::$module::{
                Relay, enqueue, insert_if_absent, mark_processed,
            };

            /// `$1, $2` for PostgreSQL, `?, ?` elsewhere.
            fn sql(s: &str) -> String {
                let mut out = String::new();
                let mut n = 0;
                for c in s.chars() {
                    if c == '?' && $ph {
                        n += 1;
                        out.push_str(&format!("${n}"));
                    } else {
                        out.push(c);
                    }
                }
                out
            }

            async fn setup(test: &str) -> Option<(support::TestEnv, sqlx::Pool<$Db>)> {
                let env = $backend.open(test).await?;
                let pool = env.$pool().expect("pool");
                sqlx::raw_sql(
                    "CREATE TABLE payments (id VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL);
                     CREATE TABLE ledger (event_id VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)",
                )
                .execute(&pool)
                .await
                .expect("tables");
                Some((env, pool))
            }

            async fn count(pool: &sqlx::Pool<$Db>, table: &str) -> i64 {
                sqlx::query_scalar::<_, i64>(&format!("SELECT COUNT(*) FROM {table}"))
                    .fetch_one(pool)
                    .await
                    .expect("count")
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn insert_if_absent_tells_new_from_duplicate() {
                let Some((env, pool)) = setup(concat!(module_path!(), "::insert_if_absent")).await else {
                    return;
                };
                let insert = sql("INSERT INTO payments (id, amount) VALUES (?, ?)");
                let mut tx = pool.begin().await.expect("begin");
                let q = |id: &'static str| sqlx::query::<$Db>(&insert).bind(id).bind(10_i64);
                assert!(insert_if_absent(&mut tx, q("p1")).await.expect("first"));
                assert!(!insert_if_absent(&mut tx, q("p1")).await.expect("duplicate"));
                // The transaction is still usable after the duplicate (PostgreSQL would have
                // aborted it without the savepoint).
                assert!(insert_if_absent(&mut tx, q("p2")).await.expect("after duplicate"));
                tx.commit().await.expect("commit");
                assert_eq!(count(&pool, "payments").await, 2);
                // Outside a transaction too.
                let mut conn = pool.acquire().await.expect("conn");
                assert!(!insert_if_absent(&mut conn, q("p2")).await.expect("dup"));
                assert!(insert_if_absent(&mut conn, q("p3")).await.expect("new"));
                drop(conn);
                // Inbox dedup is the same primitive.
                let mut conn = pool.acquire().await.expect("conn");
                assert!(mark_processed(&mut conn, "billing", "evt-1", 1).await.expect("first"));
                assert!(!mark_processed(&mut conn, "billing", "evt-1", 2).await.expect("dup"));
                assert!(mark_processed(&mut conn, "emails", "evt-1", 3).await.expect("other consumer"));
                drop(conn);
                env.cleanup().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn outbox_row_commits_and_rolls_back_with_the_business_row() {
                let Some((env, pool)) = setup(concat!(module_path!(), "::outbox_tx")).await else {
                    return;
                };
                let insert = sql("INSERT INTO payments (id, amount) VALUES (?, ?)");
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query::<$Db>(&insert).bind("p1").bind(5_i64).execute(&mut *tx).await.expect("row");
                enqueue(&mut tx, &OutboxMessage::new("payments", "p1"), 1).await.expect("enqueue");
                tx.rollback().await.expect("rollback");
                assert_eq!(count(&pool, "payments").await, 0);
                assert_eq!(count(&pool, "stormguard_outbox").await, 0, "no message without its row");

                let mut tx = pool.begin().await.expect("begin");
                sqlx::query::<$Db>(&insert).bind("p1").bind(5_i64).execute(&mut *tx).await.expect("row");
                enqueue(&mut tx, &OutboxMessage::new("payments", "p1"), 1).await.expect("enqueue");
                tx.commit().await.expect("commit");
                assert_eq!(count(&pool, "payments").await, 1);
                assert_eq!(count(&pool, "stormguard_outbox").await, 1);
                env.cleanup().await;
            }

            impl Publisher for WritingBroker<$Db> {
                async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
                    let late = OutboxMessage::new("payments", format!("late-{}", message.event_id));
                    let (pool, lock_wait) = (self.pool.clone(), self.lock_wait);
                    let write = tokio::spawn(async move {
                        let mut tx = pool.begin().await?;
                        if !lock_wait.is_empty() {
                            sqlx::query::<$Db>(lock_wait).execute(&mut *tx).await?;
                        }
                        enqueue(&mut tx, &late, 2).await?;
                        tx.commit().await
                    });
                    let result: Result<(), sqlx::Error> = write.await.map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
                    if let Ok(mut w) = self.writes.lock() {
                        w.push(result.map_err(|e| e.to_string()));
                    }
                    Ok(())
                }
            }

            /// SQLite used to read and mark in one deferred transaction, which any write in
            /// between failed with SQLITE_BUSY_SNAPSHOT; MariaDB's REPEATABLE READ made the
            /// locking read take gap locks that blocked every new outbox row until the pass
            /// ended.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn writes_during_a_relay_pass_neither_fail_it_nor_wait_for_it() {
                let Some((env, pool)) = setup(concat!(module_path!(), "::relay_concurrent_writes")).await else {
                    return;
                };
                for n in 1..=2 {
                    let mut tx = pool.begin().await.expect("begin");
                    enqueue(&mut tx, &OutboxMessage::new("payments", n.to_string()), 1).await.expect("enqueue");
                    tx.commit().await.expect("commit");
                }
                let broker = WritingBroker::<$Db> {
                    pool: pool.clone(),
                    lock_wait: $lock_wait,
                    writes: Mutex::new(Vec::new()),
                };
                let relay = Relay::new(pool.clone()).with_batch(10);
                let report = relay.run_once(&broker, 10).await.expect("the pass survives the writes");
                assert_eq!(report, stormguard_idempotency::exactly_once::RelayReport { published: 2, failed: None });
                let writes = broker.writes.lock().map(|w| w.clone()).unwrap_or_default();
                assert_eq!(writes, vec![Ok(()), Ok(())], "no write waited for the pass");
                // The messages written during the pass go out on the next one.
                let report = relay.run_once(&broker, 11).await.expect("next pass");
                assert_eq!(report.published, 2);
                assert_eq!(count(&pool, "stormguard_outbox").await, 6);
                env.cleanup().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn relay_is_at_least_once_and_consumers_apply_once() {
                let Some((env, pool)) = setup(concat!(module_path!(), "::relay")).await else {
                    return;
                };
                let mut sent = Vec::new();
                for n in 1..=3 {
                    let mut tx = pool.begin().await.expect("begin");
                    let msg = OutboxMessage::new("payments", n.to_string());
                    enqueue(&mut tx, &msg, 1).await.expect("enqueue");
                    tx.commit().await.expect("commit");
                    sent.push(msg);
                }
                let broker = FlakyBroker::new(2, 3);
                let relay = Relay::new(pool.clone()).with_batch(10);
                let mut published = 0;
                for pass in 0..10 {
                    let report = relay.run_once(&broker, 100 + pass).await.expect("relay");
                    published += report.published;
                    if report.published == 0 && report.failed.is_none() {
                        break;
                    }
                }
                assert_eq!(published, 3, "each message marked once");
                let deliveries = broker.deliveries();
                let ids: Vec<&str> = deliveries.iter().map(|m| m.event_id.as_str()).collect();
                assert_eq!(
                    ids,
                    vec![&*sent[0].event_id, &*sent[1].event_id, &*sent[2].event_id, &*sent[2].event_id],
                    "in order, the lost ack redelivered with the same event id"
                );
                // The consumer applies each delivery in a transaction with its inbox mark.
                let apply = sql("INSERT INTO ledger (event_id, amount) VALUES (?, ?)");
                let mut applied = 0;
                for m in &deliveries {
                    let mut tx = pool.begin().await.expect("begin");
                    if mark_processed(&mut tx, "ledger", &m.event_id, 1).await.expect("mark") {
                        sqlx::query::<$Db>(&apply).bind(&m.event_id).bind(1_i64).execute(&mut *tx).await.expect("apply");
                        applied += 1;
                    }
                    tx.commit().await.expect("commit");
                }
                assert_eq!(applied, 3);
                assert_eq!(count(&pool, "ledger").await, 3, "exactly once despite 4 deliveries");
                env.cleanup().await;
            }
        }
    };
}

sql_suite!(
    sqlite,
    "sqlite",
    Backend::SqliteFile,
    sqlite_pool,
    sqlx::Sqlite,
    false,
    ""
);
sql_suite!(
    postgres,
    "postgres",
    Backend::Postgres,
    pg_pool,
    sqlx::Postgres,
    true,
    "SET lock_timeout = '1s'"
);
sql_suite!(
    mysql,
    "mysql",
    Backend::MySql,
    mysql_pool,
    sqlx::MySql,
    false,
    "SET SESSION innodb_lock_wait_timeout = 1"
);

/// The trap the helper avoids: with sqlx's CLIENT_FOUND_ROWS, MariaDB reports one affected
/// row for `INSERT … ON DUPLICATE KEY UPDATE` whether the row is new or a duplicate.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_upsert_row_count_cannot_tell_new_from_duplicate() {
    let Some(env) = Backend::MySql.open("mariadb_upsert_row_count").await else {
        return;
    };
    let pool = env.mysql_pool().expect("pool");
    sqlx::raw_sql("CREATE TABLE payments (id VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .expect("table");
    let upsert = "INSERT INTO payments (id, amount) VALUES (?, ?) ON DUPLICATE KEY UPDATE id = id";
    let new = sqlx::query(upsert)
        .bind("p1")
        .bind(1_i64)
        .execute(&pool)
        .await
        .expect("new");
    let dup = sqlx::query(upsert)
        .bind("p1")
        .bind(1_i64)
        .execute(&pool)
        .await
        .expect("dup");
    assert_eq!(new.rows_affected(), 1);
    assert_eq!(
        dup.rows_affected(),
        1,
        "CLIENT_FOUND_ROWS: a duplicate looks like a new row"
    );
    // The helper is not fooled.
    let mut conn = pool.acquire().await.expect("conn");
    let insert = || {
        sqlx::query("INSERT INTO payments (id, amount) VALUES (?, ?)")
            .bind("p1")
            .bind(1_i64)
    };
    assert!(
        !stormguard_idempotency::exactly_once::mysql::insert_if_absent(&mut conn, insert())
            .await
            .expect("helper")
    );
    drop(conn);
    env.cleanup().await;
}
