//! Publishing outbox messages to RabbitMQ (AMQP 0-9-1), with publisher confirms.
//!
//! A message counts as published only when the broker has *confirmed* it (it is routed to
//! at least one queue and, for durable queues, written), never when it has merely been
//! written to the socket: with confirms, the relay marks a message published only after the
//! broker took responsibility for it, so a broker crash or a lost connection leaves it
//! pending and it is published again. Messages are `mandatory`, so one that no queue is bound
//! to receive comes back as an error instead of vanishing.
//!
//! Each message is persistent (`delivery_mode` 2), carries the outbox `event_id` as its AMQP
//! `message_id` and the topic as its `type`, and is routed with the topic as routing key.
//! Consumers deduplicate by `message_id` with [`mark_processed`](super::sqlite::mark_processed)
//! (or the other databases' equivalent), since a message may be published twice.

use axum::BoxError;
use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel};

use super::{OutboxMessage, Publisher};

/// A [`Publisher`] into a RabbitMQ exchange, with publisher confirms.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use lapin::{Connection, ConnectionProperties};
/// use stormguard_idempotency::exactly_once::rabbitmq::RabbitMqPublisher;
///
/// let conn = Connection::connect("amqp://guest:guest@127.0.0.1:5672/%2f", ConnectionProperties::default()).await?;
/// // The default exchange routes by queue name: topic "order.paid" → queue "order.paid".
/// let publisher = RabbitMqPublisher::new(conn.create_channel().await?, "").await?;
/// # let _ = publisher; Ok(()) }
/// ```
#[derive(Debug)]
pub struct RabbitMqPublisher {
    channel: Channel,
    exchange: String,
}

impl RabbitMqPublisher {
    /// Publishes into `exchange` (`""` for the default exchange) on `channel`, which this
    /// puts into confirm mode.
    pub async fn new(channel: Channel, exchange: impl Into<String>) -> Result<Self, lapin::Error> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(RabbitMqPublisher {
            channel,
            exchange: exchange.into(),
        })
    }

    /// The channel.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }
}

/// Why RabbitMQ did not take a message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RabbitMqPublishError {
    /// The broker negatively acknowledged it.
    #[error("RabbitMQ refused message {event_id} (basic.nack)")]
    Nacked {
        /// The message's event id.
        event_id: String,
    },
    /// No queue is bound to receive it (it was returned as unroutable).
    #[error("RabbitMQ returned message {event_id}: no queue is bound for routing key {topic:?}")]
    Unroutable {
        /// The message's event id.
        event_id: String,
        /// Its routing key.
        topic: String,
    },
    /// The channel was not in confirm mode, so the broker confirmed nothing.
    #[error("RabbitMQ did not confirm message {event_id}: the channel is not in confirm mode")]
    NotConfirmed {
        /// The message's event id.
        event_id: String,
    },
}

impl Publisher for RabbitMqPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        let properties = BasicProperties::default()
            .with_message_id(message.event_id.as_str().into())
            .with_type(message.topic.as_str().into())
            .with_delivery_mode(2);
        let confirmation = self
            .channel
            .basic_publish(
                self.exchange.as_str().into(),
                message.topic.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &message.payload,
                properties,
            )
            .await?
            .await?;
        let event_id = message.event_id.clone();
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(RabbitMqPublishError::Unroutable {
                event_id,
                topic: message.topic.clone(),
            }
            .into()),
            Confirmation::Nack(_) => Err(RabbitMqPublishError::Nacked { event_id }.into()),
            Confirmation::NotRequested => {
                Err(RabbitMqPublishError::NotConfirmed { event_id }.into())
            }
        }
    }
}
