//! Where versions, releases, instances, audit records and tokens are kept: SQLite embedded
//! (the default: nothing to install) or PostgreSQL (several center replicas on one database).
//!
//! Both databases run the same SQL text (SQLite accepts PostgreSQL's `$1` parameters), so the
//! two stores cannot drift apart; only the migrations differ, by one column type. Every
//! change that belongs together is one transaction: a version, the release that points at it
//! and its audit record are written together or not at all, so a center killed in the middle
//! of a publish leaves no half version behind.
//!
//! Publishing is compare-and-set: the new version is inserted only while the service's latest
//! version is the one the editor saw, in a single `INSERT … SELECT … WHERE` statement. Two
//! publishes on the same base both try to insert the same (service, version) key; the
//! primary key lets exactly one of them in, and the other learns it lost
//! ([`StoreError::Conflict`]).

mod rows;

use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{PgPool, SqlitePool};

pub(crate) use rows::{AuditRow, InstanceRow, ReleaseRow, RuleRow, TokenRow, VersionRow};

/// The migrations for SQLite.
static SQLITE_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
/// The migrations for PostgreSQL.
static POSTGRES_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The PostgreSQL channel on which every replica announces a changed service (the payload is
/// the service's name).
pub(crate) const NOTIFY_CHANNEL: &str = "stormguard_center";

/// The longest a request waits for a database connection before it fails with
/// [`StoreError::Database`] (the pools of [`Store::open`]).
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Which database a store is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// An SQLite file (or memory).
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreKind::Sqlite => "SQLite store",
            StoreKind::Postgres => "PostgreSQL store",
        })
    }
}

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or could not be reached.
    #[error("{store}: {source}")]
    Database {
        /// Which database.
        store: StoreKind,
        /// What the driver said.
        #[source]
        source: sqlx::Error,
    },
    /// The migrations could not be applied.
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The URL is neither `sqlite:` nor `postgres:`.
    #[error("database URL {0:?}: expected sqlite:… or postgres://…")]
    Url(String),
    /// The acknowledgement's group commit ended without an answer (the runtime shut down):
    /// whether it was written is unknown.
    #[error(
        "the acknowledgement's group commit ended without an answer; it may not have been written"
    )]
    Abandoned,
    /// The service's latest version is not the one the publish was based on.
    #[error("the latest version is {latest}, not {base}: publish again on {latest}")]
    Conflict {
        /// The version the publish was based on.
        base: u64,
        /// The service's latest version.
        latest: u64,
    },
}

#[derive(Clone, Debug)]
enum Backend {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The center's database.
///
/// # Writes take turns, and ACKs commit together
///
/// SQLite lets one transaction write at a time; a second writer that finds the lock taken
/// sleeps in its busy handler (1, 2, 5 … up to 100 ms at a time) and tries again, so a burst
/// of writes finishes in whatever order the sleeps end. On SQLite every write here first
/// waits its turn in a fair queue instead, and the lock passes without a sleep. Reads never
/// wait (WAL mode). PostgreSQL locks rows, not the database: its writes go straight in.
///
/// Each commit waits for the disk (`fsync`), a few milliseconds on common disks: a thousand
/// instances acknowledging one publish, one commit each, would queue for seconds. ACKs and
/// NACKs are therefore committed in groups by one writer task per store (on either
/// database): every acknowledgement that arrives while a group is being written joins the
/// next group, one transaction and one commit for all of them. Each caller still returns
/// only once its own record is committed.
#[derive(Clone, Debug)]
pub struct Store {
    backend: Backend,
    writes: Arc<tokio::sync::Mutex<()>>,
    ack_writer: Arc<acks::AckWriter>,
}

/// Runs `$body` with `$pool` bound to whichever pool the store has: one SQL text, two drivers.
/// A driver error (`?` inside `$body`) becomes a [`StoreError::Database`] naming the store.
macro_rules! on_pool {
    ($store:expr, |$pool:ident| $body:expr) => {
        match &$store.backend {
            Backend::Sqlite($pool) => {
                async { Ok::<_, sqlx::Error>($body) }
                    .await
                    .map_err(|source| StoreError::Database {
                        store: StoreKind::Sqlite,
                        source,
                    })?
            }
            Backend::Postgres($pool) => {
                async { Ok::<_, sqlx::Error>($body) }
                    .await
                    .map_err(|source| StoreError::Database {
                        store: StoreKind::Postgres,
                        source,
                    })?
            }
        }
    };
}

/// The insert of one audit record, as a query to execute on a pool or a transaction.
macro_rules! insert_audit {
    ($audit:expr) => {
        sqlx::query(
            "INSERT INTO center_audit (at_ms, actor, action, service, version, instance, detail)
            VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind($audit.at_ms)
        .bind($audit.actor)
        .bind($audit.action)
        .bind($audit.service)
        .bind($audit.version.map(as_i64))
        .bind($audit.instance)
        .bind($audit.detail)
    };
}

/// The notice to the other replicas (PostgreSQL only) that `service` changed, delivered on
/// commit.
macro_rules! notify {
    ($service:expr) => {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(NOTIFY_CHANNEL)
            .bind($service)
    };
}

// After the macros, which the group commit uses too.
mod acks;
mod rules;
#[cfg(test)]
mod tests;

/// A version about to be written.
pub(crate) struct NewVersion<'a> {
    pub(crate) service: &'a str,
    pub(crate) base: u64,
    pub(crate) hash: &'a str,
    pub(crate) policy: &'a str,
    pub(crate) author: &'a str,
    pub(crate) message: &'a str,
    pub(crate) diff: &'a str,
    pub(crate) rollback_of: Option<u64>,
    /// Publish as a canary for these instances (a JSON selector) instead of for all.
    pub(crate) canary: Option<&'a str>,
    pub(crate) now_ms: i64,
    pub(crate) action: &'a str,
    /// The audit record's detail, when it is not the message (a rule's observed values).
    pub(crate) detail: Option<&'a str>,
    /// More audit records written in the same transaction.
    pub(crate) also: &'a [NewAudit<'a>],
}

/// An audit record about to be written.
pub(crate) struct NewAudit<'a> {
    pub(crate) at_ms: i64,
    pub(crate) actor: &'a str,
    pub(crate) action: &'a str,
    pub(crate) service: &'a str,
    pub(crate) version: Option<u64>,
    pub(crate) instance: Option<&'a str>,
    pub(crate) detail: &'a str,
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Store {
    /// Opens the database at `url` (`sqlite://path/center.db`, `sqlite::memory:`,
    /// `postgres://user@host/db`) and applies the migrations.
    ///
    /// SQLite runs in WAL mode with a 10 s busy timeout, and creates the file if it is
    /// missing; an in-memory database has one connection (each connection would otherwise
    /// have its own database). A request waits at most [`ACQUIRE_TIMEOUT`] for a
    /// connection: with the database down it fails in seconds (503), not after the
    /// driver's default half minute.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        let store = if url.starts_with("sqlite:") {
            let sqlite = |source| StoreError::Database {
                store: StoreKind::Sqlite,
                source,
            };
            let options = SqliteConnectOptions::from_str(url)
                .map_err(sqlite)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(10));
            let connections = if url.contains(":memory:") { 1 } else { 4 };
            let pool = SqlitePoolOptions::new()
                .max_connections(connections)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_with(options)
                .await
                .map_err(sqlite)?;
            Store::sqlite(pool)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let postgres = |source| StoreError::Database {
                store: StoreKind::Postgres,
                source,
            };
            let options = PgConnectOptions::from_str(url).map_err(postgres)?;
            let pool = PgPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_with(options)
                .await
                .map_err(postgres)?;
            Store::postgres(pool)
        } else {
            return Err(StoreError::Url(url.to_owned()));
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Which database the store is on.
    pub fn kind(&self) -> StoreKind {
        match self.backend {
            Backend::Sqlite(_) => StoreKind::Sqlite,
            Backend::Postgres(_) => StoreKind::Postgres,
        }
    }

    /// A store on an SQLite pool (call [`migrate`](Self::migrate) once).
    pub fn sqlite(pool: SqlitePool) -> Store {
        Store::on(Backend::Sqlite(pool))
    }

    /// A store on a PostgreSQL pool (call [`migrate`](Self::migrate) once).
    pub fn postgres(pool: PgPool) -> Store {
        Store::on(Backend::Postgres(pool))
    }

    fn on(backend: Backend) -> Store {
        Store {
            backend,
            writes: Arc::default(),
            ack_writer: Arc::default(),
        }
    }

    /// This writer's turn (see [`Store`]): on SQLite, the guard of the write queue, held
    /// until the write commits; on PostgreSQL, nothing to wait for.
    async fn write_turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.backend {
            Backend::Sqlite(_) => Some(self.writes.lock().await),
            Backend::Postgres(_) => None,
        }
    }

    /// The PostgreSQL pool, when the store is PostgreSQL (to listen for other replicas).
    pub(crate) fn postgres_pool(&self) -> Option<&PgPool> {
        match &self.backend {
            Backend::Postgres(pool) => Some(pool),
            Backend::Sqlite(_) => None,
        }
    }

    /// Creates or updates the tables.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Sqlite(pool) => SQLITE_MIGRATOR.run(pool).await?,
            Backend::Postgres(pool) => POSTGRES_MIGRATOR.run(pool).await?,
        }
        Ok(())
    }

    /// The service's latest version.
    pub(crate) async fn latest(&self, service: &str) -> Result<Option<VersionRow>, StoreError> {
        const SQL: &str =
            "SELECT service, version, hash, policy, author, message, diff, rollback_of, created_ms
            FROM center_versions WHERE service = $1 ORDER BY version DESC LIMIT 1";
        Ok(on_pool!(self, |pool| sqlx::query_as(SQL)
            .bind(service)
            .fetch_optional(pool)
            .await?))
    }

    /// One version of the service.
    pub(crate) async fn version(
        &self,
        service: &str,
        version: u64,
    ) -> Result<Option<VersionRow>, StoreError> {
        const SQL: &str =
            "SELECT service, version, hash, policy, author, message, diff, rollback_of, created_ms
            FROM center_versions WHERE service = $1 AND version = $2";
        Ok(on_pool!(self, |pool| sqlx::query_as(SQL)
            .bind(service)
            .bind(as_i64(version))
            .fetch_optional(pool)
            .await?))
    }

    /// The service's versions, newest first, at most `limit`.
    pub(crate) async fn history(
        &self,
        service: &str,
        limit: u32,
    ) -> Result<Vec<VersionRow>, StoreError> {
        const SQL: &str =
            "SELECT service, version, hash, policy, author, message, diff, rollback_of, created_ms
            FROM center_versions WHERE service = $1 ORDER BY version DESC LIMIT $2";
        Ok(on_pool!(self, |pool| sqlx::query_as(SQL)
            .bind(service)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?))
    }

    /// Writes a new version on `base` (compare-and-set), points the service's release at it
    /// (as the stable version, or as the canary) and writes its audit record, in one
    /// transaction.
    pub(crate) async fn publish(&self, new: &NewVersion<'_>) -> Result<u64, StoreError> {
        const INSERT: &str = "INSERT INTO center_versions
            (service, version, hash, policy, author, message, diff, rollback_of, created_ms)
            SELECT CAST($1 AS TEXT), CAST($2 AS BIGINT), CAST($3 AS TEXT), CAST($4 AS TEXT),
                   CAST($5 AS TEXT), CAST($6 AS TEXT), CAST($7 AS TEXT), CAST($8 AS BIGINT),
                   CAST($9 AS BIGINT)
            WHERE COALESCE((SELECT MAX(version) FROM center_versions WHERE service = $1), 0) = $10
            ON CONFLICT DO NOTHING";
        const STABLE: &str = "INSERT INTO center_services (service, stable, canary, selector)
            VALUES ($1, $2, NULL, NULL)
            ON CONFLICT (service) DO UPDATE SET stable = $2, canary = NULL, selector = NULL";
        const CANARY: &str = "INSERT INTO center_services (service, stable, canary, selector)
            VALUES ($1, NULL, $2, $3)
            ON CONFLICT (service) DO UPDATE SET canary = $2, selector = $3";
        let version = new.base.saturating_add(1);
        let _turn = self.write_turn().await;
        let inserted = on_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            let inserted = sqlx::query(INSERT)
                .bind(new.service)
                .bind(as_i64(version))
                .bind(new.hash)
                .bind(new.policy)
                .bind(new.author)
                .bind(new.message)
                .bind(new.diff)
                .bind(new.rollback_of.map(as_i64))
                .bind(new.now_ms)
                .bind(as_i64(new.base))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if inserted == 1 {
                match new.canary {
                    None => {
                        sqlx::query(STABLE)
                            .bind(new.service)
                            .bind(as_i64(version))
                            .execute(&mut *tx)
                            .await?
                    }
                    Some(selector) => {
                        sqlx::query(CANARY)
                            .bind(new.service)
                            .bind(as_i64(version))
                            .bind(selector)
                            .execute(&mut *tx)
                            .await?
                    }
                };
                insert_audit!(NewAudit {
                    at_ms: new.now_ms,
                    actor: new.author,
                    action: new.action,
                    service: new.service,
                    version: Some(version),
                    instance: None,
                    detail: new.detail.unwrap_or(new.message),
                })
                .execute(&mut *tx)
                .await?;
                for audit in new.also {
                    insert_audit!(audit).execute(&mut *tx).await?;
                }
                if self.is_postgres() {
                    notify!(new.service).execute(&mut *tx).await?;
                }
                tx.commit().await?;
            }
            inserted
        });
        if inserted == 1 {
            return Ok(version);
        }
        let latest = self
            .latest(new.service)
            .await?
            .map_or(0, |row| row.version());
        Err(StoreError::Conflict {
            base: new.base,
            latest,
        })
    }

    fn is_postgres(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// Changes the service's release (promote its canary `canary`, or drop it) and writes
    /// the audit record, in one transaction. Returns false when the service has no canary,
    /// or another one.
    pub(crate) async fn end_canary(
        &self,
        promote: bool,
        canary: u64,
        audit: &NewAudit<'_>,
    ) -> Result<bool, StoreError> {
        const PROMOTE: &str =
            "UPDATE center_services SET stable = canary, canary = NULL, selector = NULL
            WHERE service = $1 AND canary = $2";
        const DROP: &str = "UPDATE center_services SET canary = NULL, selector = NULL
            WHERE service = $1 AND canary = $2";
        let _turn = self.write_turn().await;
        Ok(on_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            let changed = sqlx::query(if promote { PROMOTE } else { DROP })
                .bind(audit.service)
                .bind(as_i64(canary))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if changed == 1 {
                insert_audit!(audit).execute(&mut *tx).await?;
                if self.is_postgres() {
                    notify!(audit.service).execute(&mut *tx).await?;
                }
                tx.commit().await?;
            }
            changed == 1
        }))
    }

    /// The service's release: its stable version and its canary.
    pub(crate) async fn release(&self, service: &str) -> Result<Option<ReleaseRow>, StoreError> {
        const SQL: &str = "SELECT stable, canary, selector FROM center_services WHERE service = $1";
        Ok(on_pool!(self, |pool| sqlx::query_as(SQL)
            .bind(service)
            .fetch_optional(pool)
            .await?))
    }

    /// Records that an instance watches (its labels), keeping what it last acknowledged.
    pub(crate) async fn instance_seen(
        &self,
        service: &str,
        instance: &str,
        labels: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO center_instances (service, instance, labels, seen_ms)
            VALUES ($1, $2, $3, $4)
            ON CONFLICT (service, instance) DO UPDATE SET labels = $3, seen_ms = $4";
        let _turn = self.write_turn().await;
        on_pool!(self, |pool| sqlx::query(SQL)
            .bind(service)
            .bind(instance)
            .bind(labels)
            .bind(now_ms)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }

    /// The service's instances, by id.
    pub(crate) async fn instances(&self, service: &str) -> Result<Vec<InstanceRow>, StoreError> {
        const SQL: &str = "SELECT instance, labels, version, applied, reason, seen_ms
            FROM center_instances WHERE service = $1 ORDER BY instance";
        Ok(on_pool!(self, |pool| sqlx::query_as(SQL)
            .bind(service)
            .fetch_all(pool)
            .await?))
    }

    /// The audit records of one service (or of all), newest first, at most `limit`.
    pub(crate) async fn audit_log(
        &self,
        service: Option<&str>,
        limit: u32,
    ) -> Result<Vec<AuditRow>, StoreError> {
        const SQL: &str = "SELECT id, at_ms, actor, action, service, version, instance, detail
            FROM center_audit WHERE (CAST($1 AS TEXT) IS NULL OR service = $1) ORDER BY id DESC LIMIT $2";
        Ok(on_pool!(self, |pool| sqlx::query_as(SQL)
            .bind(service)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?))
    }

    /// Stores a token's hash with its name, role and service.
    pub(crate) async fn insert_token(
        &self,
        token: &TokenRow,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        const SQL: &str = "INSERT INTO center_tokens (hash, name, role, service, created_ms)
            VALUES ($1, $2, $3, $4, $5) ON CONFLICT (hash) DO NOTHING";
        let _turn = self.write_turn().await;
        on_pool!(self, |pool| sqlx::query(SQL)
            .bind(&token.hash)
            .bind(&token.name)
            .bind(&token.role)
            .bind(token.service.as_deref())
            .bind(now_ms)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(())
    }

    /// The token whose hash is `hash`.
    pub(crate) async fn token(&self, hash: &str) -> Result<Option<TokenRow>, StoreError> {
        const SQL: &str = "SELECT hash, name, role, service FROM center_tokens WHERE hash = $1";
        Ok(on_pool!(self, |pool| sqlx::query_as(SQL)
            .bind(hash)
            .fetch_optional(pool)
            .await?))
    }
}

/// The mutex's value even if a holder panicked (a pending list stays valid).
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
