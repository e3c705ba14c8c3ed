//! A payment endpoint behind the `Idempotency-Key` layer, on the embedded SQLite store.
//!
//! ```text
//! cargo run --example axum_payment            # serve on 127.0.0.1:3000
//! cargo run --example axum_payment -- --demo  # serve on an ephemeral port, send a few requests, exit
//! ```
//!
//! Then, for example:
//!
//! ```text
//! curl -i -X POST localhost:3000/payments -H 'x-api-key: acme' -H 'content-type: application/json' \
//!      -H 'Idempotency-Key: "order-17"' -d '{"amount": 1250, "currency": "EUR"}'
//! ```
//!
//! Send it twice: the second answer is the first one, byte for byte, with
//! `Idempotent-Replayed: true`, and only one payment row and one outbox message exist. The
//! payment and its `payment.created` event are written in one transaction (the outbox), and a
//! relay publishes the event (here: logs it) with a stable event id.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{BoxError, Json, Router};
use serde::Deserialize;
use stormguard_idempotency::exactly_once::sqlite::{Relay, enqueue};
use stormguard_idempotency::exactly_once::{OutboxMessage, Publisher};
use stormguard_idempotency::store::sqlite::SqliteStore;
use stormguard_idempotency::{IdempotencyLayer, InFlight, Reaper, WallClock};

#[derive(Clone)]
struct AppState {
    pool: sqlx::SqlitePool,
}

#[derive(Deserialize)]
struct PaymentRequest {
    amount: i64,
    currency: String,
}

async fn create_payment(
    State(app): State<AppState>,
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
    // The business row and its event: both or neither.
    let mut tx = app.pool.begin().await.map_err(internal)?;
    sqlx::query("INSERT INTO payments (id, tenant, amount, currency) VALUES (?, ?, ?, ?)")
        .bind(&id)
        .bind(&tenant)
        .bind(req.amount)
        .bind(&req.currency)
        .execute(&mut *tx)
        .await
        .map_err(internal)?;
    let event =
        serde_json::json!({ "payment": id, "amount": req.amount, "currency": req.currency });
    enqueue(
        &mut tx,
        &OutboxMessage::new("payment.created", event.to_string()),
        now,
    )
    .await
    .map_err(internal)?;
    tx.commit().await.map_err(internal)?;
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
struct LogPublisher;

impl Publisher for LogPublisher {
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = std::env::args().any(|a| a == "--demo");
    let dir = std::env::temp_dir().join(format!("stormguard-payment-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = SqliteStore::open(dir.join("payments.db")).await?;
    store.migrate().await?;
    let pool = store.pool().clone();
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS payments (
            id TEXT PRIMARY KEY, tenant TEXT NOT NULL, amount INTEGER NOT NULL, currency TEXT NOT NULL)",
    )
    .execute(&pool)
    .await?;

    let idempotency = IdempotencyLayer::new(store.clone())
        // Keys are scoped by API key: two merchants may both send "order-17".
        .with_tenant(|parts| {
            let key = parts.headers.get("x-api-key")?.to_str().ok()?;
            Some(key.to_owned())
        })
        .with_lease(Duration::from_secs(30))
        // A duplicate that arrives while the first is running waits for its result.
        .with_in_flight(InFlight::wait(Duration::from_secs(5)));
    let reaper = Reaper::new(std::sync::Arc::new(store)).spawn();
    let relay = tokio::spawn({
        let relay = Relay::new(pool.clone());
        async move {
            loop {
                if let Err(e) = relay
                    .run_once(&LogPublisher, WallClock::system().now_millis())
                    .await
                {
                    eprintln!("relay: {e}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });

    let app = Router::new()
        .route("/payments", post(create_payment))
        .route_layer(idempotency)
        .with_state(AppState { pool: pool.clone() });

    let addr: SocketAddr = if demo {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    }
    .parse()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    if demo {
        run_demo(addr).await?;
        tokio::time::sleep(Duration::from_millis(500)).await; // let the relay publish
        let (payments,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM payments")
            .fetch_one(&pool)
            .await?;
        println!("payments stored: {payments}");
        server.abort();
        relay.abort();
        reaper.abort();
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    server.await??;
    Ok(())
}

async fn run_demo(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    use http_body_util::{BodyExt as _, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let client: Client<_, Full<bytes::Bytes>> = Client::builder(TokioExecutor::new()).build_http();
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
            Ok::<_, Box<dyn std::error::Error>>((status, replayed, body))
        }
    };
    let pay = r#"{"amount": 1250, "currency": "EUR"}"#;
    for (what, key, tenant, body) in [
        ("first request", Some("\"order-17\""), "acme", pay),
        ("retry (same key)", Some("\"order-17\""), "acme", pay),
        (
            "same key, other merchant",
            Some("\"order-17\""),
            "globex",
            pay,
        ),
        (
            "same key, other amount",
            Some("\"order-17\""),
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
