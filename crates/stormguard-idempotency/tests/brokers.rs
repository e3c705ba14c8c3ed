//! The outbox relay into real brokers: RabbitMQ with publisher confirms and NATS JetStream,
//! from a SQLite outbox, with a consumer that deduplicates by event id. The servers' URLs come
//! from `STORMGUARD_TEST_AMQP_URL` and `STORMGUARD_TEST_NATS_URL` (set by `.ci/stores.sh`);
//! without them the tests print `SKIPPED`, and fail with `STORMGUARD_REQUIRE_ALL_STORES=1`.

#[cfg(any(feature = "rabbitmq", feature = "nats"))]
#[path = "support/mod.rs"]
mod support;

use std::io::Write as _;

#[cfg(any(feature = "rabbitmq", feature = "nats"))]
fn url(var: &str, test: &str) -> Option<String> {
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

#[cfg(not(all(feature = "rabbitmq", feature = "nats")))]
fn skip_without_feature(test: &str, feature: &str) {
    if std::env::var("STORMGUARD_REQUIRE_ALL_STORES").as_deref() == Ok("1") {
        panic!(
            "{test}: the `{feature}` feature is not enabled but STORMGUARD_REQUIRE_ALL_STORES=1"
        );
    }
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {test}: the `{feature}` feature is not enabled (run with --all-features)"
    );
}

/// A SQLite outbox holding `n` messages.
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
async fn outbox(
    n: usize,
) -> (
    support::TestEnv,
    sqlx::SqlitePool,
    Vec<stormguard_idempotency::exactly_once::OutboxMessage>,
) {
    use stormguard_idempotency::exactly_once::OutboxMessage;
    use stormguard_idempotency::exactly_once::sqlite::enqueue;
    let env = support::Backend::SqliteFile
        .open("brokers")
        .await
        .expect("sqlite");
    let pool = env.sqlite_pool().expect("pool");
    let mut sent = Vec::new();
    for i in 0..n {
        let m = OutboxMessage::new("order.paid", format!("{{\"order\":{i}}}"));
        let mut tx = pool.begin().await.expect("begin");
        enqueue(&mut tx, &m, 1).await.expect("enqueue");
        tx.commit().await.expect("commit");
        sent.push(m);
    }
    (env, pool, sent)
}

#[cfg(feature = "rabbitmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_relay_confirms_and_consumers_deduplicate() {
    use lapin::options::{BasicGetOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    use lapin::{Connection, ConnectionProperties};
    use stormguard_idempotency::exactly_once::Publisher as _;
    use stormguard_idempotency::exactly_once::rabbitmq::RabbitMqPublisher;
    use stormguard_idempotency::exactly_once::sqlite::{Relay, mark_processed};

    let Some(url) = url("STORMGUARD_TEST_AMQP_URL", "brokers::rabbitmq") else {
        return;
    };
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ");
    let channel = conn.create_channel().await.expect("channel");
    // A private queue bound to amq.direct under a routing key of its own.
    let queue = channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("queue");
    let topic = format!("sg-test-{}", queue.name().as_str());
    channel
        .queue_bind(
            queue.name().clone(),
            "amq.direct".into(),
            topic.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");
    let (env, pool, _) = outbox(0).await;
    let mut sent = Vec::new();
    for i in 0..3 {
        let m =
            stormguard_idempotency::exactly_once::OutboxMessage::new(topic.clone(), format!("{i}"));
        let mut tx = pool.begin().await.expect("begin");
        stormguard_idempotency::exactly_once::sqlite::enqueue(&mut tx, &m, 1)
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        sent.push(m);
    }
    let publisher =
        RabbitMqPublisher::new(conn.create_channel().await.expect("channel"), "amq.direct")
            .await
            .expect("confirm mode");
    let report = Relay::new(pool.clone())
        .run_once(&publisher, 2)
        .await
        .expect("relay");
    assert_eq!(report.published, 3, "{report:?}");
    // The relay "crashed" before marking one: it is published again with the same id.
    publisher.publish(&sent[1]).await.expect("republish");
    // An unroutable message is an error, not a silent loss.
    let lost =
        stormguard_idempotency::exactly_once::OutboxMessage::new(format!("{topic}-nobody"), "x");
    let err = publisher.publish(&lost).await.expect_err("no queue bound");
    assert!(err.to_string().contains("no queue is bound"), "{err}");

    let mut applied = Vec::new();
    let mut deliveries = 0;
    while let Some(got) = channel
        .basic_get(queue.name().clone(), BasicGetOptions { no_ack: true })
        .await
        .expect("get")
    {
        deliveries += 1;
        let id = got
            .delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_owned())
            .expect("message_id");
        assert_eq!(
            got.delivery.properties.delivery_mode(),
            &Some(2),
            "persistent"
        );
        let mut c = pool.acquire().await.expect("conn");
        if mark_processed(&mut c, "consumer", &id, 3)
            .await
            .expect("inbox")
        {
            applied.push(id);
        }
    }
    assert_eq!(deliveries, 4, "three messages, one twice");
    let expected: Vec<_> = sent.iter().map(|m| m.event_id.clone()).collect();
    assert_eq!(applied, expected, "applied once each, in order");
    env.cleanup().await;
}

#[cfg(not(feature = "rabbitmq"))]
#[test]
fn rabbitmq_relay_confirms_and_consumers_deduplicate() {
    skip_without_feature("brokers::rabbitmq", "rabbitmq");
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_relay_is_acknowledged_and_deduplicated_by_event_id() {
    use async_nats::jetstream::{self, stream};
    use futures::StreamExt as _;
    use stormguard_idempotency::exactly_once::Publisher as _;
    use stormguard_idempotency::exactly_once::nats::{JetStreamPublisher, MSG_ID};
    use stormguard_idempotency::exactly_once::sqlite::{Relay, mark_processed};

    let Some(url) = url("STORMGUARD_TEST_NATS_URL", "brokers::nats") else {
        return;
    };
    let client = async_nats::connect(&url).await.expect("connect to NATS");
    let js = jetstream::new(client);
    let name = format!("SGTEST_{}_{}", std::process::id(), rand_suffix());
    let prefix = format!("sgtest.{}.", name.to_lowercase());
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{prefix}>")],
            ..stream::Config::default()
        })
        .await
        .expect("stream");
    let (env, pool, sent) = outbox(3).await;
    let publisher = JetStreamPublisher::new(js.clone(), prefix.clone());
    let report = Relay::new(pool.clone())
        .run_once(&publisher, 2)
        .await
        .expect("relay");
    assert_eq!(report.published, 3, "{report:?}");
    // Published again (a relay crash before marking): JetStream keeps one copy.
    publisher.publish(&sent[1]).await.expect("republish");
    let mut info = stream.clone();
    assert_eq!(
        info.info().await.expect("info").state.messages,
        3,
        "deduplicated by Nats-Msg-Id"
    );

    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config::default())
        .await
        .expect("consumer");
    let mut batch = consumer
        .fetch()
        .max_messages(10)
        .messages()
        .await
        .expect("fetch");
    let mut applied = Vec::new();
    while let Some(m) = batch.next().await {
        let m = m.expect("message");
        let id = m
            .headers
            .as_ref()
            .and_then(|h| h.get(MSG_ID))
            .map(|v| v.to_string())
            .expect("id");
        let mut c = pool.acquire().await.expect("conn");
        if mark_processed(&mut c, "consumer", &id, 3)
            .await
            .expect("inbox")
        {
            applied.push(id);
        }
        m.ack().await.expect("ack");
    }
    let expected: Vec<_> = sent.iter().map(|m| m.event_id.clone()).collect();
    assert_eq!(applied, expected);
    let _ = js.delete_stream(&name).await;
    env.cleanup().await;
}

#[cfg(feature = "nats")]
fn rand_suffix() -> u32 {
    rand::random::<u32>()
}

#[cfg(not(feature = "nats"))]
#[test]
fn jetstream_relay_is_acknowledged_and_deduplicated_by_event_id() {
    skip_without_feature("brokers::nats", "nats");
}
