//! The policies a running stack uses, swappable while it runs.
//!
//! Every request loads the current [`Table`] once (one atomic load through `arc-swap`) and
//! uses that snapshot to its end, so a swap never gives a call half of one policy and half of
//! another, and calls in flight finish on the policy they started with. [`Policies::swap`]
//! builds the new table beside the old one — validating every endpoint first, so an invalid
//! policy never replaces a good one — carries each endpoint's state over where its own
//! configuration did not change (see [`endpoint`](super::endpoint)), and publishes it. The
//! policies already in use are not built again: the table in use stays.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use http::Method;
use stormguard::breaker::BreakerState;
use stormguard::policy::{EndpointPolicy, PolicyError, PolicyFile};
use stormguard::retry::RetryPolicy;

use super::endpoint::{Builder, Endpoint};
use super::reload::{ReloadStatus, StatusCell};
use super::route::{DEFAULT_ROUTE, InvalidRoute, RoutePattern, best_match};
use crate::observe::Observer;

/// Why a set of policies could not be used: an endpoint name that is not a route, or a policy
/// that breaks a rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPolicies {
    /// An endpoint name is neither [`DEFAULT_ROUTE`] nor a route pattern.
    #[error("endpoint {name:?} is not a route: {source}")]
    Route {
        /// The endpoint's name.
        name: String,
        /// Why it is not a route.
        source: InvalidRoute,
    },
    /// A policy breaks a rule.
    #[error("endpoint {name:?}: {source}")]
    Policy {
        /// The endpoint's name.
        name: String,
        /// The rule broken.
        source: PolicyError,
    },
}

/// The compiled routes of one policy version.
pub(crate) struct Table<O> {
    routes: Vec<(RoutePattern, Arc<Endpoint<O>>)>,
    default: Arc<Endpoint<O>>,
    by_name: BTreeMap<String, Arc<Endpoint<O>>>,
    /// The policies as configured (windows included), not as in force now.
    file: PolicyFile,
    /// What the table was built from, to build it again at a window edge.
    source: Source,
    version: u64,
    /// The next time-window edge of any endpoint, after which the table is built again.
    pub(crate) next_edge: Option<SystemTime>,
}

impl<O> Table<O> {
    /// What the policies in use allow but probably do not mean, as the status shows them.
    fn warnings(&self) -> Vec<String> {
        self.file
            .warnings()
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}

impl<O: Observer> Table<O> {
    /// Puts the table in use: `cell` holds it, and each breaker is held open or let go as
    /// its policy in force says (only now, so that a table checked and thrown away changes
    /// no breaker).
    fn put_in(self, cell: &ArcSwap<Table<O>>) {
        let table = Arc::new(self);
        cell.store(Arc::clone(&table));
        table.hold_breakers();
    }

    fn hold_breakers(&self) {
        for endpoint in self.by_name.values().chain([&self.default]) {
            endpoint.hold_breaker();
        }
    }
}

impl<O> Table<O> {
    /// The endpoint a request follows: the most specific matching route, else the default.
    pub(crate) fn pick(
        &self,
        method: &Method,
        host: Option<&str>,
        path: &str,
    ) -> &Arc<Endpoint<O>> {
        if self.routes.is_empty() {
            return &self.default;
        }
        best_match(self.routes.iter().map(|(p, e)| (p, e)), method, host, path)
            .unwrap_or(&self.default)
    }
}

/// What the stack is building its endpoints from: a whole routed file, or one named endpoint
/// that takes every request.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Source {
    Routes(PolicyFile),
    Single(String, Box<EndpointPolicy>),
}

impl Source {
    fn endpoints(&self) -> BTreeMap<String, EndpointPolicy> {
        match self {
            Source::Routes(file) => file.endpoints().clone(),
            Source::Single(name, policy) => BTreeMap::from([(name.clone(), (**policy).clone())]),
        }
    }
}

/// What a good swap did.
enum Swapped {
    /// The new policies are in use.
    New,
    /// They were the policies in use already.
    Same,
}

/// The live policies of one stack, shared by every service the stack's layer made. Cheap to
/// clone; [`swap`](Policies::swap) changes them for every clone.
pub struct Policies<O> {
    pub(crate) inner: Arc<LiveInner<O>>,
}

pub(crate) struct LiveInner<O> {
    pub(crate) table: ArcSwap<Table<O>>,
    builder: Builder<O>,
    single: Option<String>,
    swapping: Mutex<()>,
    pub(crate) status: StatusCell,
}

impl<O> Clone for Policies<O> {
    fn clone(&self) -> Self {
        Policies {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<O> fmt::Debug for Policies<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.inner.table.load();
        f.debug_struct("Policies")
            .field("endpoints", &table.by_name.keys().collect::<Vec<_>>())
            .field("version", &format_args!("{:016x}", table.version))
            .finish()
    }
}

impl<O: Observer> Policies<O> {
    pub(crate) fn new(builder: Builder<O>, source: Source) -> Result<Self, InvalidPolicies> {
        let single = match &source {
            Source::Single(name, _) => Some(name.clone()),
            Source::Routes(_) => None,
        };
        let now = builder.wall.now();
        let table = build_table(&builder, &source, None, now)?;
        let status = StatusCell::new(table.version, table.warnings());
        let cell = ArcSwap::from_pointee(table);
        cell.load().hold_breakers();
        Ok(Policies {
            inner: Arc::new(LiveInner {
                table: cell,
                builder,
                single,
                swapping: Mutex::new(()),
                status,
            }),
        })
    }

    /// Replaces the policies with `file`'s: every endpoint is validated and built first, and
    /// nothing changes unless all of them are good (nor when they are the policies in use).
    /// Each endpoint's budget, breaker, throttle and latency window survive when their own
    /// configuration is unchanged (see [`client::endpoint`](super) for what survives). Calls
    /// in flight finish on the policy they started with. A stack built for one endpoint
    /// ([`ClientLayer::new`](super::ClientLayer::new)) takes that endpoint's policy from the
    /// file (or the file's `default`).
    ///
    /// This is the one entry point of a new policy, whether it comes from code (a policy
    /// center), from [`reload`](Policies::reload) or from a file watcher; each outcome is
    /// recorded in [`status`](Policies::status) and the metrics (see
    /// [`client::reload`](super::reload)). A file whose policies are the ones in use changes
    /// nothing and is not counted as a swap: one save can reach a watcher as two bursts of
    /// events, and a center may send a version again. It only follows a time-window edge
    /// that no call has followed yet, as the next call would. (So a time zone's rules, read
    /// when a file is loaded, change with the file's text or at a restart, not with a reload
    /// of the same text.)
    pub fn swap(&self, file: &PolicyFile) -> Result<(), InvalidPolicies> {
        let _one_at_a_time = self
            .inner
            .swapping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let result = self.swap_locked(file);
        match &result {
            Ok(Swapped::New) => {
                let table = self.inner.table.load();
                self.inner.status.succeeded(table.version, table.warnings());
            }
            Ok(Swapped::Same) => {
                self.inner.status.unchanged();
                // A window edge no call has followed yet is followed now, as the next call
                // would: the policies in force (and the status page) are the edge's.
                self.follow_windows_locked(self.inner.builder.wall.now());
            }
            Err(error) => self.inner.status.failed(error),
        }
        result.map(|_| ())
    }

    fn swap_locked(&self, file: &PolicyFile) -> Result<Swapped, InvalidPolicies> {
        let source = match &self.inner.single {
            None => Source::Routes(file.clone()),
            Some(name) => {
                let policy = file
                    .endpoint(name)
                    .or_else(|| file.endpoint(DEFAULT_ROUTE))
                    .cloned()
                    .ok_or_else(|| InvalidPolicies::Policy {
                        name: name.clone(),
                        source: PolicyError::Invalid {
                            field: format!("endpoints.{name:?}"),
                            rule: "the file has no policy for this endpoint (nor a default)"
                                .to_owned(),
                            at: None,
                        },
                    })?;
                Source::Single(name.clone(), Box::new(policy))
            }
        };
        let old = self.inner.table.load_full();
        if old.source == source {
            return Ok(Swapped::Same);
        }
        let now = self.inner.builder.wall.now();
        build_table(&self.inner.builder, &source, Some(&old), now)?.put_in(&self.inner.table);
        Ok(Swapped::New)
    }

    /// Builds the table again from the same policies when a time-window edge has passed by
    /// `now`: the policies in force change, the configured ones (and the version) do not.
    /// The first call after an edge does this; calls that see the edge while it is being
    /// done wait for it (once per edge).
    pub(crate) fn follow_windows(&self, now: SystemTime) {
        let _one_at_a_time = self
            .inner
            .swapping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.follow_windows_locked(now);
    }

    /// [`follow_windows`](Policies::follow_windows) with the swap lock held.
    fn follow_windows_locked(&self, now: SystemTime) {
        let old = self.inner.table.load_full();
        if old.next_edge.is_none_or(|edge| edge > now) {
            return; // another call followed this edge already
        }
        match build_table(&self.inner.builder, &old.source, Some(&old), now) {
            Ok(table) => {
                #[cfg(feature = "tracing")]
                tracing::info!(
                    next_edge = ?table.next_edge,
                    "stormguard policies: a time window started or ended"
                );
                table.put_in(&self.inner.table);
            }
            // The policies were valid when swapped in and a window's policy is checked with
            // them, so this cannot fail; if it did, keep calling by the policies in use and
            // stop following windows rather than fail calls.
            Err(error) => {
                self.inner.status.failed(&error);
                let mut kept = Table::clone_of(&old);
                kept.next_edge = None;
                self.inner.table.store(Arc::new(kept));
            }
        }
    }

    /// The policies in use, as a file.
    pub fn current(&self) -> PolicyFile {
        self.inner.table.load().file.clone()
    }

    /// A content hash of the policies in use (the same policies always hash the same). It
    /// has 48 bits, so that the `stormguard_policy_version` gauge (an `f64`) holds it exactly.
    pub fn version(&self) -> u64 {
        self.inner.table.load().version
    }

    /// How the last swaps and reloads went: what the service shows on a status page.
    pub fn status(&self) -> ReloadStatus {
        self.inner.status.get()
    }

    /// Each endpoint in use, by name, with the state of its breaker: what an admin page shows
    /// beside [`status`](Policies::status).
    pub fn endpoint_status(&self) -> Vec<EndpointStatus> {
        let table = self.inner.table.load();
        table
            .by_name
            .iter()
            .map(|(name, endpoint)| EndpointStatus {
                name: name.clone(),
                breaker: endpoint.breaker.as_ref().map(|b| b.state()),
            })
            .collect()
    }
}

/// One endpoint of the policies in use, as [`Policies::endpoint_status`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointStatus {
    /// The endpoint's name in the policy file (its route, or [`DEFAULT_ROUTE`]).
    pub name: String,
    /// Its breaker's state, when it has a breaker.
    pub breaker: Option<BreakerState>,
}

impl<O> Table<O> {
    fn clone_of(table: &Table<O>) -> Table<O> {
        Table {
            routes: table.routes.clone(),
            default: Arc::clone(&table.default),
            by_name: table.by_name.clone(),
            file: table.file.clone(),
            source: table.source.clone(),
            version: table.version,
            next_edge: table.next_edge,
        }
    }
}

/// Builds every endpoint of `source` by the policy in force at `now` (a time window's, or
/// its own), reusing the state of `previous` where its configuration is unchanged.
fn build_table<O: Observer>(
    builder: &Builder<O>,
    source: &Source,
    previous: Option<&Table<O>>,
    now: SystemTime,
) -> Result<Table<O>, InvalidPolicies> {
    let endpoints = source.endpoints();
    let mut by_name = BTreeMap::new();
    let mut configured = BTreeMap::new();
    let mut routes = Vec::new();
    let mut default = None;
    let mut next_edge: Option<SystemTime> = None;
    for (index, (name, policy)) in endpoints.into_iter().enumerate() {
        let old = previous.and_then(|t| t.by_name.get(&name)).map(Arc::as_ref);
        let in_force = policy.in_force_at(now);
        if let Some(until) = in_force.until {
            next_edge = Some(next_edge.map_or(until, |edge| edge.min(until)));
        }
        let in_force = in_force.policy.clone();
        // The builder checks the policy in force; one with windows is checked as configured
        // too (a window's rules are about the policy it belongs to).
        if !policy.windows().is_empty() {
            policy
                .clone()
                .validate()
                .map_err(|source| InvalidPolicies::Policy {
                    name: name.clone(),
                    source,
                })?;
        }
        configured.insert(name.clone(), policy);
        let endpoint = builder
            .build(&name, in_force, old, index as u64)
            .map_err(|source| InvalidPolicies::Policy {
                name: name.clone(),
                source,
            })?;
        let endpoint = Arc::new(endpoint);
        match source {
            Source::Single(..) => default = Some(Arc::clone(&endpoint)),
            Source::Routes(_) if name == DEFAULT_ROUTE => default = Some(Arc::clone(&endpoint)),
            Source::Routes(_) => {
                let pattern = name.parse().map_err(|source| InvalidPolicies::Route {
                    name: name.clone(),
                    source,
                })?;
                routes.push((pattern, Arc::clone(&endpoint)));
            }
        }
        by_name.insert(name, endpoint);
    }
    let default = match default {
        Some(default) => default,
        // Unmatched requests pass with one attempt and nothing else.
        None => {
            let old = previous
                .and_then(|t| t.by_name.get(DEFAULT_ROUTE))
                .map(Arc::as_ref);
            let policy = EndpointPolicy::new(RetryPolicy::new(1));
            configured.insert(DEFAULT_ROUTE.to_owned(), policy.clone());
            Arc::new(
                builder
                    .build(DEFAULT_ROUTE, policy, old, u64::MAX)
                    .map_err(|source| InvalidPolicies::Policy {
                        name: DEFAULT_ROUTE.to_owned(),
                        source,
                    })?,
            )
        }
    };
    let file = PolicyFile::new(configured);
    let version = fnv1a(file.to_toml().as_bytes()) >> 16;
    Ok(Table {
        routes,
        default,
        by_name,
        file,
        source: source.clone(),
        version,
        next_edge,
    })
}

/// FNV-1a, 64 bits: a stable content hash (the same text hashes the same in every process and
/// build, unlike the standard library's hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(all(test, feature = "watch"))]
impl<O> Policies<O> {
    /// The breaker of endpoint `name` in use, to check that a swap carried it over.
    pub(crate) fn breaker_of(&self, name: &str) -> Option<Arc<super::endpoint::Breaker<O>>> {
        self.inner
            .table
            .load()
            .by_name
            .get(name)
            .and_then(|e| e.breaker.clone())
    }
}
