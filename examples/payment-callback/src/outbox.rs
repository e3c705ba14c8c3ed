//! The `order.paid` event's way out: the outbox relay, the broker publisher and the consumer.
//!
//! The handler only *enqueues* the event, in the transaction that records the payment. Two
//! background tasks take it from there:
//!
//! - the **relay** (stormguard-idempotency's `Relay`) publishes pending outbox messages in
//!   order, at least once, each with its stable event id, through [`BrokerPublisher`] — the
//!   `message-publish` policy: one retry after 100 ms, and a message that still fails stays
//!   pending for the next pass;
//! - the **consumer** takes messages from the broker and applies each one in a transaction
//!   with `mark_processed`, so a message published twice (the relay crashed between publishing
//!   and marking) is applied once.
//!
//! Both wake up when there is work ([`Notify`]) and otherwise poll at a short interval, so a
//! restarted process picks up whatever its predecessor left pending.

use std::sync::Arc;
use std::time::Duration;

use axum::BoxError;
use stormguard::budget::Unlimited;
use stormguard::classify::Outcome;
use stormguard::deadline::WallClock;
use stormguard::policy::EndpointPolicy;
use stormguard::retry::{InvalidPolicy, Retrier, SeededRandom};
use stormguard_idempotency::exactly_once::{OutboxMessage, Publisher};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::broker::{Broker, BrokerError};
use crate::store::Store;

/// Publishes outbox messages to the broker, under the `message-publish` policy.
#[derive(Debug)]
pub struct BrokerPublisher {
    broker: Broker,
    retrier: Retrier<Unlimited, (), SeededRandom>,
    wall: WallClock,
}

impl BrokerPublisher {
    /// A publisher into `broker`, retrying by `policy`'s retry policy.
    ///
    /// # Errors
    ///
    /// The [`InvalidPolicy`] the retrier refuses.
    pub fn new(broker: Broker, policy: &EndpointPolicy, seed: u64) -> Result<Self, InvalidPolicy> {
        Ok(BrokerPublisher {
            broker,
            retrier: Retrier::new(*policy.retry())?.with_random(SeededRandom::new(seed)),
            wall: WallClock::system(),
        })
    }
}

impl Publisher for BrokerPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        let now = self.wall.now_millis();
        self.retrier
            .run(
                |_| self.broker.publish(message, now),
                |r: &Result<(), BrokerError>| match r {
                    Ok(()) => Outcome::Success,
                    Err(e) => e.classify(),
                },
            )
            .await
            .map_err(|e| Box::new(e) as BoxError)
    }
}

/// The relay and consumer tasks of one service; aborted on drop.
#[derive(Debug)]
pub struct Background {
    relay_wake: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
}

impl Background {
    /// Starts the relay (publishing with `publisher`) and the consumer (reading `broker`)
    /// on `store`, polling every `idle` when not woken.
    pub fn start(
        store: Store,
        broker: Broker,
        publisher: BrokerPublisher,
        idle: Duration,
    ) -> Background {
        let relay_wake = Arc::new(Notify::new());
        let consumer_wake = Arc::new(Notify::new());
        let relay = tokio::spawn(relay_loop(
            store.clone(),
            publisher,
            relay_wake.clone(),
            consumer_wake.clone(),
            idle,
        ));
        let consumer = tokio::spawn(consumer_loop(store, broker, consumer_wake, idle));
        Background {
            relay_wake,
            tasks: vec![relay, consumer],
        }
    }

    /// What to notify when a message was enqueued, so the relay runs at once.
    pub fn relay_waker(&self) -> Arc<Notify> {
        self.relay_wake.clone()
    }
}

impl Background {
    /// Stops both tasks and waits until they have.
    pub async fn stop(mut self) {
        for task in std::mem::take(&mut self.tasks) {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn relay_loop(
    store: Store,
    publisher: BrokerPublisher,
    wake: Arc<Notify>,
    consumer: Arc<Notify>,
    idle: Duration,
) {
    let wall = WallClock::system();
    loop {
        match store.relay_once(&publisher, wall.now_millis()).await {
            Ok(report) => {
                if report.published > 0 {
                    metrics::counter!("payment_outbox_published_total").increment(report.published);
                    consumer.notify_one();
                }
                if let Some(error) = report.failed {
                    tracing::warn!(%error, "outbox publish failed; the message stays pending");
                } else if report.published > 0 {
                    // There may be more than one batch.
                    continue;
                }
            }
            Err(e) => tracing::warn!(error = %e, "outbox relay pass failed; will try again"),
        }
        let _ = tokio::time::timeout(idle, wake.notified()).await;
    }
}

async fn consumer_loop(store: Store, broker: Broker, wake: Arc<Notify>, idle: Duration) {
    let wall = WallClock::system();
    loop {
        match broker.consume_once(&store, 100, wall.now_millis()).await {
            Ok(done) => {
                if done.applied > 0 {
                    metrics::counter!("payment_events_applied_total").increment(done.applied);
                }
                if done.duplicates > 0 {
                    metrics::counter!("payment_events_duplicate_total").increment(done.duplicates);
                    tracing::info!(
                        duplicates = done.duplicates,
                        "consumer skipped events it had already applied"
                    );
                }
                if done.received > 0 {
                    continue;
                }
            }
            Err(e) => tracing::warn!(error = %e, "consumer pass failed; will try again"),
        }
        let _ = tokio::time::timeout(idle, wake.notified()).await;
    }
}
