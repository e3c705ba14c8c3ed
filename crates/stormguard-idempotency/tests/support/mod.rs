//! Shared test support: one isolated namespace per test on each store, a TCP proxy to break a
//! networked store on purpose, and a small HTTP client.
#![allow(dead_code, unreachable_pub, unused_imports, unused_variables)]

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard_idempotency::Store;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

mod faults;
pub use faults::*;

/// The stores the suites run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    SqliteFile,
    SqliteMemory,
    Postgres,
    MySql,
    Redis,
}

impl Backend {
    pub fn env_var(self) -> Option<&'static str> {
        match self {
            Backend::SqliteFile | Backend::SqliteMemory => None,
            Backend::Postgres => Some("STORMGUARD_TEST_POSTGRES_URL"),
            Backend::MySql => Some("STORMGUARD_TEST_MYSQL_URL"),
            Backend::Redis => Some("STORMGUARD_TEST_REDIS_URL"),
        }
    }

    /// The server URL, or `None` after printing loudly (past the test harness's capture) that
    /// the test is skipped. With `STORMGUARD_REQUIRE_ALL_STORES=1` (set by CI) a missing URL
    /// fails the test instead.
    pub fn url(self, test: &str) -> Option<String> {
        let var = self.env_var()?;
        match std::env::var(var) {
            Ok(url) if !url.is_empty() => Some(url),
            _ => {
                if std::env::var("STORMGUARD_REQUIRE_ALL_STORES").as_deref() == Ok("1") {
                    panic!("{var} is not set but STORMGUARD_REQUIRE_ALL_STORES=1");
                }
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: {test} on {self:?}: {var} not set"
                );
                None
            }
        }
    }

    /// A fresh, isolated store for one test, or `None` (printed) when its server is not
    /// configured.
    pub async fn open(self, test: &str) -> Option<TestEnv> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("STORMGUARD_TEST_LOG")
                    .unwrap_or_else(|_| "off".into()),
            )
            .with_test_writer()
            .try_init();
        let ns = unique_name();
        match self {
            Backend::SqliteFile => {
                let dir = tempfile::tempdir().expect("tempdir");
                let path = dir.path().join("idem.db");
                let store = stormguard_idempotency::store::sqlite::SqliteStore::open(&path)
                    .await
                    .expect("open sqlite");
                store.migrate().await.expect("migrate sqlite");
                Some(TestEnv {
                    backend: self,
                    store: Arc::new(store.clone()),
                    ns: Namespace::SqliteFile {
                        _dir: Arc::new(dir),
                        path,
                        store,
                    },
                })
            }
            Backend::SqliteMemory => {
                let store = stormguard_idempotency::store::sqlite::SqliteStore::memory()
                    .await
                    .expect("open sqlite memory");
                store.migrate().await.expect("migrate sqlite");
                Some(TestEnv {
                    backend: self,
                    store: Arc::new(store.clone()),
                    ns: Namespace::SqliteMemory { store },
                })
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres => open_postgres(self, self.url(test)?, ns).await,
            #[cfg(feature = "mysql")]
            Backend::MySql => open_mysql(self, self.url(test)?, ns).await,
            #[cfg(feature = "redis")]
            Backend::Redis => open_redis(self, self.url(test)?, ns).await,
            #[allow(unreachable_patterns)]
            _ => {
                if std::env::var("STORMGUARD_REQUIRE_ALL_STORES").as_deref() == Ok("1") {
                    panic!(
                        "{test} on {self:?}: the crate feature for this store is not enabled but \
                         STORMGUARD_REQUIRE_ALL_STORES=1; run cargo test -p stormguard-idempotency --all-features"
                    );
                }
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: {test} on {self:?}: the crate feature for this store is not enabled (run with --all-features)"
                );
                None
            }
        }
    }
}

fn unique_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "sgt_{}_{}_{:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos & 0xffff_ffff
    )
}

/// A store for one test and what it takes to remove its data afterwards.
pub struct TestEnv {
    pub backend: Backend,
    pub store: Arc<dyn Store>,
    pub ns: Namespace,
}

pub enum Namespace {
    SqliteFile {
        _dir: Arc<tempfile::TempDir>,
        path: std::path::PathBuf,
        store: stormguard_idempotency::store::sqlite::SqliteStore,
    },
    SqliteMemory {
        store: stormguard_idempotency::store::sqlite::SqliteStore,
    },
    #[cfg(feature = "postgres")]
    Postgres {
        url: String,
        schema: String,
        pool: sqlx::PgPool,
    },
    #[cfg(feature = "mysql")]
    MySql {
        url: String,
        database: String,
        pool: sqlx::MySqlPool,
    },
    #[cfg(feature = "redis")]
    Redis { url: String, prefix: String },
}

#[cfg(feature = "postgres")]
async fn open_postgres(backend: Backend, url: String, schema: String) -> Option<TestEnv> {
    use sqlx::Connection as _;
    let mut admin = sqlx::PgConnection::connect(&url)
        .await
        .expect("connect postgres");
    sqlx::raw_sql(&format!("CREATE SCHEMA {schema}"))
        .execute(&mut admin)
        .await
        .expect("create schema");
    let _ = admin.close().await;
    let pool = pg_pool(&url, &schema, None).await;
    let store = stormguard_idempotency::store::postgres::PostgresStore::from_pool(pool.clone());
    store.migrate().await.expect("migrate postgres");
    Some(TestEnv {
        backend,
        store: Arc::new(store),
        ns: Namespace::Postgres { url, schema, pool },
    })
}

#[cfg(feature = "postgres")]
pub async fn pg_pool(url: &str, schema: &str, via: Option<SocketAddr>) -> sqlx::PgPool {
    use std::str::FromStr as _;
    let mut options = sqlx::postgres::PgConnectOptions::from_str(url)
        .expect("postgres url")
        .options([("search_path", schema)]);
    if let Some(addr) = via {
        options = options.host(&addr.ip().to_string()).port(addr.port());
    }
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(if via.is_some() { 1 } else { 30 }))
        .connect_with(options)
        .await
        .expect("postgres pool")
}

#[cfg(feature = "mysql")]
async fn open_mysql(backend: Backend, url: String, database: String) -> Option<TestEnv> {
    use sqlx::Connection as _;
    let mut admin = sqlx::MySqlConnection::connect(&url)
        .await
        .expect("connect mysql");
    sqlx::raw_sql(&format!("CREATE DATABASE {database}"))
        .execute(&mut admin)
        .await
        .expect("create database");
    let _ = admin.close().await;
    let pool = mysql_pool(&url, &database, None).await;
    let store = stormguard_idempotency::store::mysql::MySqlStore::from_pool(pool.clone());
    store.migrate().await.expect("migrate mysql");
    Some(TestEnv {
        backend,
        store: Arc::new(store),
        ns: Namespace::MySql {
            url,
            database,
            pool,
        },
    })
}

#[cfg(feature = "mysql")]
pub async fn mysql_pool(url: &str, database: &str, via: Option<SocketAddr>) -> sqlx::MySqlPool {
    use std::str::FromStr as _;
    let mut options = sqlx::mysql::MySqlConnectOptions::from_str(url)
        .expect("mysql url")
        .database(database);
    if let Some(addr) = via {
        options = options.host(&addr.ip().to_string()).port(addr.port());
    }
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(if via.is_some() { 1 } else { 30 }))
        .connect_with(options)
        .await
        .expect("mysql pool")
}

#[cfg(feature = "redis")]
async fn open_redis(backend: Backend, url: String, ns: String) -> Option<TestEnv> {
    let prefix = format!("{ns}:");
    let store = stormguard_idempotency::store::redis::RedisStore::connect(&url, &prefix)
        .await
        .expect("connect redis");
    Some(TestEnv {
        backend,
        store: Arc::new(store),
        ns: Namespace::Redis { url, prefix },
    })
}

impl TestEnv {
    /// Another handle on the same records (a second "instance").
    pub fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store)
    }

    /// A store on this test's namespace that worked and then lost its backend: SQLite's pool
    /// is closed; networked stores are reached through a proxy that is then killed.
    pub async fn broken_store(&self) -> Arc<dyn Store> {
        match &self.ns {
            Namespace::SqliteFile { path, .. } => {
                let s = stormguard_idempotency::store::sqlite::SqliteStore::open(path)
                    .await
                    .expect("open");
                s.pool().close().await;
                Arc::new(s)
            }
            Namespace::SqliteMemory { .. } => {
                let s = stormguard_idempotency::store::sqlite::SqliteStore::memory()
                    .await
                    .expect("open");
                s.migrate().await.expect("migrate");
                s.pool().close().await;
                Arc::new(s)
            }
            #[cfg(feature = "postgres")]
            Namespace::Postgres { url, schema, .. } => {
                let proxy = Proxy::start(target_of(url, 5432)).await;
                let pool = pg_pool(url, schema, Some(proxy.addr)).await;
                sqlx::query("SELECT 1")
                    .execute(&pool)
                    .await
                    .expect("works via proxy");
                proxy.kill().await;
                Arc::new(stormguard_idempotency::store::postgres::PostgresStore::from_pool(pool))
            }
            #[cfg(feature = "mysql")]
            Namespace::MySql { url, database, .. } => {
                let proxy = Proxy::start(target_of(url, 3306)).await;
                let pool = mysql_pool(url, database, Some(proxy.addr)).await;
                sqlx::query("SELECT 1")
                    .execute(&pool)
                    .await
                    .expect("works via proxy");
                proxy.kill().await;
                Arc::new(stormguard_idempotency::store::mysql::MySqlStore::from_pool(
                    pool,
                ))
            }
            #[cfg(feature = "redis")]
            Namespace::Redis { url, prefix } => {
                let proxy = Proxy::start(target_of(url, 6379)).await;
                let via = format!("redis://{}/", proxy.addr);
                let s = stormguard_idempotency::store::redis::RedisStore::connect(&via, prefix)
                    .await
                    .expect("redis via proxy");
                proxy.kill().await;
                Arc::new(s)
            }
        }
    }

    /// Removes this test's schema, database, file or keys.
    pub async fn cleanup(self) {
        drop(self.store);
        match self.ns {
            Namespace::SqliteFile { store, .. } | Namespace::SqliteMemory { store } => {
                store.pool().close().await;
            }
            #[cfg(feature = "postgres")]
            Namespace::Postgres { url, schema, pool } => {
                use sqlx::Connection as _;
                pool.close().await;
                if let Ok(mut c) = sqlx::PgConnection::connect(&url).await {
                    let _ = sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                        .execute(&mut c)
                        .await;
                }
            }
            #[cfg(feature = "mysql")]
            Namespace::MySql {
                url,
                database,
                pool,
            } => {
                use sqlx::Connection as _;
                pool.close().await;
                if let Ok(mut c) = sqlx::MySqlConnection::connect(&url).await {
                    let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {database}"))
                        .execute(&mut c)
                        .await;
                }
            }
            #[cfg(feature = "redis")]
            Namespace::Redis { url, prefix } => {
                if let Ok(client) = redis::Client::open(url.as_str()) {
                    if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                        let keys: Vec<String> = redis::cmd("KEYS")
                            .arg(format!("{prefix}*"))
                            .query_async(&mut conn)
                            .await
                            .unwrap_or_default();
                        if !keys.is_empty() {
                            let _: Result<i64, _> =
                                redis::cmd("DEL").arg(keys).query_async(&mut conn).await;
                        }
                    }
                }
            }
        }
    }
}

/// `host:port` of a server URL.
pub fn target_of(url: &str, default_port: u16) -> SocketAddr {
    let u = url::Url::parse(url).expect("url");
    let host = u.host_str().unwrap_or("127.0.0.1");
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    format!("{host}:{}", u.port().unwrap_or(default_port))
        .parse()
        .expect("socket address")
}

/// A TCP proxy on 127.0.0.1 that forwards to one server until killed.
pub struct Proxy {
    pub addr: SocketAddr,
    tasks: JoinSet<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    break;
                };
                conns.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Proxy { addr, tasks }
    }

    /// Stops listening and cuts every connection (dropping the JoinSets aborts them all).
    pub async fn kill(mut self) {
        self.tasks.shutdown().await;
    }
}

/// A minimal HTTP/1 client for the tests.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

/// A response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    /// The `type` of a problem+json body.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.headers
                .get("content-type")
                .map(|v| v.to_str().unwrap_or("")),
            Some("application/problem+json"),
            "not a problem response: {self:?}"
        );
        let v: serde_json::Value = serde_json::from_slice(&self.body).expect("problem json");
        assert_eq!(v["status"].as_u64(), Some(u64::from(self.status.as_u16())));
        v["type"].as_str().unwrap_or_default().to_owned()
    }
}

impl Http {
    pub fn new(addr: SocketAddr) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Http {
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(256)
                .build(connector),
            base: format!("http://{addr}"),
        }
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::from(body.to_owned())))
            .expect("request");
        let res = self.client.request(req).await.expect("http request");
        let (parts, body) = res.into_parts();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.expect("body").to_bytes(),
        }
    }

    /// `POST path` with an `Idempotency-Key` (as an sf-string) and a JSON body.
    pub async fn post(&self, path: &str, key: &str, body: &str) -> Reply {
        let key = format!("\"{key}\"");
        self.send(
            Method::POST,
            path,
            &[
                ("idempotency-key", key.as_str()),
                ("content-type", "application/json"),
            ],
            body,
        )
        .await
    }
}

/// Serves `app` on 127.0.0.1 with an ephemeral port until the test ends.
pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

impl TestEnv {
    #[cfg(feature = "sqlite")]
    pub fn sqlite_pool(&self) -> Option<sqlx::SqlitePool> {
        match &self.ns {
            Namespace::SqliteFile { store, .. } | Namespace::SqliteMemory { store } => {
                Some(store.pool().clone())
            }
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    #[cfg(feature = "postgres")]
    pub fn pg_pool(&self) -> Option<sqlx::PgPool> {
        match &self.ns {
            Namespace::Postgres { pool, .. } => Some(pool.clone()),
            _ => None,
        }
    }

    #[cfg(feature = "mysql")]
    pub fn mysql_pool(&self) -> Option<sqlx::MySqlPool> {
        match &self.ns {
            Namespace::MySql { pool, .. } => Some(pool.clone()),
            _ => None,
        }
    }
}
