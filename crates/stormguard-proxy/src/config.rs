//! What one proxy process does: which direction, where it listens, where it forwards, and the
//! options of each direction.
//!
//! A sidecar runs two proxies (two processes, or two [`Proxy`](crate::Proxy) values in one):
//! an ingress in front of its service and an egress for the service's outgoing calls. They
//! share nothing but the metrics registry, so one can restart without the other.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    /// How upstream connections are opened and kept ([`PoolConfig::default`] unless tuned).
    pub pool: PoolConfig,
}

/// How the proxy opens and keeps its connections to an upstream: how long a connect may
/// take, and how long an idle connection is kept for the next request. Both apply to the
/// HTTP/1.1 pools and to the HTTP/2 (h2c) client alike.
///
/// # Default
///
/// - `connect_timeout`: 5 s, Envoy's default for a cluster. Without one a connect to a host
///   that drops the SYN lasts as long as the kernel retries it (about 127 s on Linux), and
///   holds the request that long unless the route has a per-try timeout. A connect that
///   fails this way sent nothing, so the client stack may retry any request after it. An
///   egress route whose policy sets `timeouts.connect` connects within that instead.
/// - `idle_timeout`: 4 s. An idle connection must be closed by the proxy *before* the
///   upstream closes it: otherwise a request sent as the upstream's close crosses it fails
///   after it left (in doubt, not retried unless idempotent). Node's HTTP server closes idle
///   connections after 5 s (`keepAliveTimeout`), as do uvicorn and Apache, so 4 s stays
///   under the shortest common server keep-alive; an upstream that keeps them longer loses
///   only a reconnect after a pause of more than 4 s. (hyper-util's pool keeps them 90 s.)
///
/// ```
/// use std::time::Duration;
/// use stormguard_proxy::PoolConfig;
///
/// let pool = PoolConfig::new().with_connect_timeout(Duration::from_secs(1));
/// assert!(pool.validate().is_ok());
/// assert!(PoolConfig::new().with_idle_timeout(Duration::ZERO).validate().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    connect_timeout: Duration,
    idle_timeout: Duration,
}

impl PoolConfig {
    /// The default connect timeout (see [`PoolConfig`]).
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default idle timeout (see [`PoolConfig`]).
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(4);
    /// The longest connect timeout accepted: past a minute a connect is not slow but lost.
    pub const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
    /// The longest idle timeout accepted: an hour (Envoy's default idle timeout).
    pub const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

    /// The defaults.
    pub const fn new() -> PoolConfig {
        PoolConfig {
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
        }
    }

    /// Bounds opening a connection (the TCP connect, name resolution included).
    pub const fn with_connect_timeout(mut self, timeout: Duration) -> PoolConfig {
        self.connect_timeout = timeout;
        self
    }

    /// Closes a connection idle this long.
    pub const fn with_idle_timeout(mut self, timeout: Duration) -> PoolConfig {
        self.idle_timeout = timeout;
        self
    }

    /// The connect timeout.
    pub const fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The idle timeout.
    pub const fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    /// Checks each setting: more than zero, and at most its maximum.
    pub fn validate(&self) -> Result<(), InvalidPool> {
        let check = |field, value: Duration, max| {
            if value.is_zero() || value > max {
                Err(InvalidPool { field, value, max })
            } else {
                Ok(())
            }
        };
        check(
            "pool.connect_timeout",
            self.connect_timeout,
            Self::MAX_CONNECT_TIMEOUT,
        )?;
        check(
            "pool.idle_timeout",
            self.idle_timeout,
            Self::MAX_IDLE_TIMEOUT,
        )
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig::new()
    }
}

/// A [`PoolConfig`] setting out of its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value:?}: must be more than zero and at most {max:?}")]
pub struct InvalidPool {
    /// The setting (`pool.connect_timeout`, `pool.idle_timeout`).
    pub field: &'static str,
    /// The value given.
    pub value: Duration,
    /// Its maximum.
    pub max: Duration,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_settings_are_checked_against_zero_and_their_maximum() {
        assert_eq!(PoolConfig::default().validate(), Ok(()));
        let max = PoolConfig::new()
            .with_connect_timeout(PoolConfig::MAX_CONNECT_TIMEOUT)
            .with_idle_timeout(PoolConfig::MAX_IDLE_TIMEOUT);
        assert_eq!(max.validate(), Ok(()));
        let field = |pool: PoolConfig| pool.validate().map_err(|e| e.field);
        let second = Duration::from_secs(1);
        assert_eq!(
            field(PoolConfig::new().with_connect_timeout(Duration::ZERO)),
            Err("pool.connect_timeout")
        );
        assert_eq!(
            field(PoolConfig::new().with_connect_timeout(PoolConfig::MAX_CONNECT_TIMEOUT + second)),
            Err("pool.connect_timeout")
        );
        assert_eq!(
            field(PoolConfig::new().with_idle_timeout(Duration::ZERO)),
            Err("pool.idle_timeout")
        );
        assert_eq!(
            field(PoolConfig::new().with_idle_timeout(PoolConfig::MAX_IDLE_TIMEOUT + second)),
            Err("pool.idle_timeout")
        );
    }
}
