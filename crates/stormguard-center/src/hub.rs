//! What each watched service's instances should run now, shared with every watcher of this
//! replica.
//!
//! One `tokio::sync::watch` channel per service holds the service's [`Release`]: its stable
//! version and its canary. A watcher needs only the latest release, never the ones in
//! between (each event is a full snapshot), which is exactly what a watch channel keeps; a
//! publish costs one store read and one send, however many instances watch. After every
//! change the replica that made it refreshes the channel from the store; with PostgreSQL,
//! the other replicas do the same when the change's notification reaches them.
//!
//! The hub holds the services watched on this replica and no others: a watch makes its
//! service's channel (loading it from the store), the last watcher to leave removes it, and
//! a read (a status, a poll, an ACK) uses the channel if there is one and reads the store
//! if not, never making one. Whatever names callers send, memory follows the watchers.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::store::{Store, StoreError};
use crate::version::Snapshot;

/// Which instances a canary version is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Selector {
    /// This percentage of instances (0–100), chosen by a stable hash of the instance id: the
    /// same instances every time, and a larger share includes a smaller one's instances.
    Share(u8),
    /// The instances that carry every one of these labels.
    Labels(BTreeMap<String, String>),
}

impl Selector {
    /// Whether the instance is among the canary's.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use stormguard_center::Selector;
    ///
    /// let zone_a = BTreeMap::from([("zone".to_owned(), "a".to_owned())]);
    /// assert!(Selector::Labels(zone_a.clone()).selects("i-1", &zone_a));
    /// assert!(!Selector::Labels(zone_a).selects("i-1", &BTreeMap::new()));
    /// assert!(Selector::Share(100).selects("i-1", &BTreeMap::new()));
    /// assert!(!Selector::Share(0).selects("i-1", &BTreeMap::new()));
    /// ```
    pub fn selects(&self, instance: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Selector::Share(percent) => share_bucket(instance) < u64::from(*percent),
            Selector::Labels(wanted) => wanted.iter().all(|(k, v)| labels.get(k) == Some(v)),
        }
    }
}

/// The instance's bucket in 0..100, the same on every replica and every run.
fn share_bucket(instance: &str) -> u64 {
    let digest = Sha256::digest(instance.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) % 100
}

/// A service's stable version and its canary.
#[derive(Clone, Debug, Default)]
pub(crate) struct Release {
    pub(crate) stable: Option<Arc<Snapshot>>,
    pub(crate) canary: Option<(Arc<Snapshot>, Selector)>,
}

impl Release {
    /// The version this instance should run.
    pub(crate) fn target(
        &self,
        instance: &str,
        labels: &BTreeMap<String, String>,
    ) -> Option<&Arc<Snapshot>> {
        match &self.canary {
            Some((canary, selector)) if selector.selects(instance, labels) => Some(canary),
            _ => self.stable.as_ref(),
        }
    }

    fn versions(&self) -> (Option<u64>, Option<u64>) {
        (
            self.stable.as_ref().map(|s| s.version),
            self.canary.as_ref().map(|(s, _)| s.version),
        )
    }

    /// The snapshot of `version` if it is the stable or the canary one.
    pub(crate) fn find(&self, version: u64) -> Option<&Arc<Snapshot>> {
        self.stable
            .iter()
            .chain(self.canary.iter().map(|(s, _)| s))
            .find(|s| s.version == version)
    }
}

type Services = Mutex<HashMap<String, watch::Sender<Arc<Release>>>>;

/// The releases of the services watched on this replica.
#[derive(Debug)]
pub(crate) struct Hub {
    store: Store,
    services: Arc<Services>,
    /// One refresh at a time: a refresh that read the store later always sends later, so
    /// two refreshes racing cannot leave the older release in the channel.
    refreshing: tokio::sync::Mutex<()>,
}

impl Hub {
    pub(crate) fn new(store: Store) -> Hub {
        Hub {
            store,
            services: Arc::new(Mutex::new(HashMap::new())),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<Arc<Release>>>> {
        lock(&self.services)
    }

    /// The service's release now: the watched one, or read from the store (without
    /// keeping it) when nobody here watches the service.
    pub(crate) async fn current(&self, service: &str) -> Result<Arc<Release>, StoreError> {
        if let Some(sender) = self.lock().get(service) {
            return Ok(sender.borrow().clone());
        }
        Ok(Arc::new(load(&self.store, service).await?))
    }

    /// Whether the hub holds the service's channel (someone here watches it).
    #[cfg(test)]
    fn holds(&self, service: &str) -> bool {
        self.lock().contains_key(service)
    }

    /// A watcher's subscription to the service's release, loading it from the store the
    /// first time; the channel goes when its last subscription does.
    pub(crate) async fn subscribe(&self, service: &str) -> Result<Subscription, StoreError> {
        let subscription = |receiver| Subscription {
            receiver,
            service: service.to_owned(),
            services: Arc::clone(&self.services),
        };
        if let Some(sender) = self.lock().get(service) {
            return Ok(subscription(sender.subscribe()));
        }
        let release = Arc::new(load(&self.store, service).await?);
        let receiver = self
            .lock()
            .entry(service.to_owned())
            .or_insert_with(|| watch::Sender::new(release))
            .subscribe();
        // Held before the next wait: a watcher that leaves during it (its request dropped)
        // or a read that fails drops the subscription, and with it a channel nobody watches.
        let subscribed = subscription(receiver);
        // A change committed between the load and the insert found no channel to refresh:
        // read once more now that the channel is there.
        self.refresh(service).await?;
        Ok(subscribed)
    }

    /// Reads the service's release again and tells its watchers if it changed.
    pub(crate) async fn refresh(&self, service: &str) -> Result<(), StoreError> {
        if !self.lock().contains_key(service) {
            return Ok(()); // nobody here watches it; the first watcher loads it
        }
        let _one_at_a_time = self.refreshing.lock().await;
        let release = load(&self.store, service).await?;
        if let Some(sender) = self.lock().get(service) {
            sender.send_if_modified(|current| {
                if current.versions() == release.versions() {
                    return false;
                }
                *current = Arc::new(release);
                true
            });
        }
        Ok(())
    }

    /// Reads every watched service's release again (after missed notifications).
    pub(crate) async fn refresh_all(&self) -> Result<(), StoreError> {
        let services: Vec<String> = self.lock().keys().cloned().collect();
        for service in services {
            self.refresh(&service).await?;
        }
        Ok(())
    }

    /// Ends every watch stream (the replica is shutting down).
    pub(crate) fn close(&self) {
        self.lock().clear();
    }
}

fn lock(
    services: &Services,
) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<Arc<Release>>>> {
    services
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One watcher's receiver of its service's release. Dropping the last one of a service
/// removes the service's channel from the hub.
#[derive(Debug)]
pub(crate) struct Subscription {
    pub(crate) receiver: watch::Receiver<Arc<Release>>,
    service: String,
    services: Arc<Services>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut services = lock(&self.services);
        // Under the lock no receiver is added (the hub's only receivers come from
        // `Sender::subscribe`, under this lock): one receiver left is this one. The channel
        // may also be a newer one made after a `close`; that is not ours to remove.
        let last = services.get(&self.service).is_some_and(|sender| {
            let ours = sender.subscribe().same_channel(&self.receiver);
            ours && sender.receiver_count() == 1
        });
        if last {
            services.remove(&self.service);
        }
    }
}

async fn load(store: &Store, service: &str) -> Result<Release, StoreError> {
    let Some(row) = store.release(service).await? else {
        return Ok(Release::default());
    };
    let snapshot = |version: Option<i64>| async move {
        match version.and_then(|v| u64::try_from(v).ok()) {
            None => Ok::<_, StoreError>(None),
            Some(v) => Ok(store
                .version(service, v)
                .await?
                .map(|row| Arc::new(Snapshot::from(row)))),
        }
    };
    let stable = snapshot(row.stable).await?;
    let canary = match (snapshot(row.canary).await?, row.selector) {
        (Some(canary), Some(selector)) => serde_json::from_str(&selector)
            .ok()
            .map(|selector| (canary, selector)),
        _ => None,
    };
    Ok(Release { stable, canary })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_larger_share_keeps_every_instance_of_a_smaller_one(id in "[a-z0-9-]{1,20}", small in 0u8..=100, extra in 0u8..=100) {
            let large = small.saturating_add(extra).min(100);
            let none = BTreeMap::new();
            if Selector::Share(small).selects(&id, &none) {
                prop_assert!(Selector::Share(large).selects(&id, &none));
            }
        }
    }

    async fn memory_store() -> Store {
        Store::open("sqlite::memory:").await.unwrap()
    }

    #[tokio::test]
    async fn reads_make_no_channel_and_the_last_watcher_removes_it() {
        let hub = Hub::new(memory_store().await);
        // Any well-formed name may be read; none stays.
        for i in 0..100 {
            assert!(
                hub.current(&format!("svc-{i}"))
                    .await
                    .unwrap()
                    .stable
                    .is_none()
            );
        }
        assert!(hub.lock().is_empty());
        let one = hub.subscribe("orders").await.unwrap();
        let two = hub.subscribe("orders").await.unwrap();
        assert!(hub.holds("orders"));
        drop(one);
        assert!(hub.holds("orders"), "a watcher is left");
        drop(two);
        assert!(!hub.holds("orders"));
    }

    #[tokio::test]
    async fn a_watcher_that_leaves_while_subscribing_leaves_no_channel() {
        let hub = Hub::new(memory_store().await);
        let mut subscribing = Box::pin(hub.subscribe("orders"));
        // Poll until the channel is in (the subscription then waits on its second read),
        // and leave there, as a watcher whose request is dropped does.
        let left_midway = loop {
            let step = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(subscribing.as_mut().poll(cx).is_ready())
            })
            .await;
            if step {
                break false;
            }
            if hub.holds("orders") {
                break true;
            }
            tokio::task::yield_now().await;
        };
        drop(subscribing);
        assert!(left_midway, "the store answered without a wait");
        assert!(!hub.holds("orders"), "a channel nobody watches was left");
    }

    #[tokio::test]
    async fn a_watcher_of_a_closed_channel_does_not_remove_the_new_one() {
        let hub = Hub::new(memory_store().await);
        let old = hub.subscribe("orders").await.unwrap();
        hub.close();
        let new = hub.subscribe("orders").await.unwrap();
        drop(old);
        assert!(hub.holds("orders"));
        drop(new);
        assert!(!hub.holds("orders"));
    }

    #[test]
    fn a_share_takes_about_its_percentage_of_instances() {
        let none = BTreeMap::new();
        let chosen = (0..10_000)
            .filter(|i| Selector::Share(10).selects(&format!("instance-{i}"), &none))
            .count();
        assert!((800..1200).contains(&chosen), "{chosen} of 10000 for 10%");
    }
}
