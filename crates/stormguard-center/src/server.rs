//! The center: its state, its router, and how it runs.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::auth::{Role, new_token, token_hash};
use crate::hub::Hub;
use crate::store::{NOTIFY_CHANNEL, Store, StoreError, TokenRow};

/// How a center runs.
///
/// # Default
///
/// Bodies up to 1 MiB, a keep-alive comment on each watch stream every 15 s, no `/metrics`
/// (set [`metrics`](Self::metrics) to serve them), 32 watch admissions at once.
#[derive(Clone, Debug)]
pub struct CenterConfig {
    /// The largest request body accepted; a larger one is refused with 413 unread.
    pub body_limit: usize,
    /// How often an idle watch stream carries a comment, so that proxies and the instance
    /// see the connection is alive.
    pub keep_alive: Duration,
    /// The Prometheus exporter whose text `/metrics` serves.
    pub metrics: Option<PrometheusHandle>,
    /// How many new watchers are admitted at once (their token checked, their instance
    /// recorded, their first snapshot read). When a restart brings every instance back at
    /// once, the rest wait briefly in a queue and are then refused with 503 and
    /// `Retry-After`, and come back after their jittered backoff, instead of piling up on
    /// the store. An admitted watch holds no slot while it streams.
    pub watch_admissions: u32,
    /// Also put every stable version into this NATS JetStream bucket ([`crate::fanout`]).
    pub fanout: Option<crate::fanout::NatsFanout>,
    /// A publish whose policies have a lint finding ([`stormguard::lint::lint_policy_file`])
    /// at or above this severity is refused with 422, the findings named; `None` publishes
    /// whatever validates. A rollback is not linted: it republishes a version that was
    /// accepted once, and an emergency must not wait on a rule added since.
    pub lint_blocks: Option<stormguard::lint::Severity>,
}

impl Default for CenterConfig {
    fn default() -> Self {
        CenterConfig {
            body_limit: 1024 * 1024,
            keep_alive: Duration::from_secs(15),
            metrics: None,
            watch_admissions: 32,
            fanout: None,
            lint_blocks: Some(stormguard::lint::Severity::Error),
        }
    }
}

/// A policy center replica: its store, the releases its watchers follow, its configuration.
/// Cheap to clone (the state of the router's handlers).
#[derive(Clone, Debug)]
pub struct Center {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    hub: Hub,
    config: CenterConfig,
    listener: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let listener = self
            .listener
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(task) = listener.take() {
            task.abort();
        }
    }
}

impl Center {
    /// A center on `store`. With PostgreSQL it also listens for the other replicas'
    /// changes (LISTEN/NOTIFY), so their publishes reach this replica's watchers.
    pub async fn new(store: Store, config: CenterConfig) -> Result<Center, StoreError> {
        crate::metric_names::describe();
        let hub = Hub::new(store.clone());
        let center = Center {
            inner: Arc::new(Inner {
                store: store.clone(),
                hub,
                config,
                listener: std::sync::Mutex::new(None),
            }),
        };
        if let Some(pool) = store.postgres_pool() {
            let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
            listener.listen(NOTIFY_CHANNEL).await?;
            let weak = Arc::downgrade(&center.inner);
            let task = tokio::spawn(follow_other_replicas(listener, weak));
            *center
                .inner
                .listener
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(task);
        }
        Ok(center)
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    pub(crate) fn hub(&self) -> &Hub {
        &self.inner.hub
    }

    /// The configuration.
    pub fn config(&self) -> &CenterConfig {
        &self.inner.config
    }

    /// Makes a new token with this role (an `instance` token is for `service` only) and
    /// returns it: the only time it is seen, the center keeps its hash.
    pub async fn create_token(
        &self,
        name: &str,
        role: Role,
        service: Option<&str>,
    ) -> Result<String, StoreError> {
        let token = new_token();
        self.add_token(&token, name, role, service).await?;
        Ok(token)
    }

    /// Stores the hash of a token chosen outside (the bootstrap admin token of
    /// `stormguard center --admin-token`). Adding a token that exists changes nothing.
    pub async fn add_token(
        &self,
        token: &str,
        name: &str,
        role: Role,
        service: Option<&str>,
    ) -> Result<(), StoreError> {
        let row = TokenRow {
            hash: token_hash(token),
            name: name.to_owned(),
            role: role.as_str().to_owned(),
            service: service.map(str::to_owned),
        };
        self.inner.store.insert_token(&row, now_ms()).await
    }

    /// The HTTP API (see the [crate docs](crate#http-api)).
    pub fn router(&self) -> axum::Router {
        crate::api::router(self.clone())
    }

    /// Ends every watch stream of this replica: their instances reconnect (to another
    /// replica, or to this one once it serves again). Call before a graceful shutdown, which
    /// otherwise waits for the streams.
    pub fn close_watches(&self) {
        self.inner.hub.close();
    }

    /// Serves the API on `listener` until `shutdown` completes, then ends the watch streams
    /// and waits for the requests in flight.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let router = self.router();
        let center = self.clone();
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                shutdown.await;
                center.close_watches();
            })
            .await
    }
}

/// Refreshes this replica's watched services whenever another replica announces a change;
/// after a lost connection (missed notifications) it refreshes them all.
async fn follow_other_replicas(
    mut listener: sqlx::postgres::PgListener,
    center: std::sync::Weak<Inner>,
) {
    loop {
        let received = listener.try_recv().await;
        let Some(inner) = center.upgrade() else {
            return;
        };
        let refreshed = match received {
            Ok(Some(notification)) => inner.hub.refresh(notification.payload()).await,
            Ok(None) => inner.hub.refresh_all().await,
            Err(error) => {
                tracing::warn!(%error, "stormguard center: LISTEN connection lost; retrying");
                drop(inner);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = refreshed {
            tracing::warn!(%error, "stormguard center: refreshing after a notification failed");
        }
    }
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
