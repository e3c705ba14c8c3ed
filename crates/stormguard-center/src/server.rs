//! The center: its state, its router, and how it runs.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::auth::{Role, new_token, token_hash};
use crate::hub::Hub;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::retry::{RandomSource as _, SeededRandom};

use crate::store::{NOTIFY_CHANNEL, Store, StoreError, StoreKind, TokenRow};

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
    targets: crate::collect::ScrapeTargets,
    history: crate::collect::MetricHistory,
    listener: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Taken by the rule runner for each observation and by the rule routes for each edit,
    /// so that an edit on this replica never lands between a rule's decision and its
    /// publish (per process: another replica's edits are not ordered by it).
    rule_turn: tokio::sync::Mutex<()>,
    /// How many reverts the rule routes have written (for an edit or a deletion): the
    /// rule runner reads its rules' phases back from the store when this changes, since an
    /// edit whose revert was published but whose own write then failed leaves the rule
    /// stored as it was, and the runner's engine still holding it fired.
    edit_reverts: std::sync::atomic::AtomicU64,
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
                targets: crate::collect::ScrapeTargets::default(),
                history: crate::collect::MetricHistory::default(),
                listener: std::sync::Mutex::new(None),
                rule_turn: tokio::sync::Mutex::new(()),
                edit_reverts: std::sync::atomic::AtomicU64::new(0),
            }),
        };
        if let Some(pool) = store.postgres_pool() {
            let listener = listen(pool).await.map_err(|source| StoreError::Database {
                store: StoreKind::Postgres,
                source,
            })?;
            let weak = Arc::downgrade(&center.inner);
            let task = tokio::spawn(follow_other_replicas(listener, pool.clone(), weak));
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

    /// Waits for the turn to run or change rules (see `Inner::rule_turn`).
    pub(crate) async fn rule_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.rule_turn.lock().await
    }

    /// How many reverts the rule routes have written (see `Inner::edit_reverts`).
    pub(crate) fn edit_reverts(&self) -> u64 {
        self.inner
            .edit_reverts
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Counts one revert written by the rule routes (a version, or a hand-over alone).
    pub(crate) fn count_edit_revert(&self) {
        self.inner
            .edit_reverts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn hub(&self) -> &Hub {
        &self.inner.hub
    }

    /// The configuration.
    pub fn config(&self) -> &CenterConfig {
        &self.inner.config
    }

    /// Where this replica scrapes each instance's `/metrics` (announced with the watches,
    /// or added by the operator).
    pub fn scrape_targets(&self) -> &crate::collect::ScrapeTargets {
        &self.inner.targets
    }

    /// The recent rounds of observations of each service, as a [`Collector`] records them
    /// (the last [`DEFAULT_HISTORY_ROUNDS`] per service): what the dashboard charts.
    ///
    /// [`Collector`]: crate::collect::Collector
    /// [`DEFAULT_HISTORY_ROUNDS`]: crate::collect::DEFAULT_HISTORY_ROUNDS
    pub fn metric_history(&self) -> &crate::collect::MetricHistory {
        &self.inner.history
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

/// A connection listening on [`NOTIFY_CHANNEL`]. It does not reconnect by itself: a lost
/// connection ends [`PgListener::try_recv`](sqlx::postgres::PgListener::try_recv) at once,
/// and [`follow_other_replicas`] reconnects and catches up.
async fn listen(pool: &sqlx::PgPool) -> Result<sqlx::postgres::PgListener, sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.eager_reconnect(false);
    listener.listen(NOTIFY_CHANNEL).await?;
    Ok(listener)
}

/// Refreshes this replica's watched services whenever another replica announces a change.
///
/// Notifications sent while no connection listens are lost (PostgreSQL restarted, the
/// network cut): after a lost connection it connects again (retrying with a jittered
/// backoff from 50 ms to 2 s while the database is down) and then refreshes every watched
/// service, so that a change made in the gap reaches the watchers all the same.
async fn follow_other_replicas(
    mut listener: sqlx::postgres::PgListener,
    pool: sqlx::PgPool,
    center: std::sync::Weak<Inner>,
) {
    let backoff = Backoff::exponential(Duration::from_millis(50))
        .with_cap(Duration::from_secs(2))
        .with_jitter(Jitter::Full);
    let mut rng = SeededRandom::from_entropy().rng();
    loop {
        let lost = loop {
            let received = listener.try_recv().await;
            let Some(inner) = center.upgrade() else {
                return;
            };
            match received {
                Ok(Some(notification)) => {
                    if let Err(error) = inner.hub.refresh(notification.payload()).await {
                        tracing::warn!(%error, "stormguard center: refreshing after a notification failed");
                    }
                }
                Ok(None) => break "closed".to_owned(),
                Err(error) => break error.to_string(),
            }
        };
        tracing::warn!(error = %lost, "stormguard center: LISTEN connection lost; reconnecting");
        let mut failures = 0u32;
        let mut previous = None;
        listener = loop {
            failures = failures.saturating_add(1);
            let delay = backoff.delay(failures, previous, &mut rng);
            previous = Some(delay);
            tokio::time::sleep(delay).await;
            let Some(inner) = center.upgrade() else {
                return;
            };
            let caught_up = match listen(&pool).await {
                // Listening before reading: a change after the read is notified.
                Ok(listener) => inner.hub.refresh_all().await.map(|()| listener),
                Err(error) => Err(StoreError::Database {
                    store: StoreKind::Postgres,
                    source: error,
                }),
            };
            match caught_up {
                Ok(listener) => break listener,
                Err(error) => {
                    tracing::warn!(%error, "stormguard center: LISTEN reconnect failed; retrying");
                }
            }
        };
        tracing::info!("stormguard center: LISTEN connection restored; watched services refreshed");
    }
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
