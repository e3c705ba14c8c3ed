//! The MySQL / MariaDB store, for several instances sharing one database.
//!
//! sqlx connects to MySQL with `CLIENT_FOUND_ROWS`, so an `UPDATE` reports the rows it
//! *matched* and `INSERT … ON DUPLICATE KEY UPDATE` reports 1 for a duplicate as well as for a
//! new row. This store never relies on either count to tell a new row from an old one: a new
//! record is a plain `INSERT` that succeeded (a duplicate fails with error 1062), and every
//! compare-and-set `UPDATE` puts its whole condition in the `WHERE` clause, where "matched"
//! and "changed" mean the same thing.

use sqlx::mysql::MySqlPoolOptions;
use sqlx::{MySql, MySqlPool};

use crate::StoreError;
use crate::store::sql::sql_store;

/// The migrations shipped in the crate for MySQL and MariaDB.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/mysql");

/// Idempotency records in MySQL or MariaDB (InnoDB table `stormguard_idempotency`).
#[derive(Clone, Debug)]
pub struct MySqlStore {
    pool: MySqlPool,
}

impl MySqlStore {
    /// Connects a pool of up to 16 connections to `url` (`mysql://user:pass@host:3306/db`),
    /// without a ping before each use (see [the SQL stores' notes](crate::store#pools)).
    /// Call [`migrate`](Self::migrate) once before use.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = MySqlPoolOptions::new()
            .max_connections(16)
            .test_before_acquire(false)
            .connect(url)
            .await?;
        Ok(MySqlStore { pool })
    }

    /// A store on an existing pool.
    pub fn from_pool(pool: MySqlPool) -> Self {
        MySqlStore { pool }
    }

    /// The pool, for the [`exactly_once`](crate::exactly_once) helpers in the same database.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }
}

sql_store! {
    store: MySqlStore,
    db: MySql,
    migrator: MIGRATOR,
    lock: "SELECT GET_LOCK('stormguard_idempotency_migrate', 60)",
    unlock: "SELECT RELEASE_LOCK('stormguard_idempotency_migrate')",
    tracking_table: "CREATE TABLE IF NOT EXISTS stormguard_idempotency_migrations (
        version BIGINT PRIMARY KEY, description VARCHAR(255) NOT NULL,
        applied_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP) ENGINE = InnoDB",
    claim: "",
    insert: "INSERT INTO stormguard_idempotency
        (tenant, idem_key, state, fingerprint, lease_token, lease_until, expires_at, created_at)
        VALUES (?, ?, 0, ?, ?, ?, ?, ?)",
    select: "SELECT state, fingerprint, lease_token, lease_until, expires_at, status, headers, body
        FROM stormguard_idempotency WHERE tenant = ? AND idem_key = ?",
    replace: "UPDATE stormguard_idempotency SET state = 0, fingerprint = ?, lease_token = ?,
        lease_until = ?, expires_at = ?, created_at = ?, status = NULL, headers = NULL, body = NULL
        WHERE tenant = ? AND idem_key = ? AND lease_token = ? AND state = ?",
    complete: "UPDATE stormguard_idempotency SET state = ?, status = ?, headers = ?, body = ?,
        expires_at = ?, lease_until = ?
        WHERE tenant = ? AND idem_key = ? AND lease_token = ? AND state = 0",
    release: "DELETE FROM stormguard_idempotency
        WHERE tenant = ? AND idem_key = ? AND lease_token = ? AND state = 0",
    reap: "DELETE FROM stormguard_idempotency WHERE expires_at <= ? ORDER BY expires_at LIMIT ?",
}
