//! Where `order.paid` goes: the broker the relay publishes to and the consumer reads from.
//!
//! Four brokers, one contract — at-least-once delivery with an explicit acknowledgement, so a
//! consumer that crashes before acknowledging gets the message again (and its inbox skips it):
//!
//! - **table** (the default, no server): `payment_broker`, a queue table in the database;
//!   acknowledged by setting `acked_at`;
//! - **Redis Streams** (`--broker redis://…`, [`redis`]): `XADD`, a consumer group,
//!   `XREADGROUP`, `XACK`;
//! - **RabbitMQ** (`--broker amqp://…`, [`amqp`]): published with publisher confirms by
//!   stormguard-idempotency's `RabbitMqPublisher`, consumed with `basic.get` and acknowledged;
//! - **NATS JetStream** (`--broker nats://…`, [`nats`]): published by stormguard-idempotency's
//!   `JetStreamPublisher` (which JetStream also deduplicates by event id), consumed through a
//!   durable pull consumer and acknowledged.
//!
//! The consumer deduplicates by event id in every case.

use std::fmt;
use std::str::FromStr;

use axum::BoxError;
use stormguard::classify::Outcome;
use stormguard_idempotency::exactly_once::OutboxMessage;
use stormguard_idempotency::store::Millis;

use crate::store::{Consumed, Event, Store, StoreError, classify_db_error};

pub mod amqp;
pub mod nats;
pub mod redis;

/// Which broker, from `--broker`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BrokerUrl {
    /// The queue table in the database.
    #[default]
    Table,
    /// A Redis server (`redis://host:port/`).
    Redis(String),
    /// A RabbitMQ server (`amqp://user:pass@host:5672/vhost`).
    Amqp(String),
    /// A NATS server with JetStream (`nats://host:4222`).
    Nats(String),
}

/// A `--broker` that names no supported broker.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported broker '{0}': expected table, redis://HOST:PORT/, amqp://USER:PASS@HOST:PORT/VHOST or nats://HOST:PORT"
)]
pub struct BadBrokerUrl(pub String);

impl FromStr for BrokerUrl {
    type Err = BadBrokerUrl;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "table" {
            Ok(BrokerUrl::Table)
        } else if s.starts_with("redis://") || s.starts_with("rediss://") {
            Ok(BrokerUrl::Redis(s.to_owned()))
        } else if s.starts_with("amqp://") || s.starts_with("amqps://") {
            Ok(BrokerUrl::Amqp(s.to_owned()))
        } else if s.starts_with("nats://") {
            Ok(BrokerUrl::Nats(s.to_owned()))
        } else {
            Err(BadBrokerUrl(s.to_owned()))
        }
    }
}

impl fmt::Display for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrokerUrl::Table => f.write_str("table"),
            BrokerUrl::Redis(url) | BrokerUrl::Amqp(url) | BrokerUrl::Nats(url) => f.write_str(url),
        }
    }
}

impl BrokerUrl {
    /// A short name for tables and logs: `table`, `redis`, `amqp` or `nats`.
    pub fn kind(&self) -> &'static str {
        match self {
            BrokerUrl::Table => "table",
            BrokerUrl::Redis(_) => "redis",
            BrokerUrl::Amqp(_) => "amqp",
            BrokerUrl::Nats(_) => "nats",
        }
    }
}

/// A broker operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The broker table.
    #[error("broker table: {0}")]
    Sql(#[from] sqlx::Error),
    /// Redis.
    #[error("redis broker: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// RabbitMQ.
    #[error("rabbitmq broker: {0}")]
    Amqp(#[from] lapin::Error),
    /// NATS JetStream.
    #[error("nats broker: {0}")]
    Nats(String),
    /// A relay sink of stormguard-idempotency (RabbitMQ, JetStream) refused or lost a message.
    #[error("publishing: {0}")]
    Sink(BoxError),
    /// Counting in the database.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl BrokerError {
    /// What a failed publish means for retrying (the `message-publish` policy retries once):
    /// a lost connection is in doubt — publishing twice is safe, consumers deduplicate.
    pub fn classify(&self) -> Outcome {
        match self {
            BrokerError::Sql(e) => classify_db_error(e),
            BrokerError::Redis(e)
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() =>
            {
                Outcome::InDoubt
            }
            // A lost connection or an unconfirmed publish: publishing again is safe.
            BrokerError::Amqp(_) | BrokerError::Nats(_) | BrokerError::Sink(_) => Outcome::InDoubt,
            BrokerError::Redis(_) | BrokerError::Store(_) => Outcome::NeverRetry,
        }
    }
}

/// Messages in the broker for one run's orders.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BrokerCounts {
    /// Messages, duplicates included.
    pub messages: i64,
    /// Distinct event ids.
    pub distinct: i64,
    /// Messages acknowledged by the consumer.
    pub acked: i64,
}

/// The broker of one service.
#[derive(Clone)]
pub enum Broker {
    /// The queue table of this store.
    Table(Store),
    /// A Redis stream.
    Redis(redis::RedisBroker),
    /// A RabbitMQ queue.
    Amqp(amqp::AmqpBroker),
    /// A JetStream stream.
    Nats(nats::NatsBroker),
}

impl fmt::Debug for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Broker::Table(_) => "Broker::Table",
            Broker::Redis(_) => "Broker::Redis",
            Broker::Amqp(_) => "Broker::Amqp",
            Broker::Nats(_) => "Broker::Nats",
        })
    }
}

impl Broker {
    /// The table broker of `store`, or a connection to the broker server (creating its
    /// stream, queue or consumer group if needed).
    pub async fn connect(url: &BrokerUrl, store: &Store) -> Result<Broker, BrokerError> {
        Ok(match url {
            BrokerUrl::Table => Broker::Table(store.clone()),
            BrokerUrl::Redis(url) => Broker::Redis(redis::RedisBroker::connect(url).await?),
            BrokerUrl::Amqp(url) => Broker::Amqp(amqp::AmqpBroker::connect(url).await?),
            BrokerUrl::Nats(url) => Broker::Nats(nats::NatsBroker::connect(url).await?),
        })
    }

    /// Starts keeping count of every message published from now on (what
    /// [`counts`](Self::counts) reads). Only RabbitMQ needs it: its consumed messages leave
    /// the queue, so the counts come from a copy ([`amqp::AmqpBroker::audit`]).
    pub async fn audit(&self) -> Result<(), BrokerError> {
        match self {
            Broker::Amqp(b) => b.audit().await,
            Broker::Table(_) | Broker::Redis(_) | Broker::Nats(_) => Ok(()),
        }
    }

    /// Publishes one message.
    pub async fn publish(&self, message: &OutboxMessage, now: Millis) -> Result<(), BrokerError> {
        match self {
            Broker::Table(store) => Ok(store.publish(message, now).await?),
            Broker::Redis(b) => b.publish(message).await,
            Broker::Amqp(b) => b.publish(message).await,
            Broker::Nats(b) => b.publish(message).await,
        }
    }

    /// One consumer pass: receive up to `batch` messages, apply them exactly once in `store`,
    /// acknowledge them.
    pub async fn consume_once(
        &self,
        store: &Store,
        batch: u32,
        now: Millis,
    ) -> Result<Consumed, BrokerError> {
        match self {
            Broker::Table(table) => {
                let received = table.receive(i64::from(batch)).await?;
                let (ids, events): (Vec<i64>, Vec<Event>) = received.into_iter().unzip();
                let done = store.apply(&events, now).await?;
                table.acknowledge(&ids, now).await?;
                Ok(done)
            }
            Broker::Redis(b) => b.consume_once(store, batch, now).await,
            Broker::Amqp(b) => b.consume_once(store, batch, now).await,
            Broker::Nats(b) => b.consume_once(store, batch, now).await,
        }
    }

    /// Counts the messages of the orders whose number starts with `prefix`.
    pub async fn counts(&self, prefix: &str) -> Result<BrokerCounts, BrokerError> {
        match self {
            Broker::Table(store) => Ok(store.broker_counts(prefix).await?),
            Broker::Redis(b) => b.counts(prefix).await,
            Broker::Amqp(b) => b.counts(prefix).await,
            Broker::Nats(b) => b.counts(prefix).await,
        }
    }

    /// Deletes every message (and creates the stream, queue or group anew).
    pub async fn reset(&self) -> Result<(), BrokerError> {
        match self {
            Broker::Table(store) => Ok(store.reset_broker().await?),
            Broker::Redis(b) => b.reset().await,
            Broker::Amqp(b) => b.reset().await,
            Broker::Nats(b) => b.reset().await,
        }
    }
}

/// The event a broker message carries (its payload and event id), as the consumer applies it.
fn event(event_id: impl Into<String>, payload: Vec<u8>) -> Event {
    Event {
        event_id: event_id.into(),
        payload,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_urls_parse() {
        assert_eq!("table".parse(), Ok(BrokerUrl::Table));
        assert_eq!(
            "redis://127.0.0.1:6379/"
                .parse::<BrokerUrl>()
                .map(|b| b.kind()),
            Ok("redis")
        );
        assert_eq!(
            "amqp://guest:guest@127.0.0.1:5672/%2f"
                .parse::<BrokerUrl>()
                .map(|b| b.kind()),
            Ok("amqp")
        );
        assert_eq!(
            "nats://127.0.0.1:4222"
                .parse::<BrokerUrl>()
                .map(|b| b.kind()),
            Ok("nats")
        );
        for bad in ["", "kafka://x", "Table", "nats:/x"] {
            assert!(bad.parse::<BrokerUrl>().is_err(), "{bad}");
        }
        let url = BrokerUrl::Redis("redis://h:1/".into());
        assert_eq!(url.to_string().parse(), Ok(url));
    }
}
