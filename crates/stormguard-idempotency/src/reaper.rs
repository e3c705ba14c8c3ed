//! Deleting expired records in bounded passes.
//!
//! Replays past the retention are never served (an expired record is treated as absent and
//! replaced), so the reaper is only about space. Each pass deletes at most
//! `batch × max_batches` records, oldest retention first, so a backlog after downtime is worked
//! off over several passes instead of in one long statement that holds locks and floods the
//! replication log.

use std::sync::Arc;
use std::time::Duration;

use crate::store::{Reaped, Store, StoreError};
use stormguard::deadline::WallClock;

/// Deletes expired records from a store.
///
/// # Default
///
/// Batches of 500, at most 10 batches per pass, a pass every 60 s, [`WallClock::system`].
#[derive(Clone)]
pub struct Reaper {
    store: Arc<dyn Store>,
    clock: WallClock,
    batch: u32,
    max_batches: u32,
    interval: Duration,
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaper")
            .field("batch", &self.batch)
            .field("max_batches", &self.max_batches)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl Reaper {
    /// A reaper for `store` with the [defaults](Self#default).
    pub fn new(store: Arc<dyn Store>) -> Self {
        Reaper {
            store,
            clock: WallClock::system(),
            batch: 500,
            max_batches: 10,
            interval: Duration::from_secs(60),
        }
    }

    /// Records deleted per store call (at least 1).
    pub fn with_batch(mut self, batch: u32) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Store calls per pass (at least 1): the bound on one pass's cost.
    pub fn with_max_batches(mut self, max_batches: u32) -> Self {
        self.max_batches = max_batches.max(1);
        self
    }

    /// Time between passes in [`spawn`](Self::spawn).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The clock that decides what has expired (use the layer's).
    pub fn with_clock(mut self, clock: WallClock) -> Self {
        self.clock = clock;
        self
    }

    /// One pass: batches until a batch comes back short or `max_batches` ran. Deletes at most
    /// `batch × max_batches` records.
    pub async fn run_pass(&self) -> Result<Reaped, StoreError> {
        let mut total = Reaped::default();
        for _ in 0..self.max_batches {
            let now = self.clock.now_millis();
            let r = self.store.reap(now, self.batch).await?;
            total.removed += r.removed;
            total.more = r.more;
            if !r.more {
                break;
            }
        }
        Ok(total)
    }

    /// Runs a pass every interval on the current tokio runtime until the handle is aborted.
    /// Failures are logged and the next pass tries again.
    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match self.run_pass().await {
                    Ok(r) => tracing::debug!(
                        removed = r.removed,
                        more = r.more,
                        "idempotency reaper pass"
                    ),
                    Err(e) => tracing::warn!(error = %e, "idempotency reaper pass failed"),
                }
            }
        })
    }
}
