//! The PostgreSQL store, for several instances sharing one database.

use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres};

use crate::StoreError;
use crate::store::sql::sql_store;

/// The migrations shipped in the crate for PostgreSQL.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Idempotency records in PostgreSQL (table `stormguard_idempotency` in the connection's
/// `search_path`).
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects a pool of up to 16 connections to `url`
    /// (`postgres://user@host:5432/db`), without a ping before each use (see
    /// [the SQL stores' notes](crate::store#pools)). Call [`migrate`](Self::migrate) once
    /// before use.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .test_before_acquire(false)
            .connect(url)
            .await?;
        Ok(PostgresStore { pool })
    }

    /// A store on an existing pool.
    pub fn from_pool(pool: PgPool) -> Self {
        PostgresStore { pool }
    }

    /// The pool, for the [`exactly_once`](crate::exactly_once) helpers in the same database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

sql_store! {
    store: PostgresStore,
    db: Postgres,
    migrator: MIGRATOR,
    // Concurrent CREATE TABLE IF NOT EXISTS can still collide in PostgreSQL's catalog.
    lock: "SELECT pg_advisory_lock(7264838361503)",
    unlock: "SELECT pg_advisory_unlock(7264838361503)",
    tracking_table: "CREATE TABLE IF NOT EXISTS stormguard_idempotency_migrations (
        version BIGINT PRIMARY KEY, description TEXT NOT NULL,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    // One round trip for a new key and for an existing one: the insert, and (only when it
    // found a record) that record. Column 0 is NULL for the caller's own new row.
    claim: "WITH ins AS (
        INSERT INTO stormguard_idempotency
        (tenant, idem_key, state, fingerprint, lease_token, lease_until, expires_at, created_at)
        VALUES ($1, $2, 0, $3, $4, $5, $6, $7) ON CONFLICT (tenant, idem_key) DO NOTHING RETURNING 1)
        SELECT NULL::BIGINT, NULL::BYTEA, NULL::BIGINT, NULL::BIGINT, NULL::BIGINT, NULL::BIGINT,
            NULL::BYTEA, NULL::BYTEA FROM ins
        UNION ALL
        SELECT state, fingerprint, lease_token, lease_until, expires_at, status, headers, body
        FROM stormguard_idempotency
        WHERE tenant = $1 AND idem_key = $2 AND NOT EXISTS (SELECT 1 FROM ins)",
    insert: "INSERT INTO stormguard_idempotency
        (tenant, idem_key, state, fingerprint, lease_token, lease_until, expires_at, created_at)
        VALUES ($1, $2, 0, $3, $4, $5, $6, $7) ON CONFLICT (tenant, idem_key) DO NOTHING",
    select: "SELECT state, fingerprint, lease_token, lease_until, expires_at, status, headers, body
        FROM stormguard_idempotency WHERE tenant = $1 AND idem_key = $2",
    replace: "UPDATE stormguard_idempotency SET state = 0, fingerprint = $1, lease_token = $2,
        lease_until = $3, expires_at = $4, created_at = $5, status = NULL, headers = NULL, body = NULL
        WHERE tenant = $6 AND idem_key = $7 AND lease_token = $8 AND state = $9",
    complete: "UPDATE stormguard_idempotency SET state = $1, status = $2, headers = $3, body = $4,
        expires_at = $5, lease_until = $6
        WHERE tenant = $7 AND idem_key = $8 AND lease_token = $9 AND state = 0",
    release: "DELETE FROM stormguard_idempotency
        WHERE tenant = $1 AND idem_key = $2 AND lease_token = $3 AND state = 0",
    reap: "DELETE FROM stormguard_idempotency WHERE (tenant, idem_key) IN (
        SELECT tenant, idem_key FROM stormguard_idempotency WHERE expires_at <= $1
        ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
}
