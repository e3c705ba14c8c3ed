//! Publishing outbox messages to NATS JetStream.
//!
//! A message counts as published when JetStream has acknowledged storing it in a stream (a
//! plain NATS publish would be fire-and-forget). Each carries the outbox `event_id` as its
//! `Nats-Msg-Id` header, which JetStream itself deduplicates within the stream's duplicate
//! window (two minutes by default): a message the relay publishes twice (a crash between
//! publishing and marking) is stored once if the second try comes within the window, and
//! consumers still deduplicate by that id with
//! [`mark_processed`](super::sqlite::mark_processed) (or the other databases' equivalent) for
//! anything later. The subject is the prefix given to [`JetStreamPublisher::new`] followed by
//! the topic.

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use axum::BoxError;

use super::{OutboxMessage, Publisher};

/// The header JetStream deduplicates by.
pub const MSG_ID: &str = "Nats-Msg-Id";

/// A [`Publisher`] into JetStream: `subject_prefix` + topic, acknowledged by the stream.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use stormguard_idempotency::exactly_once::nats::JetStreamPublisher;
///
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let jetstream = async_nats::jetstream::new(client);
/// // A stream capturing "events.>" must exist (see `Context::get_or_create_stream`).
/// let publisher = JetStreamPublisher::new(jetstream, "events.");
/// # let _ = publisher; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct JetStreamPublisher {
    jetstream: Context,
    subject_prefix: String,
}

impl JetStreamPublisher {
    /// Publishes to `subject_prefix` + each message's topic.
    pub fn new(jetstream: Context, subject_prefix: impl Into<String>) -> Self {
        JetStreamPublisher {
            jetstream,
            subject_prefix: subject_prefix.into(),
        }
    }

    /// The subject a message of `topic` goes to.
    pub fn subject(&self, topic: &str) -> String {
        format!("{}{topic}", self.subject_prefix)
    }
}

impl Publisher for JetStreamPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        let mut headers = HeaderMap::new();
        headers.insert(MSG_ID, message.event_id.as_str());
        let ack = self
            .jetstream
            .publish_with_headers(
                self.subject(&message.topic),
                headers,
                message.payload.clone().into(),
            )
            .await?
            .await?;
        if ack.duplicate {
            tracing::debug!(
                event_id = message.event_id,
                "JetStream already had this message (deduplicated by Nats-Msg-Id)"
            );
        }
        Ok(())
    }
}
