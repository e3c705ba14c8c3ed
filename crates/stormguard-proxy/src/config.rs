//! What one proxy process does: which direction, where it listens, where it forwards, and the
//! options of each direction.
//!
//! A sidecar runs two proxies (two processes, or two [`Proxy`](crate::Proxy) values in one):
//! an ingress in front of its service and an egress for the service's outgoing calls. They
//! share nothing but the metrics registry, so one can restart without the other.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use stormguard::fault::FaultConfig;
use stormguard::limit::LimiterConfig;
use stormguard::policy::PolicyFile;
use stormguard_idempotency::Store;
use stormguard_tower::DeadlineLayer;
use stormguard_tower::client::CenterWatchConfig;

use crate::upstream::Upstream;

/// One proxy: its direction, where it listens and where it forwards. A sidecar runs two (an
/// ingress and an egress), which share nothing but the metrics registry.
#[derive(Debug)]
pub struct ProxyConfig {
    /// The address the proxy serves on (HTTP/1.1 and HTTP/2 cleartext on the same port).
    pub listen: SocketAddr,
    /// The admin address (`/metrics`, `/status`, the fault switch), if any. Give it a
    /// loopback or private address: the traffic proxied must not reach it.
    pub admin: Option<SocketAddr>,
    /// Where requests go: required for an ingress; for an egress, `None` forwards each
    /// request to the host it names (see [`Upstream`]).
    pub upstream: Option<Upstream>,
    /// The direction and its options.
    pub direction: Direction,
}

/// Which side of the service the proxy is on.
#[derive(Debug)]
pub enum Direction {
    /// In front of the service: enforce deadlines, admit by the adaptive limit, deduplicate by
    /// `Idempotency-Key`.
    Ingress(IngressConfig),
    /// For the service's outgoing calls: the one client stack, routed by the policy file.
    Egress(EgressConfig),
}

/// The options of an egress proxy.
#[derive(Debug)]
pub struct EgressConfig {
    /// The routes and their endpoint policies.
    pub policy: PolicySource,
    /// Faults injected below the client stack (each attempt draws), for chaos drills; the
    /// injector can be switched at run time ([`Proxy::faults`](crate::Proxy::faults)).
    pub fault: Option<FaultConfig>,
    /// Seeds the stack's jitter and draws (tests); `None` seeds from the operating system.
    pub seed: Option<u64>,
}

/// Where an egress proxy's policies come from.
#[derive(Clone, Debug)]
pub enum PolicySource {
    /// A policy file, loaded at start and reloaded whenever it changes (through
    /// [`Policies::watch`](stormguard_tower::client::Policies::watch): the library's swap,
    /// which keeps breakers and budgets whose configuration is unchanged).
    Watched(PathBuf),
    /// Policies given in code (swap them through
    /// [`Proxy::policies`](crate::Proxy::policies)).
    Fixed(PolicyFile),
    /// Follow a policy center ([`CenterWatch`](stormguard_tower::client::CenterWatch)): each
    /// version it publishes for the service goes through the same
    /// [`Policies::swap`](stormguard_tower::client::Policies::swap) as a file reload, and is
    /// ACKed (or NACKed with the reason) to the center.
    Center(Box<CenterSource>),
}

/// A policy center to follow, and the policies to use until its first version (or the
/// last-good copy) arrives.
#[derive(Clone, Debug)]
pub struct CenterSource {
    /// The center, the service, this instance, its token and last-good file.
    pub watch: CenterWatchConfig,
    /// The policies in use before the center answers when there is no last-good copy;
    /// `None`: no endpoints (every request gets one attempt).
    pub initial: Option<PolicyFile>,
}

/// The options of an ingress proxy.
#[derive(Debug)]
pub struct IngressConfig {
    /// How incoming deadlines are read and enforced (headers, a default, a maximum).
    pub deadline: DeadlineLayer,
    /// Admission by an adaptive concurrency limit; `None` admits every request.
    pub limit: Option<LimiterConfig>,
    /// `Idempotency-Key` handling; `None` passes keys through untouched.
    pub idempotency: Option<IdempotencyConfig>,
}

impl Default for IngressConfig {
    fn default() -> Self {
        IngressConfig {
            deadline: DeadlineLayer::new(),
            limit: None,
            idempotency: None,
        }
    }
}

/// `Idempotency-Key` handling on an ingress proxy.
#[derive(Clone)]
pub struct IdempotencyConfig {
    /// The store of keys and responses.
    pub store: Arc<dyn Store>,
    /// Whether a `POST` or `PATCH` without a key is refused (`400`).
    pub key_required: bool,
}

impl std::fmt::Debug for IdempotencyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyConfig")
            .field("key_required", &self.key_required)
            .finish_non_exhaustive()
    }
}

/// Why an idempotency store could not be opened from its URL.
#[derive(Debug, thiserror::Error)]
pub enum StoreUrlError {
    /// The URL's scheme is not a store this build has (`memory`, `sqlite:PATH`, and with
    /// their features `postgres://…`, `redis://…`).
    #[error(
        "idempotency store {0:?}: unknown or not built in (memory, sqlite:PATH, postgres://, redis://)"
    )]
    Unknown(String),
    /// The store refused to open.
    #[error("idempotency store {url:?}: {source}")]
    Open {
        /// The URL.
        url: String,
        /// The store's error.
        source: stormguard_idempotency::StoreError,
    },
}

/// Opens the idempotency store named by `url`: `memory` (SQLite in memory, one process),
/// `sqlite:PATH`, and with the crate's features `postgres://…` and `redis://…`.
pub async fn open_store(url: &str) -> Result<Arc<dyn Store>, StoreUrlError> {
    use stormguard_idempotency::store::sqlite::SqliteStore;
    let open = |source| StoreUrlError::Open {
        url: url.to_owned(),
        source,
    };
    if url == "memory" || url.starts_with("sqlite:") {
        let store = match url.strip_prefix("sqlite:") {
            Some(path) => SqliteStore::open(path).await,
            None => SqliteStore::memory().await,
        }
        .map_err(open)?;
        store.migrate().await.map_err(open)?;
        return Ok(Arc::new(store));
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = stormguard_idempotency::store::postgres::PostgresStore::connect(url)
            .await
            .map_err(open)?;
        store.migrate().await.map_err(open)?;
        return Ok(Arc::new(store));
    }
    #[cfg(feature = "redis")]
    if url.starts_with("redis://") {
        let store =
            stormguard_idempotency::store::redis::RedisStore::connect(url, "stormguard-proxy")
                .await;
        return Ok(Arc::new(store.map_err(open)?));
    }
    Err(StoreUrlError::Unknown(url.to_owned()))
}
