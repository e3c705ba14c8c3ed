//! The tower [`Layer`]: configuration only; the work is in [`IdempotencyService`].
//!
//! # Why a lease and a fencing token, and not just "insert the key first"?
//!
//! Inserting the key before running the handler stops concurrent duplicates, but a process
//! that dies mid-request leaves the key claimed forever: every retry would get `409` until the
//! retention ran out, which turns a crash into a permanent failure for that operation. So the
//! claim is a *lease* that expires; a retry after it expires takes the key over. That alone
//! would let the crashed-but-actually-slow holder finish later and overwrite the new holder's
//! result, so every claim carries a fresh *fencing token* and completion is a
//! compare-and-set on it: the stale holder's write is refused.
//!
//! The lease must outlast the slowest handler (60 s by default): a handler still running when
//! its lease expires can be taken over, and then its side effects may happen twice. Make the
//! business operation itself exactly-once with [`exactly_once`](crate::exactly_once) where
//! that matters.
//!
//! # Why the lease follows the request's deadline
//!
//! A client whose request timed out retries; with a fixed 60 s lease that retry is answered
//! `409` for up to a minute, although nobody is waiting for the first attempt any more and
//! (with stormguard-tower's `DeadlineLayer` outside this layer) its handler has already been
//! cancelled. So when the request's deadline is known, the lease is the time left until it
//! plus a margin ([`IdempotencyLayer::with_lease_margin`]), capped by the configured lease: a
//! retry after the caller's deadline (and the margin) takes over. The deadline comes from the
//! task's current deadline ([`stormguard::deadline::current`], set by `DeadlineLayer`), or
//! else from the request's deadline headers (`grpc-timeout`, `connect-timeout-ms`,
//! `x-envoy-expected-rq-timeout-ms`, `x-request-deadline`, read by stormguard-tower's
//! [`stormguard_tower::wire::read_deadline`]). A deadline read from the headers alone is also *enforced* here, since
//! nothing else would stop the handler at it: the handler runs under it (as its current
//! deadline) and is cancelled when it passes (`504`), so it never outlives its lease. A
//! request whose header deadline has already passed is refused with `504` before the key is
//! even looked up. See [`LeaseDeadline`].

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{Method, StatusCode};
use tower_layer::Layer;

use stormguard::deadline::DeadlineHeaders;

use crate::fingerprint::{DefaultFingerprinter, Fingerprinter};
use crate::store::Store;
use stormguard::deadline::WallClock;

mod finish;
mod headers;
mod service;

pub use headers::ReplayedHeaders;
pub use service::{IdempotencyService, ResponseFuture};

type TenantFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Adds `Idempotency-Key` handling to a service. See the [crate docs](crate) for the behaviour.
///
/// # Default
///
/// | setting | default |
/// | --- | --- |
/// | methods covered | `POST`, `PATCH` |
/// | key required | yes (`400` without one) |
/// | tenant | none: one scope for everybody |
/// | fingerprint | [`DefaultFingerprinter`] |
/// | lease | 60 s, or less when the request has a deadline ([`LeaseDeadline`]) |
/// | lease margin after a deadline | 1 s |
/// | deadline source | [`LeaseDeadline::CurrentOrHeaders`] with [`DeadlineHeaders::ALL`] |
/// | retention | 24 h |
/// | stored outcomes | [`StorePolicy::success_only`] (2xx and 3xx) |
/// | in-flight duplicate | [`InFlight::Reject`] (`409`) |
/// | response cap | 1 MiB, [`Oversize::Mark`] |
/// | request body cap | 1 MiB (`413` above) |
/// | replayed headers | [`ReplayedHeaders::end_to_end`]: all but hop-by-hop, `content-length` and `set-cookie` |
/// | store failure | [`FailureMode::Closed`] (`503`) |
/// | store call timeout | 5 s |
/// | clock | [`WallClock::system`] |
#[derive(Clone)]
pub struct IdempotencyLayer {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: Config,
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) methods: Vec<Method>,
    pub(crate) key_required: bool,
    pub(crate) tenant: Option<Arc<TenantFn>>,
    pub(crate) fingerprinter: Arc<dyn Fingerprinter>,
    pub(crate) lease: Duration,
    pub(crate) lease_margin: Duration,
    pub(crate) lease_deadline: LeaseDeadline,
    pub(crate) retention: Duration,
    pub(crate) policy: StorePolicy,
    pub(crate) in_flight: InFlight,
    pub(crate) max_response: usize,
    pub(crate) oversize: Oversize,
    pub(crate) max_request: usize,
    pub(crate) replay_headers: ReplayedHeaders,
    pub(crate) failure: FailureMode,
    pub(crate) clock: WallClock,
    pub(crate) store_timeout: Duration,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.config;
        f.debug_struct("IdempotencyLayer")
            .field("methods", &c.methods)
            .field("key_required", &c.key_required)
            .field("lease", &c.lease)
            .field("lease_margin", &c.lease_margin)
            .field("lease_deadline", &c.lease_deadline)
            .field("retention", &c.retention)
            .field("policy", &c.policy)
            .field("in_flight", &c.in_flight)
            .field("max_response", &c.max_response)
            .field("oversize", &c.oversize)
            .field("failure", &c.failure)
            .finish_non_exhaustive()
    }
}

/// Which handler outcomes are stored and replayed.
///
/// Statuses 401, 403 and 429, and responses carrying the [`DoNotStore`] extension, are never
/// stored whatever the policy says: they are refusals before the work was done, and a retry
/// must be able to succeed. An outcome that is not stored releases the key.
///
/// # Default
///
/// [`StorePolicy::success_only`]: 2xx and 3xx.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorePolicy {
    client_errors: bool,
    server_errors: bool,
}

impl StorePolicy {
    /// Stores 2xx and 3xx only.
    pub const fn success_only() -> Self {
        StorePolicy {
            client_errors: false,
            server_errors: false,
        }
    }

    /// Also stores 4xx (except 401, 403, 429): a deterministic client error is replayed
    /// instead of running the handler again.
    pub const fn with_client_errors(mut self, store: bool) -> Self {
        self.client_errors = store;
        self
    }

    /// Also stores 5xx. Off by default: a server error is usually transient, and the point
    /// of a retry is to run again.
    pub const fn with_server_errors(mut self, store: bool) -> Self {
        self.server_errors = store;
        self
    }

    /// Whether a handler response with `status` is stored under this policy.
    pub fn stores(&self, status: StatusCode) -> bool {
        if matches!(status.as_u16(), 401 | 403 | 429) {
            return false;
        }
        match status.as_u16() {
            200..=399 => true,
            400..=499 => self.client_errors,
            500..=599 => self.server_errors,
            _ => false,
        }
    }
}

impl Default for StorePolicy {
    fn default() -> Self {
        StorePolicy::success_only()
    }
}

/// A response extension that keeps the response from being stored (and releases the key):
/// for refusals made inside the layer's scope, such as validation or a rate limiter placed
/// after it.
///
/// ```
/// use axum::response::IntoResponse;
/// use stormguard_idempotency::DoNotStore;
///
/// let refused = (http::StatusCode::BAD_REQUEST, axum::Extension(DoNotStore), "amount missing")
///     .into_response();
/// assert!(refused.extensions().get::<DoNotStore>().is_some());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct DoNotStore;

/// What a duplicate gets while the first request is still running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InFlight {
    /// `409 Conflict` with problem+json at once.
    Reject,
    /// Wait up to `max` for the first request to finish and replay its response (or take the
    /// key over if its lease expires meanwhile); `409` if it is still running after `max`.
    /// The store is polled every `poll`, doubling up to 16 × `poll`.
    Wait {
        /// The longest wait.
        max: Duration,
        /// The first polling interval.
        poll: Duration,
    },
}

impl InFlight {
    /// [`InFlight::Wait`] with a 10 ms first poll.
    pub const fn wait(max: Duration) -> Self {
        InFlight::Wait {
            max,
            poll: Duration::from_millis(10),
        }
    }
}

/// Where the layer learns a request's deadline, which shortens its lease (see the
/// [module docs](self#why-the-lease-follows-the-requests-deadline)).
///
/// # Default
///
/// [`LeaseDeadline::CurrentOrHeaders`] with [`DeadlineHeaders::ALL`] (all four deadline
/// headers, the earliest wins).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseDeadline {
    /// Deadlines do not matter: every lease is the configured one.
    Ignore,
    /// The task's current deadline ([`stormguard::deadline::current`]), set by
    /// `DeadlineLayer` outside this layer; headers are not read.
    Current,
    /// The task's current deadline, else the earliest of these deadline headers on the
    /// request (then enforced by this layer).
    CurrentOrHeaders(DeadlineHeaders),
}

impl Default for LeaseDeadline {
    fn default() -> Self {
        LeaseDeadline::CurrentOrHeaders(DeadlineHeaders::ALL)
    }
}

/// What happens to a key whose response is larger than the cap. The response itself always
/// reaches the client whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Oversize {
    /// Complete the key without a body: duplicates get `409` problem+json of type
    /// [`RESPONSE_NOT_STORED`](crate::problem::RESPONSE_NOT_STORED) naming the original
    /// status, and the handler does not run again. The default: side effects are not
    /// repeated.
    Mark,
    /// Delete the key: the next request with it runs the handler again.
    Release,
}

/// What the layer does when the store fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureMode {
    /// `503` problem+json; the handler does not run. The default.
    Closed,
    /// Run the handler without protection (and store nothing), logging a warning for each
    /// such request.
    Open,
}

impl IdempotencyLayer {
    /// A layer over `store` with the [defaults](Self#default).
    pub fn new(store: impl Store) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// A layer over a shared store.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        IdempotencyLayer {
            store,
            config: Config {
                methods: vec![Method::POST, Method::PATCH],
                key_required: true,
                tenant: None,
                fingerprinter: Arc::new(DefaultFingerprinter::new()),
                lease: Duration::from_secs(60),
                lease_margin: Duration::from_secs(1),
                lease_deadline: LeaseDeadline::default(),
                retention: Duration::from_secs(24 * 3600),
                policy: StorePolicy::success_only(),
                in_flight: InFlight::Reject,
                max_response: 1 << 20,
                oversize: Oversize::Mark,
                max_request: 1 << 20,
                replay_headers: ReplayedHeaders::end_to_end(),
                failure: FailureMode::Closed,
                clock: WallClock::system(),
                store_timeout: Duration::from_secs(5),
            },
        }
    }

    /// The methods the layer covers; other methods pass straight through.
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Whether a covered request without a key is refused (`400`, the default) or passes
    /// through unprotected.
    pub fn with_key_required(mut self, required: bool) -> Self {
        self.config.key_required = required;
        self
    }

    /// Scopes keys by the tenant or principal this closure extracts (typically from a request
    /// extension set by authentication). `None` → `401` problem+json.
    pub fn with_tenant<F>(mut self, tenant: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.config.tenant = Some(Arc::new(tenant));
        self
    }

    /// Replaces the request fingerprint.
    pub fn with_fingerprinter(mut self, fingerprinter: impl Fingerprinter) -> Self {
        self.config.fingerprinter = Arc::new(fingerprinter);
        self
    }

    /// How long a holder keeps a key before a retry may take it over. Must outlast the
    /// slowest handler. A request with a deadline gets less ([`LeaseDeadline`]).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How long after a request's deadline its lease still holds: room for clock skew between
    /// instances and for the cancelled handler to stop. The lease is
    /// `min(lease, time left + margin)`.
    pub fn with_lease_margin(mut self, margin: Duration) -> Self {
        self.config.lease_margin = margin;
        self
    }

    /// Where the request's deadline is read from, to shorten its lease.
    pub fn with_lease_deadline(mut self, source: LeaseDeadline) -> Self {
        self.config.lease_deadline = source;
        self
    }

    /// How long a completed key is kept (and replayed). Raised to the lease if shorter.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// Which handler outcomes are stored.
    pub fn with_store_policy(mut self, policy: StorePolicy) -> Self {
        self.config.policy = policy;
        self
    }

    /// What an in-flight duplicate gets.
    pub fn with_in_flight(mut self, in_flight: InFlight) -> Self {
        self.config.in_flight = in_flight;
        self
    }

    /// The largest response body stored, and what happens to the key above it.
    pub fn with_max_response(mut self, bytes: usize, oversize: Oversize) -> Self {
        self.config.max_response = bytes;
        self.config.oversize = oversize;
        self
    }

    /// The largest request body buffered for the fingerprint (`413` above).
    pub fn with_max_request(mut self, bytes: usize) -> Self {
        self.config.max_request = bytes;
        self
    }

    /// The response headers stored and replayed.
    pub fn with_replayed_headers(mut self, headers: ReplayedHeaders) -> Self {
        self.config.replay_headers = headers;
        self
    }

    /// What to do when the store fails.
    pub fn with_failure_mode(mut self, mode: FailureMode) -> Self {
        self.config.failure = mode;
        self
    }

    /// The wall clock for leases and retention.
    pub fn with_clock(mut self, clock: WallClock) -> Self {
        self.config.clock = clock;
        self
    }

    /// The longest wait for one store call before it counts as a failure.
    pub fn with_store_timeout(mut self, timeout: Duration) -> Self {
        self.config.store_timeout = timeout;
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.clone())
    }
}
