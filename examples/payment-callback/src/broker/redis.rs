//! Redis Streams: `XADD` to [`STREAM_KEY`], read through the consumer group
//! [`CONSUMER`] with `XREADGROUP`, acknowledged with `XACK`. A
//! restarted consumer first re-reads its own pending (delivered, unacknowledged) entries.

use std::collections::HashSet;

use redis::aio::ConnectionManager;
use stormguard_idempotency::exactly_once::OutboxMessage;
use stormguard_idempotency::store::Millis;

use super::{BrokerCounts, BrokerError, event};
use crate::callback::ORDER_PAID;
use crate::store::{CONSUMER, Consumed, Event, Store};

/// The Redis stream that carries `order.paid`.
pub const STREAM_KEY: &str = "stormguard:payment-callback:order.paid";

/// The consumer's name inside the group: one consumer, the same after a restart, so a
/// restarted process finds the entries its predecessor received but never acknowledged.
const CONSUMER_NAME: &str = "notifier-1";

type StreamEntry = (String, Vec<Vec<u8>>);

/// A connection to the stream.
#[derive(Clone)]
pub struct RedisBroker {
    conn: ConnectionManager,
}

fn field<'a>(fields: &'a [Vec<u8>], name: &str) -> Option<&'a [u8]> {
    fields
        .chunks_exact(2)
        .find(|kv| kv[0] == name.as_bytes())
        .map(|kv| kv[1].as_slice())
}

impl RedisBroker {
    /// Connects, creating the stream and the consumer group if needed.
    pub async fn connect(url: &str) -> Result<Self, BrokerError> {
        let client = redis::Client::open(url)?;
        let broker = RedisBroker {
            conn: ConnectionManager::new(client).await?,
        };
        broker.create_group().await?;
        Ok(broker)
    }

    async fn create_group(&self) -> Result<(), BrokerError> {
        let created: Result<(), redis::RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(STREAM_KEY)
            .arg(CONSUMER)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.conn.clone())
            .await;
        match created {
            Err(e) if e.code() != Some("BUSYGROUP") => Err(e.into()),
            _ => Ok(()),
        }
    }

    pub(super) async fn publish(&self, message: &OutboxMessage) -> Result<(), BrokerError> {
        let _id: String = redis::cmd("XADD")
            .arg(STREAM_KEY)
            .arg("*")
            .arg("event_id")
            .arg(&message.event_id)
            .arg("topic")
            .arg(&message.topic)
            .arg("payload")
            .arg(&message.payload)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    pub(super) async fn consume_once(
        &self,
        store: &Store,
        batch: u32,
        now: Millis,
    ) -> Result<Consumed, BrokerError> {
        let mut conn = self.conn.clone();
        // Our own pending entries first (a predecessor crashed before XACK), then new.
        let mut entries = read_group(&mut conn, "0", batch).await?;
        if entries.is_empty() {
            entries = read_group(&mut conn, ">", batch).await?;
        }
        let (ids, events): (Vec<String>, Vec<Event>) = entries
            .into_iter()
            .map(|(id, fields)| {
                let event_id = field(&fields, "event_id")
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                let payload = field(&fields, "payload").unwrap_or_default().to_vec();
                (id, event(event_id, payload))
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

    pub(super) async fn counts(&self, prefix: &str) -> Result<BrokerCounts, BrokerError> {
        let mut conn = self.conn.clone();
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

    pub(super) async fn reset(&self) -> Result<(), BrokerError> {
        let _: i64 = redis::cmd("DEL")
            .arg(STREAM_KEY)
            .query_async(&mut self.conn.clone())
            .await?;
        self.create_group().await
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
