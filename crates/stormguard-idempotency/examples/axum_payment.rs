//! A payment endpoint behind the `Idempotency-Key` layer, on any of the four stores.
//!
//! ```text
//! cargo run -p stormguard-idempotency --example axum_payment                      # SQLite file ./axum_payment.db, 127.0.0.1:3000
//! cargo run -p stormguard-idempotency --example axum_payment -- --demo            # ephemeral port, a few requests, exit
//! cargo run -p stormguard-idempotency --all-features --example axum_payment -- \
//!     --store postgres://postgres@127.0.0.1:5432/test --listen 127.0.0.1:3001
//! ```
//!
//! Options:
//!
//! - `--store URL`: where idempotency records live: `sqlite:PATH` (default
//!   `sqlite:axum_payment.db`, kept across restarts), `postgres://…`, `mysql://…` (MariaDB) or
//!   `redis://…`. The payments and their outbox go to the same database for the SQL stores;
//!   with Redis they go to `--database`.
//! - `--database URL`: the payments database when the store is Redis (default
//!   `sqlite:axum_payment.db`).
//! - `--listen ADDR`: the address to serve on (default `127.0.0.1:3000`).
//! - `--demo`: serve on an ephemeral port, send the requests below, print the answers, exit.
//!
//! PostgreSQL, MariaDB and Redis need the crate features `postgres`, `mysql`, `redis`
//! (`--all-features`). Then, for example:
//!
//! ```text
//! curl -i -X POST localhost:3000/payments -H 'x-api-key: acme' -H 'content-type: application/json' \
//!      -H 'Idempotency-Key: "order-17"' -d '{"amount": 1250, "currency": "EUR"}'
//! ```
//!
//! Send it twice: the second answer is the first one, byte for byte, with
//! `Idempotent-Replayed: true`, and only one payment row and one outbox message exist. The
//! payment and its `payment.created` event are written in one transaction (the outbox), and a
//! relay publishes the event (here: prints it) with a stable event id.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{BoxError, Json, Router};
use serde::Deserialize;
use stormguard::deadline::WallClock;
use stormguard_idempotency::exactly_once::{OutboxMessage, Publisher};
use stormguard_idempotency::store::sqlite::SqliteStore;
use stormguard_idempotency::{IdempotencyLayer, InFlight, Reaper, Store};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The payments database: one of the SQL stores' pools.
#[derive(Clone)]
enum Db {
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

/// Runs `$body` with `$p` the pool, `$eo` the database's exactly-once helpers and `$q` a
/// statement with `?` placeholders rewritten for it.
macro_rules! on_db {
    ($db:expr, |$p:ident, $eo:ident, $sql:ident| $body:expr) => {
        match $db {
            Db::Sqlite($p) => {
                use stormguard_idempotency::exactly_once::sqlite as $eo;
                let $sql = |s: &str| s.to_owned();
                $body
            }
            #[cfg(feature = "postgres")]
            Db::Postgres($p) => {
                use stormguard_idempotency::exactly_once::postgres as $eo;
                let $sql = |s: &str| {
                    let mut n = 0;
                    s.split('?')
                        .enumerate()
                        .map(|(i, part)| {
                            if i == 0 {
                                part.to_owned()
                            } else {
                                n += 1;
                                format!("${n}{part}")
                            }
                        })
                        .collect::<String>()
                };
                $body
            }
            #[cfg(feature = "mysql")]
            Db::MySql($p) => {
                use stormguard_idempotency::exactly_once::mysql as $eo;
                let $sql = |s: &str| s.to_owned();
                $body
            }
        }
    };
}

const INSERT_PAYMENT: &str =
    "INSERT INTO payments (id, tenant, amount, currency) VALUES (?, ?, ?, ?)";

#[derive(Deserialize)]
struct PaymentRequest {
    amount: i64,
    currency: String,
}

async fn create_payment(
    State(db): State<Db>,
    headers: HeaderMap,
    Json(req): Json<PaymentRequest>,
) -> Result<impl IntoResponse, (StatusCode, String)> {
    let internal = |e: sqlx::Error| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    if req.amount <= 0 {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount must be positive".into(),
        ));
    }
    let tenant = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let id = format!("pay_{:016x}", rand::random::<u64>());
    let now = WallClock::system().now_millis();
    let event =
        serde_json::json!({ "payment": id, "amount": req.amount, "currency": req.currency });
    let message = OutboxMessage::new("payment.created", event.to_string());
    // The business row and its event: both or neither.
    on_db!(&db, |pool, eo, sql| {
        let mut tx = pool.begin().await.map_err(internal)?;
        sqlx::query(&sql(INSERT_PAYMENT))
            .bind(&id)
            .bind(&tenant)
            .bind(req.amount)
            .bind(&req.currency)
            .execute(&mut *tx)
            .await
            .map_err(internal)?;
        eo::enqueue(&mut tx, &message, now)
            .await
            .map_err(internal)?;
        tx.commit().await.map_err(internal)?;
    });
    let body = serde_json::json!({
        "id": id, "amount": req.amount, "currency": req.currency, "status": "captured"
    });
    Ok((
        StatusCode::CREATED,
        [("location", format!("/payments/{id}"))],
        Json(body),
    ))
}

/// Stands in for a message broker.
struct PrintPublisher;

impl Publisher for PrintPublisher {
    async fn publish(&self, m: &OutboxMessage) -> Result<(), BoxError> {
        println!(
            "relay: published {} event_id={} {}",
            m.topic,
            m.event_id,
            String::from_utf8_lossy(&m.payload)
        );
        Ok(())
    }
}

struct Args {
    store: String,
    database: String,
    listen: SocketAddr,
    demo: bool,
}

const DEFAULT_DB: &str = "sqlite:axum_payment.db";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        store: DEFAULT_DB.into(),
        database: DEFAULT_DB.into(),
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        demo: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match flag.as_str() {
            "--store" => args.store = value("--store")?,
            "--database" => args.database = value("--database")?,
            "--listen" => {
                let v = value("--listen")?;
                args.listen = v
                    .parse()
                    .map_err(|e| format!("--listen {v:?}: {e} (expected HOST:PORT)"))?;
            }
            "--demo" => args.demo = true,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; expected --store URL, --database URL, --listen ADDR or --demo"
                ));
            }
        }
    }
    if args.demo {
        args.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    }
    Ok(args)
}

/// Opens a SQL database (creating the SQLite file if needed), migrates the idempotency and
/// outbox tables, and creates the payments table.
async fn open_sql(url: &str) -> Result<(Db, Arc<dyn Store>), Error> {
    if let Some(path) = url.strip_prefix("sqlite:") {
        let store = SqliteStore::open(path.trim_start_matches("//")).await?;
        store.migrate().await?;
        let pool = store.pool().clone();
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS payments (
                id TEXT PRIMARY KEY, tenant TEXT NOT NULL, amount BIGINT NOT NULL, currency TEXT NOT NULL)",
        )
        .execute(&pool)
        .await?;
        return Ok((Db::Sqlite(pool), Arc::new(store)));
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = stormguard_idempotency::store::postgres::PostgresStore::connect(url).await?;
        store.migrate().await?;
        let pool = store.pool().clone();
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS payments (
                id TEXT PRIMARY KEY, tenant TEXT NOT NULL, amount BIGINT NOT NULL, currency TEXT NOT NULL)",
        )
        .execute(&pool)
        .await?;
        return Ok((Db::Postgres(pool), Arc::new(store)));
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        let url = url.replacen("mariadb://", "mysql://", 1);
        let store = stormguard_idempotency::store::mysql::MySqlStore::connect(&url).await?;
        store.migrate().await?;
        let pool = store.pool().clone();
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS payments (
                id VARCHAR(32) PRIMARY KEY, tenant VARCHAR(255) NOT NULL, amount BIGINT NOT NULL,
                currency VARCHAR(8) NOT NULL) ENGINE = InnoDB",
        )
        .execute(&pool)
        .await?;
        return Ok((Db::MySql(pool), Arc::new(store)));
    }
    Err(format!(
        "unsupported database {url:?}: expected sqlite:PATH, or postgres://… / mysql://… with \
         the crate's `postgres` / `mysql` feature"
    )
    .into())
}

/// The payments database and the idempotency store for `--store` / `--database`.
async fn open(args: &Args) -> Result<(Db, Arc<dyn Store>), Error> {
    if args.store.starts_with("redis://") {
        #[cfg(feature = "redis")]
        {
            let (db, _) = open_sql(&args.database).await?;
            let store = stormguard_idempotency::store::redis::RedisStore::connect(
                &args.store,
                "axum_payment:",
            )
            .await?;
            return Ok((db, Arc::new(store)));
        }
        #[cfg(not(feature = "redis"))]
        return Err("--store redis://… needs the crate's `redis` feature".into());
    }
    open_sql(&args.store).await
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<(), Error> {
    let (db, store) = open(&args).await?;
    let idempotency = IdempotencyLayer::from_arc(Arc::clone(&store))
        // Keys are scoped by API key: two merchants may both send "order-17".
        .with_tenant(|parts| {
            let key = parts.headers.get("x-api-key")?.to_str().ok()?;
            Some(key.to_owned())
        })
        .with_lease(Duration::from_secs(30))
        // A duplicate that arrives while the first is running waits for its result.
        .with_in_flight(InFlight::wait(Duration::from_secs(5)));
    let reaper = Reaper::new(store).spawn();
    let relay = tokio::spawn({
        let db = db.clone();
        async move {
            loop {
                let now = WallClock::system().now_millis();
                let pass = on_db!(&db, |pool, eo, _sql| {
                    eo::Relay::new(pool.clone())
                        .run_once(&PrintPublisher, now)
                        .await
                });
                if let Err(e) = pass {
                    eprintln!("relay: {e}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });

    let app = Router::new()
        .route("/payments", post(create_payment))
        .route_layer(idempotency)
        .with_state(db.clone());
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr} (store {})", args.store);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    if args.demo {
        run_demo(addr).await?;
        tokio::time::sleep(Duration::from_millis(500)).await; // let the relay publish
        server.abort();
        relay.abort();
        reaper.abort();
        return Ok(());
    }
    server.await??;
    Ok(())
}

async fn run_demo(addr: SocketAddr) -> Result<(), Error> {
    use http_body_util::{BodyExt as _, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let client: Client<_, Full<bytes::Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    // A key of its own per run, so that a kept database starts each demo afresh.
    let key = format!("\"order-{:08x}\"", rand::random::<u32>());
    let send = |key: Option<&str>, tenant: &str, body: &str| {
        let mut req = http::Request::post(format!("http://{addr}/payments"))
            .header("content-type", "application/json")
            .header("x-api-key", tenant);
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        let req = req.body(Full::new(bytes::Bytes::from(body.to_owned())));
        let client = client.clone();
        async move {
            let res = client.request(req?).await?;
            let status = res.status();
            let replayed = res.headers().contains_key("idempotent-replayed");
            let body = res.into_body().collect().await?.to_bytes();
            Ok::<_, Error>((status, replayed, body))
        }
    };
    let pay = r#"{"amount": 1250, "currency": "EUR"}"#;
    let k = Some(key.as_str());
    for (what, key, tenant, body) in [
        ("first request", k, "acme", pay),
        ("retry (same key)", k, "acme", pay),
        ("same key, other merchant", k, "globex", pay),
        (
            "same key, other amount",
            k,
            "acme",
            r#"{"amount": 1, "currency": "EUR"}"#,
        ),
        ("no key", None, "acme", pay),
        ("bare-token key", Some("order-17"), "acme", pay),
    ] {
        let (status, replayed, body) = send(key, tenant, body).await?;
        println!(
            "{what:<28} -> {status}{} {}",
            if replayed { " (replayed)" } else { "" },
            String::from_utf8_lossy(&body)
        );
    }
    Ok(())
}
