//! Exactly-once recording, relay and consumer on every database: SQLite always; PostgreSQL
//! and MariaDB when `STORMGUARD_TEST_POSTGRES_URL` / `STORMGUARD_TEST_MYSQL_URL` are set
//! (a loud SKIPPED otherwise, and a failure with `STORMGUARD_REQUIRE_ALL_STORES=1`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use stormguard_idempotency::exactly_once::{OutboxMessage, Publisher};
use stormguard_payment_callback::callback::PaymentCallback;
use stormguard_payment_callback::store::{DatabaseUrl, Recorded, Store, StoreOptions};

fn url_from(var: &str, test: &str) -> Option<DatabaseUrl> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url.parse().expect("a database URL")),
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

/// Publishes into the store's broker table, and (once) claims failure after publishing, as
/// a relay would see a lost acknowledgement.
struct Broker {
    store: Store,
    lose_first_ack: std::sync::atomic::AtomicBool,
}

impl Publisher for Broker {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), axum::BoxError> {
        self.store.publish(message, 1).await?;
        if self
            .lose_first_ack
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Err("acknowledgement lost".into());
        }
        Ok(())
    }
}

async fn exactly_once(url: DatabaseUrl) {
    let store = Store::connect(&url, StoreOptions::default())
        .await
        .expect("connects and migrates");
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
    // twice; the consumer applies each event once.
    let broker = Broker {
        store: store.clone(),
        lose_first_ack: true.into(),
    };
    for _ in 0..5 {
        let _ = store.relay_once(&broker, 2).await.expect("relay pass");
    }
    let mut applied = 0;
    for _ in 0..5 {
        applied += store
            .consume_once(100, 3)
            .await
            .expect("consumer pass")
            .applied;
    }
    let c = store.counts(&p).await.expect("counts");
    assert_eq!(c.outbox_published, 5);
    assert!(c.broker >= 6, "{c:?}");
    assert_eq!(c.broker_distinct, 5);
    assert_eq!(c.broker_acked, c.broker);
    assert_eq!((c.applied, c.applied_distinct), (5, 5));
    assert!(applied >= 5);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    exactly_once(DatabaseUrl::Sqlite(dir.path().join("pay.db"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    if let Some(url) = url_from("STORMGUARD_TEST_POSTGRES_URL", "stores::postgres") {
        exactly_once(url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql() {
    if let Some(url) = url_from("STORMGUARD_TEST_MYSQL_URL", "stores::mysql") {
        exactly_once(url).await;
    }
}
