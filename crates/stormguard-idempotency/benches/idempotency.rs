//! Store throughput of the idempotency layer beside the same store's raw statements.
//!
//! ```text
//! source .ci/stores.sh && cargo bench -p stormguard-idempotency --all-features --bench idempotency
//! cargo bench -p stormguard-idempotency --all-features --bench idempotency -- postgres redis  # some stores
//! ```
//!
//! For each store, in one run:
//!
//! - **layer**: unique-key `POST`s (claim, handler, complete) from `CONC` concurrent HTTP
//!   clients on loopback through the layer, with the store as its `connect` builds it;
//! - **raw**: the equivalent raw statements per request (SQL: one `INSERT` of the record, one
//!   `UPDATE` completing it, prepared and autocommitted, through a pool of the same size;
//!   Redis: `SET NX PX` then `SET XX PX`) from `CONC` concurrent tasks, no HTTP;
//! - **round trips / request**: the store's connections counted through a TCP proxy during
//!   sequential requests (a round trip is each time the client speaks after the server did),
//!   for a new key and for a replay;
//! - **commits and WAL syncs / request** for PostgreSQL (`pg_stat_database.xact_commit`,
//!   `pg_stat_wal.wal_sync`) and MariaDB (`Handler_commit`, and `Innodb_os_log_fsyncs` or,
//!   where MariaDB no longer has it, `Innodb_data_fsyncs`);
//! - **external peers**: `pgbench` with the same two statements and `redis-benchmark` with
//!   `SET NX PX`, when the tools are installed.
//!
//! Figures on a shared 2-core machine are noisy; compare within one run.

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use stormguard_idempotency::{IdempotencyLayer, Store};
use support::Http;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

const CONC: usize = 16;
const TOTAL: usize = 6_000;
const SEQ: usize = 300;

fn app(layer: Option<IdempotencyLayer>) -> Router {
    let router = Router::new().route(
        "/pay",
        post(|| async {
            (
                StatusCode::CREATED,
                [
                    ("content-type", "application/json"),
                    ("location", "/payments/1"),
                ],
                r#"{"id":"pay_1","amount":1250,"currency":"EUR","status":"captured"}"#,
            )
                .into_response()
        }),
    );
    match layer {
        Some(layer) => router.route_layer(layer),
        None => router,
    }
}

static NEXT: AtomicU64 = AtomicU64::new(0);

fn fresh_key() -> String {
    format!(
        "bench-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn one(client: &Http, key: &str) {
    let r = client
        .post("/pay", key, r#"{"amount":1250,"currency":"EUR"}"#)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
}

/// Requests per second of `op` run `TOTAL` times from `CONC` tasks.
async fn rate<F, Fut>(op: F) -> f64
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONC {
        let (op, next) = (op.clone(), Arc::clone(&next));
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= TOTAL {
                    break;
                }
                op(i).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    TOTAL as f64 / start.elapsed().as_secs_f64()
}

async fn layer_rate(client: &Http) -> f64 {
    // Warm up connections and statement caches.
    for _ in 0..100 {
        one(client, &fresh_key()).await;
    }
    let client = client.clone();
    rate(move |_| {
        let client = client.clone();
        async move { one(&client, &fresh_key()).await }
    })
    .await
}

/// A TCP proxy that counts round trips: each time a client speaks after the server did.
struct Counter {
    addr: SocketAddr,
    turns: Arc<AtomicU64>,
}

impl Counter {
    async fn start(target: SocketAddr) -> Counter {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let turns = Arc::new(AtomicU64::new(0));
        let t = Arc::clone(&turns);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let t = Arc::clone(&t);
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(target).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        count(client, server, t).await;
                    }
                });
            }
        });
        Counter { addr, turns }
    }

    fn turns(&self) -> u64 {
        self.turns.load(Ordering::Relaxed)
    }
}

async fn count(mut client: TcpStream, mut server: TcpStream, turns: Arc<AtomicU64>) {
    let (mut cb, mut sb) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let mut client_spoke_last = false;
    loop {
        tokio::select! {
            n = client.read(&mut cb) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if !client_spoke_last {
                        turns.fetch_add(1, Ordering::Relaxed);
                        client_spoke_last = true;
                    }
                    if server.write_all(&cb[..n]).await.is_err() { return }
                }
            },
            n = server.read(&mut sb) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    client_spoke_last = false;
                    if client.write_all(&sb[..n]).await.is_err() { return }
                }
            },
        }
    }
}

/// Round trips per request for new keys and for replays, through `store` (reached via
/// `counter`), sequentially.
async fn round_trips(store: Arc<dyn Store>, counter: &Counter) -> (f64, f64) {
    let client = Http::new(support::serve(app(Some(IdempotencyLayer::from_arc(store)))).await);
    for _ in 0..20 {
        one(&client, &fresh_key()).await;
    }
    let before = counter.turns();
    for _ in 0..SEQ {
        one(&client, &fresh_key()).await;
    }
    let new = (counter.turns() - before) as f64 / SEQ as f64;
    let key = fresh_key();
    one(&client, &key).await;
    let before = counter.turns();
    for _ in 0..SEQ {
        one(&client, &key).await;
    }
    let replay = (counter.turns() - before) as f64 / SEQ as f64;
    (new, replay)
}

struct Row {
    store: &'static str,
    layer: f64,
    raw: f64,
    rt_new: Option<(f64, f64)>,
    commits: String,
    peer: String,
}

fn print(no_layer: f64, rows: &[Row]) {
    println!();
    println!("HTTP without the layer: {no_layer:.0} req/s ({CONC} clients)");
    println!(
        "{:<10} {:>11} {:>13} {:>7} {:>17} {:<44} external peer",
        "store",
        "layer req/s",
        "raw req/s",
        "ratio",
        "RT new / replay",
        "commits, syncs / new-key request"
    );
    for r in rows {
        let rt = r
            .rt_new
            .map(|(n, p)| format!("{n:.2} / {p:.2}"))
            .unwrap_or_else(|| "in-process".into());
        println!(
            "{:<10} {:>11.0} {:>13.0} {:>6.0}% {:>17} {:<44} {}",
            r.store,
            r.layer,
            r.raw,
            100.0 * r.layer / r.raw,
            rt,
            r.commits,
            r.peer
        );
    }
    println!(
        "(raw = the store's two statements per request without HTTP or layer; RT = round trips to the store per request)"
    );
}

fn tool_output(cmd: &mut std::process::Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

// --- SQLite ------------------------------------------------------------------------------

async fn sqlite(dir: &std::path::Path) -> Row {
    use stormguard_idempotency::store::sqlite::SqliteStore;
    let layer_store = SqliteStore::open(dir.join("layer.db")).await.expect("open");
    layer_store.migrate().await.expect("migrate");
    let client = Http::new(support::serve(app(Some(IdempotencyLayer::new(layer_store)))).await);
    let layer = layer_rate(&client).await;

    let raw_store = SqliteStore::open(dir.join("raw.db")).await.expect("open");
    raw_store.migrate().await.expect("migrate");
    let pool = raw_store.pool().clone();
    let raw = rate(move |i| {
        let pool = pool.clone();
        async move {
            let key = format!("raw-{i}");
            sqlx::query("INSERT INTO stormguard_idempotency (tenant, idem_key, state, fingerprint, lease_token, lease_until, expires_at, created_at) VALUES ('', ?, 0, ?, 1, 1, 1, 1) ON CONFLICT (tenant, idem_key) DO NOTHING")
                .bind(&key)
                .bind(&[7u8; 32][..])
                .execute(&pool)
                .await
                .expect("insert");
            sqlx::query("UPDATE stormguard_idempotency SET state = 1, status = 201, headers = ?, body = ?, expires_at = 2, lease_until = 2 WHERE tenant = '' AND idem_key = ? AND lease_token = 1 AND state = 0")
                .bind(&b"content-type"[..])
                .bind(&b"{\"id\":\"pay_1\"}"[..])
                .bind(&key)
                .execute(&pool)
                .await
                .expect("update");
        }
    })
    .await;
    Row {
        store: "sqlite",
        layer,
        raw,
        rt_new: None,
        commits: "2 statements, 2 commits (WAL, synchronous=NORMAL: no fsync per commit)".into(),
        peer: String::new(),
    }
}

// --- PostgreSQL --------------------------------------------------------------------------

async fn pg_counters(pool: &sqlx::PgPool) -> (i64, i64) {
    // Backends publish their statistics when idle for a second.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let commits: i64 = sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .expect("stats");
    let syncs: i64 = sqlx::query_scalar("SELECT wal_sync FROM pg_stat_wal")
        .fetch_one(pool)
        .await
        .expect("wal stats");
    (commits, syncs)
}

async fn postgres(url: &str) -> Row {
    use sqlx::Connection as _;
    use stormguard_idempotency::store::postgres::PostgresStore;
    let schema = format!("sgbench_{}", std::process::id());
    let mut admin = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::raw_sql(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    ))
    .execute(&mut admin)
    .await
    .expect("schema");
    let target = support::target_of(url, 5432);
    let with = |addr: SocketAddr| {
        let mut u = url::Url::parse(url).expect("url");
        let _ = u.set_ip_host(addr.ip());
        let _ = u.set_port(Some(addr.port()));
        u.query_pairs_mut()
            .append_pair("options", &format!("-c search_path={schema}"));
        u.to_string()
    };
    let store = PostgresStore::connect(&with(target)).await.expect("store");
    store.migrate().await.expect("migrate");
    let stats = sqlx::PgPool::connect(url).await.expect("stats pool");
    let client = Http::new(support::serve(app(Some(IdempotencyLayer::new(store.clone())))).await);
    let (c0, s0) = pg_counters(&stats).await;
    let layer = layer_rate(&client).await;
    let (c1, s1) = pg_counters(&stats).await;
    let per = |d: i64| d as f64 / (TOTAL + 100) as f64;
    let commits = format!("{:.2} commits, {:.2} WAL syncs", per(c1 - c0), per(s1 - s0));

    let pool = store.pool().clone();
    let (c0, s0) = pg_counters(&stats).await;
    let raw = rate(move |i| {
        let pool = pool.clone();
        async move {
            let key = format!("raw-{i}");
            sqlx::query("INSERT INTO stormguard_idempotency (tenant, idem_key, state, fingerprint, lease_token, lease_until, expires_at, created_at) VALUES ('', $1, 0, $2, 1, 1, 1, 1) ON CONFLICT (tenant, idem_key) DO NOTHING")
                .bind(&key)
                .bind(&[7u8; 32][..])
                .execute(&pool)
                .await
                .expect("insert");
            sqlx::query("UPDATE stormguard_idempotency SET state = 1, status = 201, headers = $1, body = $2, expires_at = 2, lease_until = 2 WHERE tenant = '' AND idem_key = $3 AND lease_token = 1 AND state = 0")
                .bind(&b"content-type"[..])
                .bind(&b"{\"id\":\"pay_1\"}"[..])
                .bind(&key)
                .execute(&pool)
                .await
                .expect("update");
        }
    })
    .await;
    let (c1, s1) = pg_counters(&stats).await;
    let raw_commits = format!(
        "raw: {:.2} commits, {:.2} syncs",
        c1.saturating_sub(c0) as f64 / TOTAL as f64,
        s1.saturating_sub(s0) as f64 / TOTAL as f64
    );

    let counter = Counter::start(target).await;
    let counted = PostgresStore::connect(&with(counter.addr))
        .await
        .expect("store");
    let rt = round_trips(Arc::new(counted), &counter).await;

    // pgbench: the same two statements, CONC clients.
    let script = std::env::temp_dir().join(format!("sgbench-{}.sql", std::process::id()));
    let _ = std::fs::write(
        &script,
        format!(
            "\\set k random(1, 1000000000)\n\
             INSERT INTO {schema}.stormguard_idempotency (tenant, idem_key, state, fingerprint, lease_token, lease_until, expires_at, created_at) VALUES ('pgbench', :k || '-' || :client_id, 0, '\\x00', 1, 1, 1, 1) ON CONFLICT (tenant, idem_key) DO NOTHING;\n\
             UPDATE {schema}.stormguard_idempotency SET state = 1, status = 201, headers = '\\x00', body = '\\x00', expires_at = 2, lease_until = 2 WHERE tenant = 'pgbench' AND idem_key = :k || '-' || :client_id AND lease_token = 1 AND state = 0;\n"
        ),
    );
    let u = url::Url::parse(url).expect("url");
    let peer = tool_output(
        std::process::Command::new("pgbench")
            .args([
                "-n",
                "-M",
                "prepared",
                "-c",
                &CONC.to_string(),
                "-j",
                "2",
                "-T",
                "5",
                "-f",
            ])
            .arg(&script)
            .args([
                "-h",
                u.host_str().unwrap_or("127.0.0.1"),
                "-p",
                &u.port().unwrap_or(5432).to_string(),
            ])
            .args([
                "-U",
                if u.username().is_empty() {
                    "postgres"
                } else {
                    u.username()
                },
            ])
            .arg(u.path().trim_start_matches('/')),
    )
    .and_then(|out| {
        out.lines()
            .find(|l| l.starts_with("tps"))
            .map(|l| format!("pgbench {}", l.split_whitespace().nth(2).unwrap_or("?")))
    })
    .unwrap_or_else(|| "pgbench not run".into());
    let _ = std::fs::remove_file(&script);
    let _ = sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .execute(&mut admin)
        .await;
    Row {
        store: "postgres",
        layer,
        raw,
        rt_new: Some(rt),
        commits: format!("{commits} ({raw_commits})"),
        peer: format!("{peer} tps (2 statements each)"),
    }
}

// --- MariaDB / MySQL ---------------------------------------------------------------------

async fn mysql_counters(pool: &sqlx::MySqlPool) -> (i64, i64) {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Handler_commit', 'Innodb_os_log_fsyncs', 'Innodb_data_fsyncs')",
    )
    .fetch_all(pool)
    .await
    .expect("status");
    let get = |name: &str| {
        rows.iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    };
    // MySQL counts log fsyncs; MariaDB 10.11 only counts all InnoDB fsyncs.
    let log = get("Innodb_os_log_fsyncs");
    (
        get("Handler_commit"),
        if log > 0 {
            log
        } else {
            get("Innodb_data_fsyncs")
        },
    )
}

async fn mysql(url: &str) -> Row {
    use sqlx::Connection as _;
    use stormguard_idempotency::store::mysql::MySqlStore;
    let database = format!("sgbench_{}", std::process::id());
    let mut admin = sqlx::MySqlConnection::connect(url).await.expect("connect");
    sqlx::raw_sql(&format!(
        "DROP DATABASE IF EXISTS {database}; CREATE DATABASE {database}"
    ))
    .execute(&mut admin)
    .await
    .expect("database");
    let target = support::target_of(url, 3306);
    let with = |addr: SocketAddr| {
        let mut u = url::Url::parse(url).expect("url");
        let _ = u.set_ip_host(addr.ip());
        let _ = u.set_port(Some(addr.port()));
        u.set_path(&database);
        u.to_string()
    };
    let store = MySqlStore::connect(&with(target)).await.expect("store");
    store.migrate().await.expect("migrate");
    let stats = sqlx::MySqlPool::connect(url).await.expect("stats pool");
    let client = Http::new(support::serve(app(Some(IdempotencyLayer::new(store.clone())))).await);
    let (c0, s0) = mysql_counters(&stats).await;
    let layer = layer_rate(&client).await;
    let (c1, s1) = mysql_counters(&stats).await;
    let per = |d: i64| d as f64 / (TOTAL + 100) as f64;
    let commits = format!("{:.2} commits, {:.2} fsyncs", per(c1 - c0), per(s1 - s0));
    let pool = store.pool().clone();
    let (c0, s0) = mysql_counters(&stats).await;
    let raw = rate(move |i| {
        let pool = pool.clone();
        async move {
            let key = format!("raw-{i}");
            sqlx::query("INSERT INTO stormguard_idempotency (tenant, idem_key, state, fingerprint, lease_token, lease_until, expires_at, created_at) VALUES ('', ?, 0, ?, 1, 1, 1, 1)")
                .bind(&key)
                .bind(&[7u8; 32][..])
                .execute(&pool)
                .await
                .expect("insert");
            sqlx::query("UPDATE stormguard_idempotency SET state = 1, status = 201, headers = ?, body = ?, expires_at = 2, lease_until = 2 WHERE tenant = '' AND idem_key = ? AND lease_token = 1 AND state = 0")
                .bind(&b"content-type"[..])
                .bind(&b"{\"id\":\"pay_1\"}"[..])
                .bind(&key)
                .execute(&pool)
                .await
                .expect("update");
        }
    })
    .await;
    let (c1, s1) = mysql_counters(&stats).await;
    let raw_commits = format!(
        "raw: {:.2} commits, {:.2} fsyncs",
        (c1 - c0) as f64 / TOTAL as f64,
        (s1 - s0) as f64 / TOTAL as f64
    );
    let counter = Counter::start(target).await;
    let counted = MySqlStore::connect(&with(counter.addr))
        .await
        .expect("store");
    let rt = round_trips(Arc::new(counted), &counter).await;
    let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {database}"))
        .execute(&mut admin)
        .await;
    Row {
        store: "mariadb",
        layer,
        raw,
        rt_new: Some(rt),
        commits: format!("{commits} ({raw_commits})"),
        peer: String::new(),
    }
}

// --- Redis -------------------------------------------------------------------------------

async fn redis_store(url: &str) -> Row {
    use stormguard_idempotency::store::redis::RedisStore;
    let prefix = format!("sgbench{}:", std::process::id());
    let target = support::target_of(url, 6379);
    let store = RedisStore::connect(url, &prefix).await.expect("store");
    let client = Http::new(support::serve(app(Some(IdempotencyLayer::new(store)))).await);
    let layer = layer_rate(&client).await;
    let conn = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let raw_prefix = prefix.clone();
    let raw = rate(move |i| {
        let (mut conn, key) = (conn.clone(), format!("{raw_prefix}raw-{i}"));
        async move {
            let _: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg("0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000")
                .arg("NX")
                .arg("PX")
                .arg(86_400_000)
                .query_async(&mut conn)
                .await
                .expect("set nx");
            let _: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg("1000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000{\"id\":\"pay_1\"}")
                .arg("XX")
                .arg("PX")
                .arg(86_400_000)
                .query_async(&mut conn)
                .await
                .expect("set xx");
        }
    })
    .await;
    let counter = Counter::start(target).await;
    let counted = RedisStore::connect(&format!("redis://{}/", counter.addr), &prefix)
        .await
        .expect("store");
    let rt = round_trips(Arc::new(counted), &counter).await;
    let u = url::Url::parse(url).expect("url");
    let peer = tool_output(
        std::process::Command::new("redis-benchmark")
            .args([
                "-h",
                u.host_str().unwrap_or("127.0.0.1"),
                "-p",
                &u.port().unwrap_or(6379).to_string(),
            ])
            .args([
                "-c",
                &CONC.to_string(),
                "-n",
                "100000",
                "-r",
                "100000000",
                "-q",
            ])
            .args([
                "SET",
                &format!("{prefix}rb:__rand_int__"),
                "v",
                "NX",
                "PX",
                "60000",
            ]),
    )
    .map(|out| {
        let line = out.lines().last().unwrap_or_default().to_owned();
        let rps = line
            .split_whitespace()
            .find_map(|w| w.parse::<f64>().ok())
            .unwrap_or(0.0);
        format!(
            "redis-benchmark SET NX PX: {rps:.0}/s = {:.0} two-command req/s",
            rps / 2.0
        )
    })
    .unwrap_or_else(|| "redis-benchmark not run".into());
    if let Ok(client) = redis::Client::open(url) {
        if let Ok(mut c) = client.get_multiplexed_async_connection().await {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{prefix}*"))
                .query_async(&mut c)
                .await
                .unwrap_or_default();
            for chunk in keys.chunks(1000) {
                let _: Result<i64, _> = redis::cmd("DEL").arg(chunk).query_async(&mut c).await;
            }
        }
    }
    Row {
        store: "redis",
        layer,
        raw,
        rt_new: Some(rt),
        commits: "no persistence (appendonly no)".into(),
        peer,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; other arguments select stores by name.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let url = |var: &str| std::env::var(var).ok().filter(|u| !u.is_empty());

    let base = Http::new(support::serve(app(None)).await);
    let no_layer = layer_rate(&base).await;
    let mut rows = Vec::new();
    let dir = tempfile::tempdir().expect("tempdir");
    if wanted("sqlite") {
        rows.push(sqlite(dir.path()).await);
    }
    for (name, var) in [
        ("postgres", "STORMGUARD_TEST_POSTGRES_URL"),
        ("mysql", "STORMGUARD_TEST_MYSQL_URL"),
        ("redis", "STORMGUARD_TEST_REDIS_URL"),
    ] {
        if !wanted(name) {
            continue;
        }
        let Some(u) = url(var) else {
            eprintln!("SKIPPED: {name}: {var} not set");
            continue;
        };
        rows.push(match name {
            "postgres" => postgres(&u).await,
            "mysql" => mysql(&u).await,
            _ => redis_store(&u).await,
        });
    }
    print(no_layer, &rows);
}
