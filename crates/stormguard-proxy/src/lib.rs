//! `stormguard proxy`: a sidecar that gives a service in any language the protections of
//! stormguard's library — deadlines, budgeted retries with jitter, breaking, hedging, one
//! retrying layer per chain, idempotency keys and adaptive admission — without linking it.
//!
//! # Why a sidecar, and why built from the library
//!
//! A Python, Java or Node service cannot use a Rust tower layer, and the proxies it could put
//! beside itself retry without budgets, deadlines or jitter (HAProxy's `retries 3` turns an
//! outage into four times the load). Envoy and Linkerd fill that gap with a second
//! implementation of every policy. This proxy has none: its egress *is* the library's
//! [`ClientLayer`](stormguard_tower::client::ClientLayer) routed by the same policy files, its
//! live reload is the library's [`Policies::watch`](stormguard_tower::client::Policies::watch)
//! (the same swap, the same state carried over), and its ingress is the library's server
//! layers. What the proxy adds is the plumbing: an HTTP/1.1 + h2c server, a forwarding
//! transport, answers in the caller's protocol, and an admin port.
//!
//! # The two directions
//!
//! - **Egress** ([`Direction::Egress`], [`egress`] module docs): the service
//!   sends its outgoing calls through the proxy (as an HTTP proxy, or with a `Host` header);
//!   each goes through the client stack of the route it matches (method, host and path
//!   prefix, see [`RoutePattern`](stormguard_tower::client::RoutePattern)).
//! - **Ingress** ([`Direction::Ingress`]): callers reach the service through the proxy, which
//!   enforces their deadlines, admits by the adaptive limit and deduplicates keyed requests.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use stormguard::policy::PolicyFile;
//! use stormguard_proxy::{Direction, EgressConfig, PolicySource, PoolConfig, Proxy, ProxyConfig};
//!
//! let policies = PolicyFile::from_toml(r#"
//!     [endpoints."GET users.internal/users/*"]
//!     idempotency = "idempotent"
//!     timeouts = { per_try = "300ms", overall = "1s" }
//!     retry = { max_attempts = 3 }
//!     budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
//! "#)?;
//! let proxy = Proxy::start(ProxyConfig {
//!     listen: "127.0.0.1:0".parse()?,
//!     admin: None,
//!     upstream: None, // each request goes to the host it names
//!     direction: Direction::Egress(EgressConfig {
//!         policy: PolicySource::Fixed(policies),
//!         fault: None,
//!         seed: None,
//!     }),
//!     pool: PoolConfig::default(),
//! })
//! .await?;
//! assert!(proxy.local_addr().port() != 0);
//! # Ok(()) }
//! ```

mod admin;
mod answer;
mod config;
pub mod egress;
pub mod fault_spec;
mod forward;
pub mod ingress;
mod logging;
mod pool;
mod server;
mod upstream;
mod via;

pub use admin::metrics_handle;
pub use answer::REASON_HEADER;
pub use config::{
    CenterSource, Direction, EgressConfig, IdempotencyConfig, IngressConfig, InvalidPool,
    PolicySource, PoolConfig, ProxyConfig, StoreUrlError, open_store,
};
pub use logging::init_json_logs;
pub use stormguard_tower::client::{CenterState, CenterWatchConfig};
pub use upstream::{InvalidUpstream, Upstream};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use stormguard::fault::{FaultInjector, InvalidFault};
use stormguard::policy::PolicyError;
use stormguard_tower::client::{
    CenterWatch, CenterWatchError, InvalidPolicies, Policies, PolicyWatcher, WatchError,
};
use stormguard_tower::deadline::InvalidDeadlineConfig;
use stormguard_tower::limit::AdaptiveLimitLayer;
use stormguard_tower::observe::Telemetry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// An address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The socket's error.
        source: std::io::Error,
    },
    /// An ingress proxy needs a fixed upstream.
    #[error("an ingress proxy needs --upstream (the service it stands in front of)")]
    NoUpstream,
    /// The policy file could not be read or is invalid.
    #[error("policy file: {0}")]
    Policy(#[from] PolicyError),
    /// The policies cannot be used by the client stack (a route that does not parse).
    #[error("policies: {0}")]
    Policies(#[from] InvalidPolicies),
    /// The policy file cannot be watched.
    #[error("policy watch: {0}")]
    Watch(#[from] WatchError),
    /// The policy center cannot be followed.
    #[error("policy center: {0}")]
    Center(#[from] CenterWatchError),
    /// The fault injection settings are invalid.
    #[error("faults: {0}")]
    Fault(#[from] InvalidFault),
    /// The adaptive limit's settings are invalid.
    #[error("limit: {0}")]
    Limit(#[from] stormguard::health::InvalidConfig),
    /// The deadline settings are invalid.
    #[error("deadline: {0}")]
    Deadline(#[from] InvalidDeadlineConfig),
    /// The upstream connection settings are invalid.
    #[error("{0}")]
    Pool(#[from] InvalidPool),
}

/// A running proxy: its addresses, and the handles to change it while it runs. Dropping it
/// stops serving at once: the listener closes and every connection, in progress or idle, is
/// cut; [`shutdown`](Proxy::shutdown) drains first.
pub struct Proxy {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    policies: Option<Policies<Telemetry>>,
    faults: Option<Arc<FaultInjector>>,
    limit: Option<AdaptiveLimitLayer>,
    center: Option<Arc<CenterWatch>>,
    _watcher: Option<PolicyWatcher>,
    stop: watch::Sender<Option<Duration>>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("admin_addr", &self.admin_addr)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// Builds the proxy of `config`, binds its ports and starts serving on the current tokio
    /// runtime. Every setting is checked first: a bad policy file, route or limit is an error
    /// here, never a proxy that fails requests.
    pub async fn start(config: ProxyConfig) -> Result<Proxy, ProxyError> {
        if matches!(config.direction, Direction::Ingress(_)) && config.upstream.is_none() {
            return Err(ProxyError::NoUpstream);
        }
        config.pool.validate()?;
        let listener = bind(config.listen).await?;
        let addr = local_addr(&listener, config.listen)?;
        let via = via::entry();
        // The admin port is bound, and the metrics recorder installed, before anything is
        // served: a failed bind leaves no task serving, and the first request is counted.
        let admin_port = match config.admin {
            Some(at) => {
                let listener = bind(at).await?;
                let bound = local_addr(&listener, at)?;
                let _ = metrics_handle();
                Some((listener, bound))
            }
            None => None,
        };
        let (stop, stopped) = watch::channel(None);
        // Each direction is served with its own handler type (see `server::Handler`).
        let (serving, admin, watcher) = match config.direction {
            Direction::Egress(egress) => {
                let built = egress::build(config.upstream, config.pool, egress, addr, via)?;
                let admin = admin::AdminState {
                    direction: "egress",
                    policies: Some(built.policies),
                    center: built.center,
                    limit: None,
                    faults: built.faults,
                };
                let serving = tokio::spawn(server::serve(listener, built.handler, stopped));
                (serving, admin, built.watcher)
            }
            Direction::Ingress(ingress) => {
                let upstream = config.upstream.ok_or(ProxyError::NoUpstream)?;
                let built = ingress::build(upstream, config.pool, ingress, via)?;
                let admin = admin::AdminState {
                    direction: "ingress",
                    policies: None,
                    center: None,
                    limit: built.limit,
                    faults: None,
                };
                let serving = tokio::spawn(server::serve(listener, built.handler, stopped));
                (serving, admin, None)
            }
        };
        let policies = admin.policies.clone();
        let faults = admin.faults.clone();
        let limit = admin.limit.clone();
        let center = admin.center.clone();
        let mut tasks = vec![serving];
        let admin_addr = admin_port.map(|(listener, bound)| {
            tasks.push(tokio::spawn(admin::serve(listener, admin)));
            bound
        });
        tracing::info!(%addr, admin = ?admin_addr, "stormguard proxy: serving");
        Ok(Proxy {
            addr,
            admin_addr,
            policies,
            faults,
            limit,
            center,
            _watcher: watcher,
            stop,
            tasks,
        })
    }

    /// The address the proxy serves on (the bound port when the config said port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin port's address, when it has one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The egress proxy's live policies (swap them from code; a watched file swaps them
    /// by itself). `None` for an ingress proxy.
    pub fn policies(&self) -> Option<&Policies<Telemetry>> {
        self.policies.as_ref()
    }

    /// The egress proxy's fault injector, when faults were configured: switch it or change
    /// its rates while traffic flows.
    pub fn faults(&self) -> Option<&Arc<FaultInjector>> {
        self.faults.as_ref()
    }

    /// The ingress proxy's adaptive limit, when admission is on.
    pub fn limit(&self) -> Option<&AdaptiveLimitLayer> {
        self.limit.as_ref()
    }

    /// The egress proxy's policy center watch, when it follows one: its state (the version
    /// applied, the connection), and a way to wait for a version.
    pub fn center(&self) -> Option<&CenterWatch> {
        self.center.as_deref()
    }

    /// Serves until the serving task ends (it does not, short of a panic): what a program
    /// whose only job is the proxy awaits.
    pub async fn wait(&mut self) {
        if let Some(serving) = self.tasks.first_mut() {
            let _ = serving.await;
        }
    }

    /// Stops taking connections and drains: each open connection finishes the requests it
    /// has (HTTP/1.1 closes after its response, HTTP/2 sends `GOAWAY`); those still open
    /// after `bound` are cut. Returns when every connection has ended.
    pub async fn shutdown(mut self, bound: Duration) {
        let _ = self.stop.send(Some(bound));
        if let Some(serving) = self.tasks.first_mut() {
            let _ = serving.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ProxyError> {
    stormguard_tower::listen::bind(addr)
        .await
        .map_err(|source| ProxyError::Bind { addr, source })
}

fn local_addr(listener: &TcpListener, asked: SocketAddr) -> Result<SocketAddr, ProxyError> {
    listener.local_addr().map_err(|source| ProxyError::Bind {
        addr: asked,
        source,
    })
}
