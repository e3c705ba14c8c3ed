//! RabbitMQ: a durable queue bound to a direct exchange. The relay publishes with
//! stormguard-idempotency's `RabbitMqPublisher` (publisher confirms, `message_id` = event id);
//! the consumer takes messages with `basic.get`, applies them, and acknowledges them. Messages
//! a killed consumer had taken but not acknowledged go back to the queue when its connection
//! drops, and are delivered again.
//!
//! A consumed message leaves the queue, so the harness cannot count the broker's messages
//! afterwards the way it reads a Redis stream or a JetStream stream: its verifier first calls
//! [`AmqpBroker::audit`], which binds a private queue of its own to the exchange, and counts
//! from that copy.

use std::collections::HashMap;
use std::sync::Arc;

use lapin::options::{
    BasicAckOptions, BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use stormguard_idempotency::exactly_once::rabbitmq::RabbitMqPublisher;
use stormguard_idempotency::exactly_once::{OutboxMessage, Publisher as _};
use stormguard_idempotency::store::Millis;
use tokio::sync::Mutex;

use super::{BrokerCounts, BrokerError, event};
use crate::callback::ORDER_PAID;
use crate::store::{Consumed, Store};

/// The exchange `order.paid` is published to (routing key `order.paid`).
pub const EXCHANGE: &str = "stormguard.payment-callback";

/// The consumer's queue.
pub const QUEUE: &str = "stormguard.payment-callback.order.paid";

/// A connection to RabbitMQ: a confirming publisher and a consumer channel.
#[derive(Clone)]
pub struct AmqpBroker {
    inner: Arc<Inner>,
}

struct Inner {
    _connection: Connection,
    publisher: RabbitMqPublisher,
    consumer: Channel,
    audit: Mutex<Audit>,
}

/// The verifier's copy of every message: its queue, and the event ids seen in it so far.
#[derive(Default)]
struct Audit {
    queue: Option<String>,
    seen: HashMap<String, i64>,
}

impl AmqpBroker {
    /// Connects and declares the exchange, the queue and its binding.
    pub async fn connect(url: &str) -> Result<Self, BrokerError> {
        let connection = Connection::connect(url, ConnectionProperties::default()).await?;
        let consumer = connection.create_channel().await?;
        consumer
            .exchange_declare(
                EXCHANGE.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        consumer
            .queue_declare(
                QUEUE.into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await?;
        consumer
            .queue_bind(
                QUEUE.into(),
                EXCHANGE.into(),
                ORDER_PAID.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let publisher =
            RabbitMqPublisher::new(connection.create_channel().await?, EXCHANGE).await?;
        Ok(AmqpBroker {
            inner: Arc::new(Inner {
                _connection: connection,
                publisher,
                consumer,
                audit: Mutex::new(Audit::default()),
            }),
        })
    }

    /// Starts keeping a copy of every message published from now on, for
    /// [`counts`](super::Broker::counts): a private queue bound like the consumer's, deleted
    /// with this connection.
    pub async fn audit(&self) -> Result<(), BrokerError> {
        let mut audit = self.inner.audit.lock().await;
        if audit.queue.is_some() {
            return Ok(());
        }
        let channel = &self.inner.consumer;
        let queue = channel
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        let name = queue.name().as_str().to_owned();
        channel
            .queue_bind(
                name.as_str().into(),
                EXCHANGE.into(),
                ORDER_PAID.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        audit.queue = Some(name);
        Ok(())
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
        let channel = &self.inner.consumer;
        let mut events = Vec::new();
        let mut last_tag = None;
        for _ in 0..batch {
            let Some(got) = channel
                .basic_get(QUEUE.into(), BasicGetOptions { no_ack: false })
                .await?
            else {
                break;
            };
            let delivery = got.delivery;
            let event_id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str().to_owned())
                .unwrap_or_default();
            last_tag = Some(delivery.delivery_tag);
            events.push(event(event_id, delivery.data));
        }
        let done = store.apply(&events, now).await?;
        if let Some(tag) = last_tag {
            channel
                .basic_ack(tag, BasicAckOptions { multiple: true })
                .await?;
        }
        Ok(done)
    }

    pub(super) async fn counts(&self, prefix: &str) -> Result<BrokerCounts, BrokerError> {
        let channel = &self.inner.consumer;
        let mut audit = self.inner.audit.lock().await;
        let Some(queue) = audit.queue.clone() else {
            return Err(BrokerError::Nats(
                "counting RabbitMQ messages needs AmqpBroker::audit first".into(),
            ));
        };
        while let Some(got) = channel
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await?
        {
            let id = got
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str().to_owned())
                .unwrap_or_default();
            *audit.seen.entry(id).or_default() += 1;
        }
        let wanted = format!("{ORDER_PAID}/{prefix}");
        let mut counts = BrokerCounts::default();
        for (id, n) in &audit.seen {
            if id.starts_with(&wanted) {
                counts.messages += n;
                counts.distinct += 1;
            }
        }
        // Messages still waiting in the consumer's queue are not consumed yet.
        let waiting = channel
            .queue_declare(
                QUEUE.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?
            .message_count();
        counts.acked = counts.messages - i64::from(waiting).min(counts.messages);
        Ok(counts)
    }

    pub(super) async fn reset(&self) -> Result<(), BrokerError> {
        let channel = &self.inner.consumer;
        channel
            .queue_purge(QUEUE.into(), QueuePurgeOptions::default())
            .await?;
        let mut audit = self.inner.audit.lock().await;
        if let Some(queue) = &audit.queue {
            channel
                .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                .await?;
        }
        audit.seen.clear();
        Ok(())
    }
}
