//! Exactly-once recording, relay and consumer on every database and broker: SQLite with the
//! table broker always; PostgreSQL, MariaDB, Redis Streams, RabbitMQ and NATS JetStream when
//! `STORMGUARD_TEST_POSTGRES_URL` / `_MYSQL_URL` / `_REDIS_URL` / `_AMQP_URL` / `_NATS_URL`
//! are set (a loud SKIPPED otherwise, and a failure with `STORMGUARD_REQUIRE_ALL_STORES=1`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use stormguard_idempotency::exactly_once::{OutboxMessage, Publisher};
use stormguard_payment_callback::broker::{Broker, BrokerUrl};
use stormguard_payment_callback::callback::PaymentCallback;
use stormguard_payment_callback::store::{DatabaseUrl, Recorded, Store, StoreOptions};

fn url_from(var: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("STORMGUARD_REQUIRE_ALL_STORES").as_deref() == Ok("1") {
                panic!("{var} is not set but STORMGUARD_REQUIRE_ALL_STORES=1");
            }
            let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {var} not set");
            None
        }
    }
}

fn prefix(tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("T{}-{tag}-{:x}-", std::process::id(), nanos & 0xffff_ffff)
}

/// Publishes to the broker, and (once) claims failure after publishing, as a relay sees a
/// lost acknowledgement.
struct LossyAck {
    broker: Broker,
    lose_first_ack: AtomicBool,
}

impl Publisher for LossyAck {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), axum::BoxError> {
        self.broker.publish(message, 1).await?;
        if self.lose_first_ack.swap(false, Ordering::SeqCst) {
            return Err("acknowledgement lost".into());
        }
        Ok(())
    }
}

async fn exactly_once(url: DatabaseUrl, broker: BrokerUrl) {
    let store = Store::connect(&url, StoreOptions::default())
        .await
        .expect("connects and migrates");
    let dedups_itself = matches!(broker, BrokerUrl::Nats(_));
    let broker = Broker::connect(&broker, &store).await.expect("broker");
    broker.audit().await.expect("audit");
    let p = prefix(url.kind());
    let orders: Vec<_> = (0..5)
        .map(|i| PaymentCallback::paid(format!("{p}{i}"), format!("W{i}"), 10 + i))
        .collect();
    // Every order recorded by 8 concurrent deliveries: exactly one is new.
    let mut tasks = tokio::task::JoinSet::new();
    for cb in &orders {
        for _ in 0..8 {
            let (store, cb) = (store.clone(), cb.clone());
            tasks.spawn(async move { store.record_payment(&cb, 1).await.expect("recorded") });
        }
    }
    let mut new = 0;
    while let Some(r) = tasks.join_next().await {
        if r.expect("task") == Recorded::New {
            new += 1;
        }
    }
    assert_eq!(new, 5);
    let c = store.counts(&p).await.expect("counts");
    assert_eq!((c.orders, c.outbox, c.outbox_published), (5, 5, 0));

    // The relay publishes; the first acknowledgement is lost, so one message is published
    // twice; the consumer applies each event once and acknowledges every message.
    let publisher = LossyAck {
        broker: broker.clone(),
        lose_first_ack: true.into(),
    };
    for _ in 0..5 {
        let _ = store.relay_once(&publisher, 2).await.expect("relay pass");
    }
    let mut applied = 0;
    let mut duplicates = 0;
    for _ in 0..5 {
        let done = broker
            .consume_once(&store, 100, 3)
            .await
            .expect("consumer pass");
        applied += done.applied;
        duplicates += done.duplicates;
    }
    let c = store.counts(&p).await.expect("counts");
    assert_eq!(c.outbox_published, 5);
    assert_eq!((c.applied, c.applied_distinct), (5, 5));
    // (With a shared broker a pass may also meet other runs' messages.)
    let b = broker.counts(&p).await.expect("broker counts");
    if dedups_itself {
        // JetStream stored the second publication of one event once (Nats-Msg-Id).
        assert!(applied >= 5, "{applied} {duplicates}");
        assert_eq!((b.messages, b.distinct, b.acked), (5, 5, 5));
    } else {
        assert!(applied >= 5 && duplicates >= 1, "{applied} {duplicates}");
        assert_eq!((b.messages, b.distinct, b.acked), (6, 5, 6));
    }
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    exactly_once(
        DatabaseUrl::Sqlite(dir.path().join("pay.db")),
        BrokerUrl::Table,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    if let Some(url) = url_from("STORMGUARD_TEST_POSTGRES_URL", "stores::postgres") {
        exactly_once(url.parse().expect("URL"), BrokerUrl::Table).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql() {
    if let Some(url) = url_from("STORMGUARD_TEST_MYSQL_URL", "stores::mysql") {
        exactly_once(url.parse().expect("URL"), BrokerUrl::Table).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_with_redis_streams() {
    if let Some(url) = url_from(
        "STORMGUARD_TEST_REDIS_URL",
        "stores::sqlite_with_redis_streams",
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        exactly_once(
            DatabaseUrl::Sqlite(dir.path().join("pay.db")),
            url.parse().expect("URL"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_with_rabbitmq() {
    if let Some(url) = url_from("STORMGUARD_TEST_AMQP_URL", "stores::sqlite_with_rabbitmq") {
        let dir = tempfile::tempdir().expect("tempdir");
        exactly_once(
            DatabaseUrl::Sqlite(dir.path().join("pay.db")),
            url.parse().expect("URL"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_with_nats_jetstream() {
    if let Some(url) = url_from(
        "STORMGUARD_TEST_NATS_URL",
        "stores::sqlite_with_nats_jetstream",
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        exactly_once(
            DatabaseUrl::Sqlite(dir.path().join("pay.db")),
            url.parse().expect("URL"),
        )
        .await;
    }
}
