//! Fanout through NATS JetStream for fleets beyond one center's connections.
//!
//! With `--fanout nats://…`, every change of a service's stable version is put into a
//! JetStream key-value bucket under the service's name (the value is the [`Snapshot`] a
//! watch event carries). Instances watch that key instead of holding a connection to the
//! center (`CenterWatchConfig::with_nats` in `stormguard-tower`), so a fleet of any size
//! costs the center one put per version; their ACKs and NACKs still go to the center over
//! HTTP. The bucket keeps only the latest value per key: a watcher that starts late gets
//! the current version first.
//!
//! The bucket carries stable versions only: a canary is chosen per instance, which a
//! shared key cannot do, so canary instances watch the center itself.

use std::sync::Arc;

use async_nats::jetstream::{kv, stream};

use crate::version::Snapshot;

/// The default bucket.
pub const DEFAULT_BUCKET: &str = "stormguard_policies";

/// Why the fanout could not be set up or written.
#[derive(Debug, thiserror::Error)]
#[error("NATS fanout: {0}")]
pub struct FanoutError(String);

/// The key-value bucket the center puts each service's stable version into.
#[derive(Clone)]
pub struct NatsFanout {
    bucket: Arc<kv::Store>,
    name: String,
}

impl std::fmt::Debug for NatsFanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsFanout")
            .field("bucket", &self.name)
            .finish()
    }
}

impl NatsFanout {
    /// Connects to the NATS server at `url` and opens (or creates) the bucket `name`, which
    /// keeps one value per key.
    pub async fn connect(url: &str, name: &str) -> Result<NatsFanout, FanoutError> {
        let client = async_nats::connect(url)
            .await
            .map_err(|e| FanoutError(format!("{url}: {e}")))?;
        let jetstream = async_nats::jetstream::new(client);
        if jetstream.get_key_value(name).await.is_err() {
            // The bucket's stream, made directly: `create_key_value` first asks for the
            // account's limits, an answer servers before 2.10 give in a form the client
            // cannot read. This is the stream a key-value bucket is: one subject per key,
            // the latest value kept.
            jetstream
                .get_or_create_stream(stream::Config {
                    name: format!("KV_{name}"),
                    subjects: vec![format!("$KV.{name}.>")],
                    max_messages_per_subject: 1,
                    allow_rollup: true,
                    deny_delete: true,
                    allow_direct: true,
                    discard: stream::DiscardPolicy::New,
                    ..stream::Config::default()
                })
                .await
                .map_err(|e| FanoutError(format!("bucket {name}: {e}")))?;
        }
        let bucket = jetstream
            .get_key_value(name)
            .await
            .map_err(|e| FanoutError(format!("bucket {name}: {e}")))?;
        Ok(NatsFanout {
            bucket: Arc::new(bucket),
            name: name.to_owned(),
        })
    }

    /// Puts the snapshot under its service's name.
    pub(crate) async fn put(&self, snapshot: &Snapshot) -> Result<(), FanoutError> {
        let value = serde_json::to_vec(snapshot).map_err(|e| FanoutError(e.to_string()))?;
        self.bucket
            .put(&snapshot.service, value.into())
            .await
            .map_err(|e| FanoutError(format!("put {}: {e}", snapshot.service)))?;
        Ok(())
    }
}
