//! Faults on purpose: a store wrapper that fails or hangs its calls, and a TCP proxy that
//! cuts or stalls a networked store's connection.

use super::*;

/// What a [`FaultyStore`] does to the calls that reach its backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Every call reaches the backend.
    Healthy,
    /// Calls fail at once (connections cut and refused; SQLite: read-only).
    Failing,
    /// Calls hang (bytes not forwarded; SQLite: its only connection held).
    Hanging,
}

/// A store on this test's records whose backend can be made to fail or hang, and healed.
pub struct FaultyStore {
    pub store: Arc<dyn Store>,
    switch: Switch,
}

enum Switch {
    #[cfg(feature = "sqlite")]
    Sqlite {
        pool: sqlx::SqlitePool,
        held: tokio::sync::Mutex<Option<sqlx::pool::PoolConnection<sqlx::Sqlite>>>,
    },
    Proxy(SwitchProxy),
}

impl FaultyStore {
    pub async fn set(&self, fault: Fault) {
        match &self.switch {
            #[cfg(feature = "sqlite")]
            Switch::Sqlite { pool, held } => {
                let mut held = held.lock().await;
                // Give the connection back (if held), then set the pragma on it.
                drop(held.take());
                let mut conn = pool.acquire().await.expect("the only connection");
                let pragma = if fault == Fault::Failing {
                    "PRAGMA query_only = ON"
                } else {
                    "PRAGMA query_only = OFF"
                };
                sqlx::query::<sqlx::Sqlite>(pragma)
                    .execute(&mut *conn)
                    .await
                    .expect("pragma");
                if fault == Fault::Hanging {
                    *held = Some(conn);
                }
            }
            Switch::Proxy(proxy) => proxy.set(fault),
        }
    }
}

impl TestEnv {
    /// A [`FaultyStore`] over this test's records, healthy to begin with.
    pub async fn faulty_store(&self) -> FaultyStore {
        match &self.ns {
            #[cfg(feature = "sqlite")]
            Namespace::SqliteFile { path, .. } => {
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(path)
                    .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(10));
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(30))
                    .connect_with(options)
                    .await
                    .expect("sqlite pool");
                let store =
                    stormguard_idempotency::store::sqlite::SqliteStore::from_pool(pool.clone());
                FaultyStore {
                    store: Arc::new(store),
                    switch: Switch::Sqlite {
                        pool,
                        held: tokio::sync::Mutex::new(None),
                    },
                }
            }
            #[cfg(feature = "sqlite")]
            Namespace::SqliteMemory { store } => FaultyStore {
                // The memory database exists only behind its one connection: fault that one.
                store: Arc::new(store.clone()),
                switch: Switch::Sqlite {
                    pool: store.pool().clone(),
                    held: tokio::sync::Mutex::new(None),
                },
            },
            #[cfg(feature = "postgres")]
            Namespace::Postgres { url, schema, .. } => {
                let proxy = SwitchProxy::start(target_of(url, 5432)).await;
                let pool = pg_pool(url, schema, Some(proxy.addr)).await;
                let store = stormguard_idempotency::store::postgres::PostgresStore::from_pool(pool);
                FaultyStore {
                    store: Arc::new(store),
                    switch: Switch::Proxy(proxy),
                }
            }
            #[cfg(feature = "mysql")]
            Namespace::MySql { url, database, .. } => {
                let proxy = SwitchProxy::start(target_of(url, 3306)).await;
                let pool = mysql_pool(url, database, Some(proxy.addr)).await;
                let store = stormguard_idempotency::store::mysql::MySqlStore::from_pool(pool);
                FaultyStore {
                    store: Arc::new(store),
                    switch: Switch::Proxy(proxy),
                }
            }
            #[cfg(feature = "redis")]
            Namespace::Redis { url, prefix } => {
                let proxy = SwitchProxy::start(target_of(url, 6379)).await;
                let via = format!("redis://{}/", proxy.addr);
                let store = stormguard_idempotency::store::redis::RedisStore::connect(&via, prefix)
                    .await
                    .expect("redis via proxy");
                FaultyStore {
                    store: Arc::new(store),
                    switch: Switch::Proxy(proxy),
                }
            }
        }
    }

    /// Overwrites the stored record of `key` with bytes no store can decode.
    pub async fn corrupt(&self, key: &stormguard_idempotency::ScopedKey) {
        let (tenant, k) = (key.tenant().to_owned(), key.key().as_str().to_owned());
        // A header list cut off in the middle of a name.
        let garbage: &[u8] = &[0, 9, b'x'];
        match &self.ns {
            #[cfg(feature = "sqlite")]
            Namespace::SqliteFile { store, .. } | Namespace::SqliteMemory { store } => {
                sqlx::query("UPDATE stormguard_idempotency SET headers = ? WHERE tenant = ? AND idem_key = ?")
                    .bind(garbage)
                    .bind(tenant)
                    .bind(k)
                    .execute(store.pool())
                    .await
                    .expect("corrupt");
            }
            #[cfg(feature = "postgres")]
            Namespace::Postgres { pool, .. } => {
                sqlx::query("UPDATE stormguard_idempotency SET headers = $1 WHERE tenant = $2 AND idem_key = $3")
                    .bind(garbage)
                    .bind(tenant)
                    .bind(k)
                    .execute(pool)
                    .await
                    .expect("corrupt");
            }
            #[cfg(feature = "mysql")]
            Namespace::MySql { pool, .. } => {
                sqlx::query("UPDATE stormguard_idempotency SET headers = ? WHERE tenant = ? AND idem_key = ?")
                    .bind(garbage)
                    .bind(tenant)
                    .bind(k)
                    .execute(pool)
                    .await
                    .expect("corrupt");
            }
            #[cfg(feature = "redis")]
            Namespace::Redis { url, prefix } => {
                let client = redis::Client::open(url.as_str()).expect("redis url");
                let mut conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("redis");
                let rkey = format!("{prefix}{}:{tenant}:{k}", tenant.len());
                let v: Vec<u8> = redis::cmd("GET")
                    .arg(&rkey)
                    .query_async(&mut conn)
                    .await
                    .expect("get");
                assert!(v.len() >= 113, "a completed record to corrupt");
                // Keep the fixed-width head, cut the payload.
                let mut broken = v[..113].to_vec();
                broken.extend_from_slice(garbage);
                let _: () = redis::cmd("SET")
                    .arg(&rkey)
                    .arg(broken)
                    .arg("KEEPTTL")
                    .query_async(&mut conn)
                    .await
                    .expect("set");
            }
        }
    }
}

/// A TCP proxy on 127.0.0.1 in front of one server, switchable between forwarding, cutting
/// every connection, and holding every byte.
pub struct SwitchProxy {
    pub addr: SocketAddr,
    mode: tokio::sync::watch::Sender<Fault>,
    _tasks: JoinSet<()>,
}

impl SwitchProxy {
    pub async fn start(target: SocketAddr) -> SwitchProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let (mode, watch) = tokio::sync::watch::channel(Fault::Healthy);
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    break;
                };
                if *watch.borrow() == Fault::Failing {
                    continue; // dropped: refused
                }
                let watch = watch.clone();
                conns.spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(target).await {
                        pump(inbound, outbound, watch).await;
                    }
                });
            }
        });
        SwitchProxy {
            addr,
            mode,
            _tasks: tasks,
        }
    }

    pub fn set(&self, fault: Fault) {
        self.mode.send_replace(fault);
    }
}

/// Forwards both ways while healthy, holds everything while hanging, and closes both sides
/// when failing.
async fn pump(mut a: TcpStream, mut b: TcpStream, mut watch: tokio::sync::watch::Receiver<Fault>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (mut abuf, mut bbuf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        let mode = *watch.borrow_and_update();
        match mode {
            Fault::Failing => return,
            Fault::Hanging => {
                if watch.changed().await.is_err() {
                    return;
                }
            }
            Fault::Healthy => {
                tokio::select! {
                    n = a.read(&mut abuf) => match n {
                        Ok(0) | Err(_) => return,
                        Ok(n) => if b.write_all(&abuf[..n]).await.is_err() { return },
                    },
                    n = b.read(&mut bbuf) => match n {
                        Ok(0) | Err(_) => return,
                        Ok(n) => if a.write_all(&bbuf[..n]).await.is_err() { return },
                    },
                    changed = watch.changed() => if changed.is_err() { return },
                }
            }
        }
    }
}
