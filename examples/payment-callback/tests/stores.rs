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

/// Publishes to the broker, and (once) claims failure after publishing one of this run's
/// messages, as a relay sees a lost acknowledgement. On a shared database the outbox may
/// also hold other runs' unpublished messages, which the relay publishes first; their
/// acknowledgements are never lost, so the duplicate is always one of ours.
struct LossyAck {
    broker: Broker,
    ours: String,
    lose_first_ack: AtomicBool,
}

impl Publisher for LossyAck {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), axum::BoxError> {
        self.broker.publish(message, 1).await?;
        if message.event_id.starts_with(&self.ours)
            && self.lose_first_ack.swap(false, Ordering::SeqCst)
        {
            return Err("acknowledgement lost".into());
        }
        Ok(())
    }
}

/// The most relay or consumer passes one run waits for (each handles up to 100 messages).
const PASSES: usize = 50;

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
        ours: format!("order.paid/{p}"),
        lose_first_ack: true.into(),
    };
    // Passes until this run's messages are all published (a shared outbox may hold a
    // backlog from earlier runs ahead of them); bounded so a relay that stalls fails here.
    for _ in 0..PASSES {
        let _ = store.relay_once(&publisher, 2).await.expect("relay pass");
        if store.counts(&p).await.expect("counts").outbox_published == 5 {
            break;
        }
    }
    assert!(
        !publisher.lose_first_ack.load(Ordering::SeqCst),
        "the relay never published one of this run's messages"
    );
    // JetStream stores the second publication of one event once (Nats-Msg-Id).
    let sent = if dedups_itself { 5 } else { 6 };
    let mut applied = 0;
    let mut duplicates = 0;
    for _ in 0..PASSES {
        let done = broker
            .consume_once(&store, 100, 3)
            .await
            .expect("consumer pass");
        applied += done.applied;
        duplicates += done.duplicates;
        if broker.counts(&p).await.expect("broker counts").acked == sent {
            break;
        }
    }
    let c = store.counts(&p).await.expect("counts");
    assert_eq!(c.outbox_published, 5);
    assert_eq!((c.applied, c.applied_distinct), (5, 5));
    // (With a shared broker a pass may also meet other runs' messages.)
    let b = broker.counts(&p).await.expect("broker counts");
    assert_eq!((b.messages, b.distinct, b.acked), (sent, 5, sent));
    assert!(applied >= 5, "{applied} {duplicates}");
    if !dedups_itself {
        assert!(duplicates >= 1, "{applied} {duplicates}");
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
