//! The algorithm shared by the SQL stores, written once as a macro over each sqlx driver.
//!
//! # begin
//!
//! 1. Claim: `INSERT` a new in-flight record; a new row means the caller holds the lease.
//!    PostgreSQL does it in one statement with the read of step 2 (`claim`: a data-modifying
//!    `WITH` whose outer `SELECT` returns the existing record when the insert found one), so
//!    a new key and a replay each cost one round trip. SQLite uses `ON CONFLICT DO NOTHING`
//!    and reads the affected-row count; MySQL uses a plain `INSERT` and treats the
//!    duplicate-key error as "exists", because sqlx connects with `CLIENT_FOUND_ROWS` and an
//!    upsert would report 1 row for a duplicate too (MySQL has no `INSERT … RETURNING`, so a
//!    replay there costs two round trips).
//! 2. Otherwise `SELECT` the record and decide in Rust: expired → replace it; other fingerprint
//!    → mismatch; completed → replay; live lease → in flight; expired lease → take over. (A
//!    record that a concurrent claim committed after this statement's snapshot is not visible
//!    to it yet: the loop simply goes round again.)
//! 3. Replacing and taking over are compare-and-set `UPDATE`s on `(lease_token, state)`, so
//!    of two racing callers exactly one wins; the loser starts again at 1.
//!
//! Every statement is a single autocommitted, prepared (and cached) statement: no transaction
//! is held open across a round trip, and the placeholders appear in bind order so one bind
//! sequence serves `$n` (PostgreSQL) and `?` (MySQL, SQLite). A new key costs two commits (the
//! claim, the completion) and a replay none.

/// How many times `begin` goes round when it keeps losing races (or deadlocks on MySQL).
pub(crate) const BEGIN_ATTEMPTS: usize = 8;

pub(crate) const MIGRATIONS_TABLE: &str = "stormguard_idempotency_migrations";

/// Whether a database error is worth one more go (deadlock, serialization failure).
pub(crate) fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("40001" | "40P01")),
        _ => false,
    }
}

/// Whether the insert made a new row (`Ok(true)`), found an existing one (`Ok(false)`), or
/// failed.
pub(crate) fn inserted(rows: Result<u64, sqlx::Error>) -> Result<bool, sqlx::Error> {
    match rows {
        Ok(n) => Ok(n == 1),
        Err(sqlx::Error::Database(db)) if db.is_unique_violation() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Implements [`Store`](crate::Store) and `migrate` for a sqlx-backed store type with a
/// `pool` field.
macro_rules! sql_store {
    (
        store: $Store:ident,
        db: $Db:ty,
        migrator: $migrator:expr,
        lock: $lock:literal,
        unlock: $unlock:literal,
        tracking_table: $tracking:literal,
        claim: $claim:literal,
        insert: $insert:literal,
        select: $select:literal,
        replace: $replace:literal,
        complete: $complete:literal,
        release: $release:literal,
        reap: $reap:literal $(,)?
    ) => {
        impl $Store {
            /// Creates or updates this store's tables (and the outbox/inbox tables of
            /// [`exactly_once`](crate::exactly_once)) with the migrations shipped in the crate.
            ///
            /// Applied versions are tracked in their own table,
            /// `stormguard_idempotency_migrations`, so they never collide with the
            /// application's own `_sqlx_migrations`. Safe to run from several instances at
            /// once. Applications that prefer to own their schema can copy the files under
            /// `migrations/` instead.
            pub async fn migrate(&self) -> Result<(), $crate::StoreError> {
                use sqlx::{Connection as _, Row as _};
                let mut conn = self.pool.acquire().await?;
                if !$lock.is_empty() {
                    sqlx::query($lock).execute(&mut *conn).await?;
                }
                let result: Result<(), $crate::StoreError> = async {
                    sqlx::raw_sql($tracking).execute(&mut *conn).await?;
                    let applied: Vec<i64> = sqlx::query(concat!(
                        "SELECT version FROM ",
                        "stormguard_idempotency_migrations"
                    ))
                    .fetch_all(&mut *conn)
                    .await?
                    .iter()
                    .map(|row| row.try_get::<i64, _>(0))
                    .collect::<Result<_, _>>()?;
                    for m in $migrator.iter() {
                        if applied.contains(&m.version) {
                            continue;
                        }
                        let mut tx = conn.begin().await?;
                        sqlx::raw_sql(&m.sql).execute(&mut *tx).await?;
                        let insert = format!(
                            "INSERT INTO {} (version, description) VALUES ({}, '{}')",
                            $crate::store::sql::MIGRATIONS_TABLE,
                            m.version,
                            m.description.replace('\'', "")
                        );
                        sqlx::raw_sql(&insert).execute(&mut *tx).await?;
                        tx.commit().await?;
                    }
                    Ok(())
                }
                .await;
                if !$unlock.is_empty() {
                    sqlx::query($unlock).execute(&mut *conn).await?;
                }
                result
            }
        }

        impl $crate::Store for $Store {
            fn begin<'a>(
                &'a self,
                req: $crate::BeginRequest<'a>,
            ) -> $crate::store::StoreFuture<'a, $crate::Begin> {
                Box::pin(async move {
                    use sqlx::Row as _;
                    use $crate::store::codec;
                    use $crate::store::sql::{BEGIN_ATTEMPTS, inserted, is_transient};
                    let tenant = req.key.tenant();
                    let key = req.key.key().as_str();
                    let fp: &[u8] = req.fingerprint.as_bytes();
                    let mut last_err = None;
                    // The claim's arguments, in the order both claim statements take them.
                    let claiming = |statement: &'static str| {
                        sqlx::query::<$Db>(statement)
                            .bind(tenant)
                            .bind(key)
                            .bind(fp)
                            .bind(req.token.0)
                            .bind(req.lease_until)
                            .bind(req.expires_at)
                            .bind(req.now)
                    };
                    for _ in 0..BEGIN_ATTEMPTS {
                        let row = if $claim.is_empty() {
                            let rows = claiming($insert)
                                .execute(&self.pool)
                                .await
                                .map(|r| r.rows_affected());
                            match inserted(rows) {
                                Ok(true) => {
                                    return Ok($crate::Begin::Acquired { took_over: false });
                                }
                                Ok(false) => {}
                                Err(e) if is_transient(&e) => {
                                    last_err = Some(e);
                                    continue;
                                }
                                Err(e) => return Err(e.into()),
                            }
                            sqlx::query::<$Db>($select)
                                .bind(tenant)
                                .bind(key)
                                .fetch_optional(&self.pool)
                                .await?
                        } else {
                            let claimed = claiming($claim).fetch_optional(&self.pool).await;
                            match claimed {
                                Ok(Some(row)) if row.try_get::<Option<i64>, _>(0)?.is_none() => {
                                    return Ok($crate::Begin::Acquired { took_over: false });
                                }
                                Ok(row) => row,
                                Err(e) if is_transient(&e) => {
                                    last_err = Some(e);
                                    continue;
                                }
                                Err(e) => return Err(e.into()),
                            }
                        };
                        let Some(row) = row else { continue };
                        let state: i64 = row.try_get(0)?;
                        let stored_fp: Vec<u8> = row.try_get(1)?;
                        let token: i64 = row.try_get(2)?;
                        let lease_until: i64 = row.try_get(3)?;
                        let expires_at: i64 = row.try_get(4)?;
                        let took_over = if expires_at <= req.now {
                            false
                        } else if stored_fp.as_slice() != fp {
                            return Ok($crate::Begin::Mismatch);
                        } else if state != codec::IN_FLIGHT {
                            let completion = codec::completion_from_columns(
                                state,
                                row.try_get(5)?,
                                row.try_get(6)?,
                                row.try_get(7)?,
                            )?;
                            return Ok($crate::Begin::Completed(completion));
                        } else if lease_until > req.now {
                            return Ok($crate::Begin::InFlight { lease_until });
                        } else {
                            true
                        };
                        let swapped = sqlx::query::<$Db>($replace)
                            .bind(fp)
                            .bind(req.token.0)
                            .bind(req.lease_until)
                            .bind(req.expires_at)
                            .bind(req.now)
                            .bind(tenant)
                            .bind(key)
                            .bind(token)
                            .bind(state)
                            .execute(&self.pool)
                            .await;
                        match swapped {
                            Ok(r) if r.rows_affected() == 1 => {
                                return Ok($crate::Begin::Acquired { took_over });
                            }
                            Ok(_) => {}
                            Err(e) if is_transient(&e) => last_err = Some(e),
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Err(match last_err {
                        Some(e) => e.into(),
                        None => $crate::StoreError::Contention(format!(
                            "begin lost {BEGIN_ATTEMPTS} races in a row for one key"
                        )),
                    })
                })
            }

            fn complete<'a>(
                &'a self,
                key: &'a $crate::ScopedKey,
                token: $crate::LeaseToken,
                completion: &'a $crate::Completion,
                now: $crate::Millis,
                expires_at: $crate::Millis,
            ) -> $crate::store::StoreFuture<'a, $crate::Finish> {
                Box::pin(async move {
                    let (state, status, headers, body) =
                        $crate::store::codec::completion_columns(completion);
                    let r = sqlx::query::<$Db>($complete)
                        .bind(state)
                        .bind(status)
                        .bind(headers)
                        .bind(body)
                        .bind(expires_at)
                        .bind(now)
                        .bind(key.tenant())
                        .bind(key.key().as_str())
                        .bind(token.0)
                        .execute(&self.pool)
                        .await?;
                    Ok($crate::Finish::fenced(r.rows_affected()))
                })
            }

            fn release<'a>(
                &'a self,
                key: &'a $crate::ScopedKey,
                token: $crate::LeaseToken,
            ) -> $crate::store::StoreFuture<'a, $crate::Finish> {
                Box::pin(async move {
                    let r = sqlx::query::<$Db>($release)
                        .bind(key.tenant())
                        .bind(key.key().as_str())
                        .bind(token.0)
                        .execute(&self.pool)
                        .await?;
                    Ok($crate::Finish::fenced(r.rows_affected()))
                })
            }

            fn reap(
                &self,
                now: $crate::Millis,
                limit: u32,
            ) -> $crate::store::StoreFuture<'_, $crate::Reaped> {
                Box::pin(async move {
                    let r = sqlx::query::<$Db>($reap)
                        .bind(now)
                        .bind(i64::from(limit))
                        .execute(&self.pool)
                        .await?;
                    let removed = r.rows_affected();
                    Ok($crate::Reaped {
                        removed,
                        more: removed >= u64::from(limit),
                    })
                })
            }
        }
    };
}

pub(crate) use sql_store;
