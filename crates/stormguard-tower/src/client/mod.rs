//! The one client stack: one endpoint policy drives the deadline, the throttle, retries or
//! hedging with a budget, the breaker, the deadline on the wire and what is observed.
//!
//! # Why one stack and not a pile of layers
//!
//! Each protection is easy to get right alone and easy to get wrong in combination: a retry
//! layer above a breaker layer retries into the open breaker (and charges each refusal to
//! the budget); a breaker above a retry layer never opens (it sees one marked answer per four
//! failed attempts and reads the mark as "not a failure"); a per-try timeout that is not
//! handed downstream leaves the downstream working for a caller that gave up. [`ClientLayer`]
//! puts them in the one order in which they work, driven by one
//! [`EndpointPolicy`] per endpoint, outermost first:
//!
//! 1. **the call's deadline** — the earlier of the caller's (the task's current deadline,
//!    a [`Deadline`](stormguard::deadline::Deadline) in the request's extensions, a deadline
//!    header already on the request) and the policy's overall timeout;
//! 2. **the adaptive throttle** (optional): refuse locally before sending, once per call;
//! 3. **retry or hedge**, paying every retry and hedge from the endpoint's shared budget, and
//!    stopping at once on a refusal from below;
//! 4. **the circuit breaker, per attempt**: an open breaker is a refusal, never an in-doubt
//!    failure, and it is not charged to the budget;
//! 5. **the attempt's deadline** = min(per-try timeout, time left) − the hop reserve, written
//!    on the wire in the policy's headers (a call with less than the minimum useful time left
//!    is not sent), and made the current deadline of the inner service's task;
//! 6. **the transport** (a hyper client, a tonic channel, any `http` service). The stack opens
//!    no connection itself: the policy's connect timeout travels to the transport in each
//!    attempt's request extensions ([`ConnectTimeout`]), for a transport that dials per
//!    request to honour (the `stormguard proxy` sidecar does); a hyper, tonic or reqwest
//!    client's connector is configured by its owner and bounds its connects by its own setting.
//!
//! Refusals — breaker open, throttled, budget empty, deadline too close — are typed
//! ([`Error::Refused`], [`StopReason`]), stop the retry loop,
//! and the failure the stack gives up on is marked `X-Retry-Exhausted: true` so that nobody
//! upstream retries it again. When the stack gives up, a [`Fallback`] can answer instead (a
//! cache, an alternate upstream), with the reason recorded. Every attempt, retry, refusal,
//! breaker transition, hedge and fallback is reported to one [`Observer`].
//!
//! The policies are live ([`ClientLayer::policies`]): a swap takes effect for the next call,
//! keeps each endpoint's budget, breaker and throttle when their configuration is unchanged,
//! and never mixes two policies within one call. An endpoint's time windows
//! ([`stormguard::policy::Schedule`]) switch its policy at each window edge by themselves,
//! with no reload: the first call after an edge (read on the stack's wall clock,
//! [`ClientLayerBuilder::with_wall_clock`]) swaps in the policy in force, by the same rules of
//! what survives as a swap.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use stormguard::policy::PolicyFile;
//! use stormguard_tower::body::ReplayBody;
//! use stormguard_tower::client::ClientLayer;
//! use tower::{Layer, ServiceExt, service_fn};
//!
//! let policies = PolicyFile::from_toml(r#"
//!     [endpoints."GET /users/*"]
//!     idempotency = "idempotent"
//!     timeouts = { per_try = "200ms", overall = "1s" }
//!     retry = { max_attempts = 3 }
//!     budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
//!     breaker = { count = 20, minimum_throughput = 10 }
//! "#)?;
//! // A downstream that fails once, then answers; it reports the deadline it was given.
//! let calls = Arc::new(AtomicU32::new(0));
//! let downstream = service_fn(move |req: Request<ReplayBody<Full<Bytes>>>| {
//!     let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
//!     let status = if first { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
//!     let timeout = req.headers()["grpc-timeout"].clone();
//!     async move { Response::builder().status(status).header("seen-timeout", timeout).body(Full::new(Bytes::new())) }
//! });
//! let client = ClientLayer::from_policy_file(&policies)?.layer(downstream);
//! let response = client.oneshot(Request::get("http://users/users/7").body(Full::new(Bytes::new()))?).await?;
//! assert_eq!(response.status(), StatusCode::OK);
//! assert_eq!(response.headers()["seen-timeout"], "200000u"); // the per-try timeout, on the wire
//! # Ok(()) }
//! ```

pub(crate) mod call;
#[cfg(feature = "center")]
pub mod center;
mod classify;
pub(crate) mod endpoint;
mod error;
mod fallback;
mod live;
mod observer;
pub mod reload;
mod route;
#[cfg(feature = "watch")]
mod watch;

#[cfg(feature = "center")]
pub use center::{CenterState, CenterWatch, CenterWatchConfig, CenterWatchError};
pub use classify::ErrorClassifier;
pub use error::Error;
pub use fallback::{FALLBACK_HEADER, Fallback, FallbackFuture, FallbackRequest};
pub use live::{EndpointStatus, InvalidPolicies, Policies};
pub use reload::{ReloadError, ReloadStatus};
pub use route::{DEFAULT_ROUTE, InvalidRoute, RoutePattern};
#[cfg(feature = "watch")]
pub use watch::{DEFAULT_DEBOUNCE, PolicyWatcher, WatchError};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use stormguard::budget::RetryBudget;
use stormguard::classify::GrpcCodeSet;
use stormguard::clock::Clock;
use stormguard::deadline::WallClock;
use stormguard::policy::{EndpointPolicy, PolicyFile};
use stormguard::retry::StopReason;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::ReplayBody;
use crate::observe::{Observer, Telemetry};
use crate::wire::{self, BoxError};

use endpoint::Builder;
use live::Source;

/// The endpoint policy's connect timeout (`timeouts.connect`), put by the stack into the
/// extensions of every attempt's request whose policy sets one: how the transport below the
/// stack learns it, from the same policy snapshot as the rest of the call (a policy swapped
/// mid-call applies from the next call on). The stack opens no connection, so it enforces
/// nothing itself: a transport that opens connections per request reads it and bounds its
/// connect by it (the `stormguard proxy` sidecar does); one that finds none uses its own
/// default.
///
/// ```
/// use std::time::Duration;
/// use stormguard_tower::client::ConnectTimeout;
///
/// let request = http::Request::get("http://users/7").body(())?;
/// let bound = request.extensions().get::<ConnectTimeout>().map(|c| c.0);
/// assert_eq!(bound.unwrap_or(Duration::from_secs(5)), Duration::from_secs(5));
/// # Ok::<(), http::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectTimeout(pub Duration);

/// The default replay limit of request bodies: 64 KiB.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// The default read limit of gRPC response bodies: 64 KiB.
pub const DEFAULT_GRPC_RESPONSE_LIMIT: usize = 64 * 1024;

/// Options that are not per endpoint.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) body_limit: usize,
    pub(crate) grpc_response_limit: usize,
    pub(crate) grpc_codes: GrpcCodeSet,
    pub(crate) error_classifier: ErrorClassifier,
    pub(crate) wall: WallClock,
    /// Whether the stack writes each attempt's deadline on the wire (the retry-only layer
    /// leaves that to a `PropagateDeadlineLayer` below it).
    pub(crate) propagate: bool,
}

/// What every service of one stack shares.
pub(crate) struct Shared<O> {
    pub(crate) policies: Policies<O>,
    pub(crate) options: Options,
    pub(crate) observer: Arc<O>,
    pub(crate) fallback: Option<Arc<dyn Fallback>>,
}

impl<O> Shared<O> {
    /// The endpoint a request follows, from the policies in use now (one atomic load; and,
    /// only when some endpoint has time windows, one read of the wall clock to see whether
    /// the next window edge has passed).
    pub(crate) fn endpoint<B>(&self, request: &Request<B>) -> Arc<endpoint::Endpoint<O>>
    where
        O: Observer,
    {
        let mut table = self.policies.inner.table.load();
        if let Some(edge) = table.next_edge {
            let now = self.options.wall.now();
            if now >= edge {
                drop(table);
                self.policies.follow_windows(now);
                table = self.policies.inner.table.load();
            }
        }
        Arc::clone(table.pick(
            request.method(),
            route::request_host(request),
            request.uri().path(),
        ))
    }
}

/// The one client stack as a tower layer, for hyper, tonic or any `http` client service; see
/// the [module docs](self).
///
/// # Default
///
/// - the [`Telemetry`] observer (spans, metrics and log lines by the crate's features);
/// - no fallback;
/// - request bodies replayed up to [`DEFAULT_BODY_LIMIT`] (a larger body is sent once and its
///   request not retried); gRPC responses read up to [`DEFAULT_GRPC_RESPONSE_LIMIT`] to find
///   their status; A6's retryable codes `{UNAVAILABLE}`;
/// - transport errors classified by [`wire::classify_transport_error`];
/// - budgets, breakers and throttles on tokio's clock ([`Clock::tokio`], so paused-time tests
///   see what their timers see); `x-request-deadline` on the system wall clock;
/// - jitter seeded from the operating system.
pub struct ClientLayer<O = Telemetry> {
    pub(crate) shared: Arc<Shared<O>>,
}

impl<O> Clone for ClientLayer<O> {
    fn clone(&self) -> Self {
        ClientLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<O> std::fmt::Debug for ClientLayer<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientLayer")
            .field("policies", &self.shared.policies)
            .field("options", &self.shared.options)
            .field("fallback", &self.shared.fallback.is_some())
            .finish_non_exhaustive()
    }
}

impl ClientLayer {
    /// A stack that calls every request by `policy`, as the endpoint named
    /// [`DEFAULT_ROUTE`]. The policy is validated here: an invalid one never reaches a stack.
    pub fn new(policy: EndpointPolicy) -> Result<Self, InvalidPolicies> {
        ClientLayer::named(DEFAULT_ROUTE, policy)
    }

    /// A stack that calls every request by `policy`, as the endpoint `name` (which labels
    /// its metrics and logs, and is the entry a swapped-in policy file is read from).
    pub fn named(name: &str, policy: EndpointPolicy) -> Result<Self, InvalidPolicies> {
        ClientLayerBuilder::new(Source::Single(name.to_owned(), Box::new(policy))).build()
    }

    /// A stack that routes each request to the most specific endpoint of `file` by method,
    /// host and path (see [`RoutePattern`]); [`DEFAULT_ROUTE`] takes the rest (without it,
    /// unmatched requests get one attempt and nothing else).
    pub fn from_policy_file(file: &PolicyFile) -> Result<Self, InvalidPolicies> {
        ClientLayerBuilder::new(Source::Routes(file.clone())).build()
    }
}

impl<O: Observer> ClientLayer<O> {
    /// The live policies: swap them while the stack runs.
    pub fn policies(&self) -> &Policies<O> {
        &self.shared.policies
    }
}

/// Builds a [`ClientLayer`] with options other than the defaults: the options a layer cannot
/// change once services exist.
///
/// ```
/// use std::time::Duration;
/// use stormguard::policy::EndpointPolicy;
/// use stormguard::retry::RetryPolicy;
/// use stormguard_tower::client::ClientLayerBuilder;
///
/// let layer = ClientLayerBuilder::single("orders", EndpointPolicy::new(RetryPolicy::new(3)))
///     .with_body_limit(16 * 1024)
///     .with_seed(7)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), stormguard_tower::client::InvalidPolicies>(())
/// ```
pub struct ClientLayerBuilder<O = Telemetry> {
    source: Source,
    options: Options,
    observer: Arc<O>,
    fallback: Option<Arc<dyn Fallback>>,
    clock: Clock,
    seed: Option<u64>,
    budget: Option<Arc<dyn RetryBudget>>,
}

impl ClientLayerBuilder {
    fn new(source: Source) -> Self {
        ClientLayerBuilder {
            source,
            options: Options {
                body_limit: DEFAULT_BODY_LIMIT,
                grpc_response_limit: DEFAULT_GRPC_RESPONSE_LIMIT,
                grpc_codes: GrpcCodeSet::A6_DEFAULT,
                error_classifier: wire::classify_transport_error,
                wall: WallClock::system(),
                propagate: true,
            },
            observer: Arc::new(Telemetry),
            fallback: None,
            clock: Clock::tokio(),
            seed: None,
            budget: None,
        }
    }

    /// A stack for one endpoint `name` that takes every request.
    pub fn single(name: &str, policy: EndpointPolicy) -> Self {
        ClientLayerBuilder::new(Source::Single(name.to_owned(), Box::new(policy)))
    }

    /// A stack routed by `file`'s endpoints (see [`ClientLayer::from_policy_file`]).
    pub fn routes(file: &PolicyFile) -> Self {
        ClientLayerBuilder::new(Source::Routes(file.clone()))
    }
}

impl<O: Observer> ClientLayerBuilder<O> {
    /// Reports to `observer` instead (combine with [`Telemetry`] as a pair to keep both).
    pub fn with_observer<O2: Observer>(self, observer: O2) -> ClientLayerBuilder<O2> {
        ClientLayerBuilder {
            source: self.source,
            options: self.options,
            observer: Arc::new(observer),
            fallback: self.fallback,
            clock: self.clock,
            seed: self.seed,
            budget: self.budget,
        }
    }

    /// Answers from `fallback` when the stack gives up, as each endpoint's policy allows.
    pub fn with_fallback(mut self, fallback: impl Fallback) -> Self {
        self.fallback = Some(Arc::new(fallback));
        self
    }

    /// Replays request bodies of up to `bytes`; a longer body is sent once and its request
    /// is not retried or hedged.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.options.body_limit = bytes;
        self
    }

    /// Reads gRPC response bodies of up to `bytes` to find the status in their trailers; a
    /// longer response is handed on as it streams and counts as committed (not retried).
    pub fn with_grpc_response_limit(mut self, bytes: usize) -> Self {
        self.options.grpc_response_limit = bytes;
        self
    }

    /// The gRPC status codes to retry (A6 `retryableStatusCodes`).
    pub fn with_grpc_codes(mut self, codes: GrpcCodeSet) -> Self {
        self.options.grpc_codes = codes;
        self
    }

    /// Classifies transport errors of the inner service with `classifier`.
    pub fn with_error_classifier(mut self, classifier: ErrorClassifier) -> Self {
        self.options.error_classifier = classifier;
        self
    }

    /// Reads this host's wall-clock time from `wall` (for `x-request-deadline`).
    pub fn with_wall_clock(mut self, wall: WallClock) -> Self {
        self.options.wall = wall;
        self
    }

    /// Runs budgets, breakers and throttles on `clock`.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Seeds the jitter and the breakers' and throttles' draws, so that the same requests
    /// wait the same delays (tests, simulations). Leave it unset in production: processes
    /// must jitter differently.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Shares `budget` among the endpoints whose policy names no budget of its own: build one
    /// budget per downstream and share it (an `Arc`) across every stack that calls it.
    pub fn with_budget(mut self, budget: Arc<dyn RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Leaves the deadline headers to a [`PropagateDeadlineLayer`](crate::deadline::PropagateDeadlineLayer)
    /// below the stack (each attempt still runs under its deadline, which that layer reads).
    pub fn without_propagation(mut self) -> Self {
        self.options.propagate = false;
        self
    }

    /// The layer, with every endpoint's policy validated and built.
    pub fn build(self) -> Result<ClientLayer<O>, InvalidPolicies> {
        let builder = Builder {
            clock: self.clock,
            wall: self.options.wall.clone(),
            observer: Arc::clone(&self.observer),
            seed: self.seed,
            fallback_budget: self.budget,
        };
        let policies = Policies::new(builder, self.source)?;
        Ok(ClientLayer {
            shared: Arc::new(Shared {
                policies,
                options: self.options,
                observer: self.observer,
                fallback: self.fallback,
            }),
        })
    }
}

impl<S, O> Layer<S> for ClientLayer<O> {
    type Service = Client<S, O>;

    fn layer(&self, inner: S) -> Client<S, O> {
        Client {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// A client service wrapped in the stack; made by [`ClientLayer`].
///
/// The inner service gets each attempt as an `http::Request<`[`ReplayBody`]`<B>>`; the caller
/// gets an `http::Response<`[`ReplayBody`]`<ResB>>` or an [`Error`].
pub struct Client<S, O = Telemetry> {
    inner: S,
    shared: Arc<Shared<O>>,
}

impl<S: Clone, O> Clone for Client<S, O> {
    fn clone(&self) -> Self {
        Client {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, O> std::fmt::Debug for Client<S, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl<S, O> Client<S, O> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// The future of a [`Client`] call.
pub struct ResponseFuture<B> {
    inner: Pin<Box<dyn Future<Output = call::CallResult<B>> + Send>>,
}

impl<B> Future for ResponseFuture<B> {
    type Output = Result<Response<ReplayBody<B>>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B> std::fmt::Debug for ResponseFuture<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, O, ReqB, ResB> Service<Request<ReqB>> for Client<S, O>
where
    S: Service<Request<ReplayBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqB: Body + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
    O: Observer,
{
    type Response = Response<ReplayBody<ResB>>;
    type Error = Error;
    type Future = ResponseFuture<ResB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::NotReady(e.into()))
    }

    fn call(&mut self, request: Request<ReqB>) -> ResponseFuture<ResB> {
        let endpoint = self.shared.endpoint(&request);
        // The first attempt goes to the service that was made ready; retries to clones.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            inner: Box::pin(call::run(
                Arc::clone(&self.shared),
                endpoint,
                ready,
                request,
            )),
        }
    }
}

/// Whether a call that stopped for `stop` after `attempts` attempts marks its failure
/// `X-Retry-Exhausted: true`, so that no layer upstream retries it:
///
/// - it **sent more than one attempt**: it retried, and retrying did not help; or
/// - a **budget, breaker, throttle or the deadline refused** a call or a retry: the
///   downstream is failing too often, or there is no time left, and a layer further up must
///   not try instead.
///
/// It does not mark a success; a first-attempt failure that is deterministic (`never_retry`:
/// nobody retries it anyway, and a mark received from downstream is passed on as it came);
/// a first-attempt failure of a request that is not retry-safe (`not_idempotent`: a layer
/// upstream that holds an idempotency key may still retry safely); or a failure under a
/// policy of one attempt (`max_attempts = 1` is how a hop says "let my caller retry").
///
/// ```
/// use stormguard::retry::StopReason;
/// use stormguard_tower::client::marks_exhausted;
///
/// assert!(marks_exhausted(StopReason::AttemptsExhausted, 3));
/// assert!(!marks_exhausted(StopReason::AttemptsExhausted, 1));
/// assert!(marks_exhausted(StopReason::BreakerOpen, 0));
/// ```
pub fn marks_exhausted(stop: StopReason, attempts: u32) -> bool {
    match stop {
        StopReason::Succeeded | StopReason::Cancelled => false,
        StopReason::BudgetExhausted
        | StopReason::DeadlineTooClose
        | StopReason::BreakerOpen
        | StopReason::Throttled => true,
        StopReason::NeverRetry | StopReason::NotIdempotent | StopReason::AttemptsExhausted => {
            attempts > 1
        }
    }
}
