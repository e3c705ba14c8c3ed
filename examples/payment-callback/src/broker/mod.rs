//! Where `order.paid` goes: the broker the relay publishes to and the consumer reads from.
//!
//! Two brokers, one contract — at-least-once delivery with an explicit acknowledgement, so a
//! consumer that crashes before acknowledging gets the message again (and its inbox skips it):
//!
//! - **table** (the default, no server): `payment_broker`, a queue table in the database
//!   (with SQLite, in a second file beside it); acknowledged by setting `acked_at`;
//! - **Redis Streams** (`--broker redis://…`): `XADD` to [`STREAM_KEY`], read through the
//!   consumer group [`CONSUMER`] with `XREADGROUP`, acknowledged with `XACK`. A restarted
//!   consumer first re-reads its own pending (delivered, unacknowledged) entries.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use redis::aio::ConnectionManager;
use stormguard::classify::Outcome;
use stormguard_idempotency::exactly_once::OutboxMessage;
use stormguard_idempotency::store::Millis;

use crate::callback::ORDER_PAID;
use crate::store::{CONSUMER, Consumed, Event, Store, StoreError, classify_db_error};

/// The Redis stream that carries `order.paid`.
pub const STREAM_KEY: &str = "stormguard:payment-callback:order.paid";

/// The consumer's name inside the group: one consumer, the same after a restart, so a
/// restarted process finds the entries its predecessor received but never acknowledged.
const CONSUMER_NAME: &str = "notifier-1";

/// Which broker, from `--broker`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BrokerUrl {
    /// The queue table in the database.
    #[default]
    Table,
    /// A Redis server (`redis://host:port/`).
    Redis(String),
}

/// A `--broker` that names no supported broker.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unsupported broker '{0}': expected table or redis://HOST:PORT/")]
pub struct BadBrokerUrl(pub String);

impl FromStr for BrokerUrl {
    type Err = BadBrokerUrl;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "table" {
            Ok(BrokerUrl::Table)
        } else if s.starts_with("redis://") || s.starts_with("rediss://") {
            Ok(BrokerUrl::Redis(s.to_owned()))
        } else {
            Err(BadBrokerUrl(s.to_owned()))
        }
    }
}

impl fmt::Display for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrokerUrl::Table => f.write_str("table"),
            BrokerUrl::Redis(url) => f.write_str(url),
        }
    }
}

impl BrokerUrl {
    /// A short name for tables and logs: `table` or `redis`.
    pub fn kind(&self) -> &'static str {
        match self {
            BrokerUrl::Table => "table",
            BrokerUrl::Redis(_) => "redis",
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
    Redis(#[from] redis::RedisError),
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
    Redis(ConnectionManager),
}

impl fmt::Debug for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broker::Table(_) => f.write_str("Broker::Table"),
            Broker::Redis(_) => f.write_str("Broker::Redis"),
        }
    }
}

fn field<'a>(fields: &'a [Vec<u8>], name: &str) -> Option<&'a [u8]> {
    fields
        .chunks_exact(2)
        .find(|kv| kv[0] == name.as_bytes())
        .map(|kv| kv[1].as_slice())
}

type StreamEntry = (String, Vec<Vec<u8>>);

impl Broker {
    /// The table broker of `store`, or a connection to Redis (creating the stream and the
    /// consumer group if needed).
    pub async fn connect(url: &BrokerUrl, store: &Store) -> Result<Broker, BrokerError> {
        match url {
            BrokerUrl::Table => Ok(Broker::Table(store.clone())),
            BrokerUrl::Redis(url) => {
                let client = redis::Client::open(url.as_str())?;
                let broker = Broker::Redis(ConnectionManager::new(client).await?);
                broker.create_group().await?;
                Ok(broker)
            }
        }
    }

    async fn create_group(&self) -> Result<(), BrokerError> {
        if let Broker::Redis(conn) = self {
            let created: Result<(), redis::RedisError> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(STREAM_KEY)
                .arg(CONSUMER)
                .arg("0")
                .arg("MKSTREAM")
                .query_async(&mut conn.clone())
                .await;
            match created {
                Err(e) if e.code() != Some("BUSYGROUP") => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }

    /// Publishes one message.
    pub async fn publish(&self, message: &OutboxMessage, now: Millis) -> Result<(), BrokerError> {
        match self {
            Broker::Table(store) => Ok(store.publish(message, now).await?),
            Broker::Redis(conn) => {
                let _id: String = redis::cmd("XADD")
                    .arg(STREAM_KEY)
                    .arg("*")
                    .arg("event_id")
                    .arg(&message.event_id)
                    .arg("topic")
                    .arg(&message.topic)
                    .arg("payload")
                    .arg(&message.payload)
                    .query_async(&mut conn.clone())
                    .await?;
                Ok(())
            }
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
            Broker::Redis(conn) => {
                let mut conn = conn.clone();
                // Our own pending entries first (a predecessor crashed before XACK), then new.
                let mut entries = read_group(&mut conn, "0", batch).await?;
                if entries.is_empty() {
                    entries = read_group(&mut conn, ">", batch).await?;
                }
                let (ids, events): (Vec<String>, Vec<Event>) = entries
                    .into_iter()
                    .map(|(id, fields)| {
                        let event = Event {
                            event_id: field(&fields, "event_id")
                                .map(|v| String::from_utf8_lossy(v).into_owned())
                                .unwrap_or_default(),
                            payload: field(&fields, "payload").unwrap_or_default().to_vec(),
                        };
                        (id, event)
                    })
                    .unzip();
                let done = store.apply(&events, now).await?;
                if !ids.is_empty() {
                    let _acked: i64 = redis::cmd("XACK")
                        .arg(STREAM_KEY)
                        .arg(CONSUMER)
                        .arg(&ids)
                        .query_async(&mut conn)
                        .await?;
                }
                Ok(done)
            }
        }
    }

    /// Counts the messages of the orders whose number starts with `prefix`.
    pub async fn counts(&self, prefix: &str) -> Result<BrokerCounts, BrokerError> {
        match self {
            Broker::Table(store) => Ok(store.broker_counts(prefix).await?),
            Broker::Redis(conn) => {
                let mut conn = conn.clone();
                let wanted = format!("{ORDER_PAID}/{prefix}");
                let entries: Vec<StreamEntry> = redis::cmd("XRANGE")
                    .arg(STREAM_KEY)
                    .arg("-")
                    .arg("+")
                    .query_async(&mut conn)
                    .await?;
                let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                    .arg(STREAM_KEY)
                    .arg(CONSUMER)
                    .arg("-")
                    .arg("+")
                    .arg(i64::MAX)
                    .query_async(&mut conn)
                    .await?;
                let pending: HashSet<String> = pending.into_iter().map(|p| p.0).collect();
                let mut counts = BrokerCounts::default();
                let mut distinct = HashSet::new();
                for (id, fields) in entries {
                    let Some(event_id) = field(&fields, "event_id") else {
                        continue;
                    };
                    if !event_id.starts_with(wanted.as_bytes()) {
                        continue;
                    }
                    counts.messages += 1;
                    if !pending.contains(&id) {
                        counts.acked += 1;
                    }
                    distinct.insert(event_id.to_vec());
                }
                counts.distinct = i64::try_from(distinct.len()).unwrap_or(i64::MAX);
                Ok(counts)
            }
        }
    }

    /// Deletes every message (the table's rows, or the stream and its group, created anew).
    pub async fn reset(&self) -> Result<(), BrokerError> {
        match self {
            Broker::Table(store) => Ok(store.reset_broker().await?),
            Broker::Redis(conn) => {
                let _: i64 = redis::cmd("DEL")
                    .arg(STREAM_KEY)
                    .query_async(&mut conn.clone())
                    .await?;
                self.create_group().await
            }
        }
    }
}

async fn read_group(
    conn: &mut ConnectionManager,
    from: &str,
    batch: u32,
) -> Result<Vec<StreamEntry>, BrokerError> {
    let reply: Option<Vec<(String, Vec<StreamEntry>)>> = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(CONSUMER)
        .arg(CONSUMER_NAME)
        .arg("COUNT")
        .arg(batch)
        .arg("STREAMS")
        .arg(STREAM_KEY)
        .arg(from)
        .query_async(conn)
        .await?;
    Ok(reply
        .into_iter()
        .flatten()
        .flat_map(|(_, entries)| entries)
        .collect())
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
        for bad in ["", "kafka://x", "Table"] {
            assert!(bad.parse::<BrokerUrl>().is_err(), "{bad}");
        }
        let url = BrokerUrl::Redis("redis://h:1/".into());
        assert_eq!(url.to_string().parse(), Ok(url));
    }

    #[test]
    fn fields_are_found_by_name() {
        let fields = vec![
            b"event_id".to_vec(),
            b"e1".to_vec(),
            b"payload".to_vec(),
            b"{}".to_vec(),
        ];
        assert_eq!(field(&fields, "payload"), Some(&b"{}"[..]));
        assert_eq!(field(&fields, "topic"), None);
        assert_eq!(field(&fields[..3], "payload"), None);
    }
}
