//! NATS JetStream: a stream capturing `stormguard.payment-callback.>`. The relay publishes
//! with stormguard-idempotency's `JetStreamPublisher` (`Nats-Msg-Id` = event id, which the
//! stream itself deduplicates within its two-minute window); the consumer reads through a
//! durable pull consumer with explicit acknowledgements. A message a killed consumer had
//! taken but not acknowledged is delivered again after the acknowledgement wait (2 s here).
//! The stream keeps messages for an hour, which is what the harness counts from.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::{self, Stream};
use async_nats::jetstream::{self, Context};
use futures::StreamExt as _;
use stormguard_idempotency::exactly_once::nats::{JetStreamPublisher, MSG_ID};
use stormguard_idempotency::exactly_once::{OutboxMessage, Publisher as _};
use stormguard_idempotency::store::Millis;

use super::{BrokerCounts, BrokerError, event};
use crate::callback::ORDER_PAID;
use crate::store::{CONSUMER, Consumed, Store};

/// The stream.
pub const STREAM: &str = "STORMGUARD_PAYMENT_CALLBACK";

/// Subjects are this followed by the topic.
pub const SUBJECT_PREFIX: &str = "stormguard.payment-callback.";

/// The event id a message carries in its `Nats-Msg-Id` header.
fn event_id_of(m: &async_nats::Message) -> String {
    m.headers
        .as_ref()
        .and_then(|h| h.get(MSG_ID))
        .map(|v| v.to_string())
        .unwrap_or_default()
}

fn nats_err(e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Nats(e.to_string())
}

/// A connection to the stream and its durable consumer.
#[derive(Clone)]
pub struct NatsBroker {
    inner: std::sync::Arc<Inner>,
}

struct Inner {
    stream: Stream,
    publisher: JetStreamPublisher,
    consumer: PullConsumer,
}

impl NatsBroker {
    /// Connects, creating the stream and the durable consumer if needed.
    pub async fn connect(url: &str) -> Result<Self, BrokerError> {
        let client = async_nats::connect(url).await.map_err(nats_err)?;
        let jetstream: Context = jetstream::new(client);
        let stream = jetstream
            .get_or_create_stream(stream::Config {
                name: STREAM.to_owned(),
                subjects: vec![format!("{SUBJECT_PREFIX}>")],
                max_age: Duration::from_secs(3600),
                ..stream::Config::default()
            })
            .await
            .map_err(nats_err)?;
        let consumer = stream
            .get_or_create_consumer(
                CONSUMER,
                pull::Config {
                    durable_name: Some(CONSUMER.to_owned()),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: Duration::from_secs(2),
                    filter_subject: format!("{SUBJECT_PREFIX}{ORDER_PAID}"),
                    ..pull::Config::default()
                },
            )
            .await
            .map_err(nats_err)?;
        Ok(NatsBroker {
            inner: std::sync::Arc::new(Inner {
                stream,
                publisher: JetStreamPublisher::new(jetstream, SUBJECT_PREFIX),
                consumer,
            }),
        })
    }

    pub(super) async fn publish(&self, message: &OutboxMessage) -> Result<(), BrokerError> {
        self.inner
            .publisher
            .publish(message)
            .await
            .map_err(BrokerError::Sink)
    }

    pub(super) async fn consume_once(
        &self,
        store: &Store,
        batch: u32,
        now: Millis,
    ) -> Result<Consumed, BrokerError> {
        let mut messages = self
            .inner
            .consumer
            .fetch()
            .max_messages(usize::try_from(batch).unwrap_or(100))
            .messages()
            .await
            .map_err(nats_err)?;
        let mut received = Vec::new();
        while let Some(message) = messages.next().await {
            received.push(message.map_err(nats_err)?);
        }
        let events: Vec<_> = received
            .iter()
            .map(|m| event(event_id_of(m), m.payload.to_vec()))
            .collect();
        let done = store.apply(&events, now).await?;
        for m in &received {
            m.ack().await.map_err(nats_err)?;
        }
        Ok(done)
    }

    pub(super) async fn counts(&self, prefix: &str) -> Result<BrokerCounts, BrokerError> {
        // Read the whole stream through a throwaway consumer.
        let reader: PullConsumer = self
            .inner
            .stream
            .create_consumer(pull::Config {
                deliver_policy: DeliverPolicy::All,
                ack_policy: AckPolicy::None,
                filter_subject: format!("{SUBJECT_PREFIX}{ORDER_PAID}"),
                inactive_threshold: Duration::from_secs(30),
                ..pull::Config::default()
            })
            .await
            .map_err(nats_err)?;
        let wanted = format!("{ORDER_PAID}/{prefix}");
        let mut counts = BrokerCounts::default();
        let mut distinct = std::collections::HashSet::new();
        loop {
            let mut batch = reader
                .fetch()
                .max_messages(500)
                .messages()
                .await
                .map_err(nats_err)?;
            let mut got = 0;
            while let Some(m) = batch.next().await {
                let m = m.map_err(nats_err)?;
                got += 1;
                let id = event_id_of(&m);
                if id.starts_with(&wanted) {
                    counts.messages += 1;
                    distinct.insert(id);
                }
            }
            if got == 0 {
                break;
            }
        }
        counts.distinct = i64::try_from(distinct.len()).unwrap_or(i64::MAX);
        let mut consumer = self.inner.consumer.clone();
        let info = consumer.info().await.map_err(nats_err)?;
        let unconsumed = i64::try_from(info.num_pending)
            .unwrap_or(i64::MAX)
            .saturating_add(i64::try_from(info.num_ack_pending).unwrap_or(i64::MAX));
        counts.acked = counts.messages - unconsumed.min(counts.messages);
        Ok(counts)
    }

    pub(super) async fn reset(&self) -> Result<(), BrokerError> {
        self.inner.stream.purge().await.map_err(nats_err)?;
        Ok(())
    }
}
