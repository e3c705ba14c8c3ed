//! The layer's configuration: policies, budget, limits, gRPC codes.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use stormguard::budget::{RetryBudget, Unlimited};
use stormguard::classify::{GrpcCodeSet, Outcome};
use stormguard::retry::{Retrier, RetryPolicy, SeededRandom};
use tower_layer::Layer;

use super::Retry;
use super::route::{RoutePattern, RoutePolicy, Routes, best_match};
use crate::observe::Observe;
use crate::wire::classify_transport_error;

/// How a transport error of the inner service is classified; see
/// [`classify_transport_error`].
pub type ErrorClassifier = fn(&(dyn StdError + 'static)) -> Outcome;

/// The retrier of one route, shared by every request on it.
pub(crate) struct RouteRetrier {
    pub(crate) retrier: Retrier<Arc<dyn RetryBudget>, Observe, SeededRandom>,
    pub(crate) overall: Option<Duration>,
}

/// Everything the services of one layer share.
pub(crate) struct Shared {
    routes: Vec<(RoutePattern, RouteRetrier)>,
    default: RouteRetrier,
    pub(crate) body_limit: usize,
    pub(crate) grpc_response_limit: usize,
    pub(crate) grpc_codes: GrpcCodeSet,
    pub(crate) error_classifier: ErrorClassifier,
}

impl Shared {
    /// The retrier for a request: the most specific matching route, else the default.
    pub(crate) fn route(&self, method: &Method, path: &str) -> &RouteRetrier {
        if self.routes.is_empty() {
            return &self.default;
        }
        best_match(self.routes.iter().map(|(p, r)| (p, r)), method, path).unwrap_or(&self.default)
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryLayer")
            .field("default", self.default.retrier.policy())
            .field("routes", &self.routes.len())
            .field("body_limit", &self.body_limit)
            .field("grpc_response_limit", &self.grpc_response_limit)
            .field("grpc_codes", &self.grpc_codes)
            .finish_non_exhaustive()
    }
}

/// Retries requests to a downstream service with the core's [`Retrier`]: bodies replayed,
/// idempotency respected, `Retry-After` and gRPC pushback honoured, and failures it gave up
/// on marked `X-Retry-Exhausted: true` so no layer upstream retries them again.
///
/// See the [module docs](super) for what is retried and why.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use stormguard::backoff::Backoff;
/// use stormguard::budget::TokenBucket;
/// use stormguard::retry::RetryPolicy;
/// use stormguard_tower::retry::RetryLayer;
///
/// let policy = RetryPolicy::new(3)
///     .with_backoff(Backoff::exponential(Duration::from_millis(50)))
///     .with_per_try_timeout(Duration::from_millis(300))
///     .validate()?;
/// let layer = RetryLayer::builder(policy)
///     .with_budget(Arc::new(TokenBucket::grpc(10, 0.1)?))
///     .with_body_limit(16 * 1024)
///     .build();
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct RetryLayer {
    shared: Arc<Shared>,
}

impl RetryLayer {
    /// A layer with `policy` for every request, no budget and the default limits.
    pub fn new(policy: RetryPolicy) -> Self {
        RetryLayer::builder(policy).build()
    }

    /// Starts a layer with `policy` for every request no route matches.
    pub fn builder(policy: RetryPolicy) -> RetryLayerBuilder {
        RetryLayerBuilder::new(policy)
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Retry<S> {
        Retry::from_shared(inner, self.shared.clone())
    }
}

/// Builds a [`RetryLayer`].
///
/// # Default
///
/// - no budget (every retry the policy allows is sent; set one with
///   [`with_budget`](Self::with_budget) — one per downstream);
/// - no routes: the builder's policy applies to every request;
/// - request bodies replayed up to [`DEFAULT_BODY_LIMIT`] (64 KiB);
/// - gRPC responses read up to [`DEFAULT_GRPC_RESPONSE_LIMIT`] (64 KiB) to find their status;
/// - gRPC retryable codes: A6's usual `{UNAVAILABLE}`;
/// - transport errors classified by [`classify_transport_error`];
/// - jitter seeded from the operating system.
pub struct RetryLayerBuilder {
    policy: RetryPolicy,
    budget: Option<Arc<dyn RetryBudget>>,
    routes: Routes,
    body_limit: usize,
    grpc_response_limit: usize,
    grpc_codes: GrpcCodeSet,
    error_classifier: ErrorClassifier,
    seed: Option<u64>,
}

/// The default replay limit of request bodies: 64 KiB.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// The default read limit of gRPC response bodies: 64 KiB.
pub const DEFAULT_GRPC_RESPONSE_LIMIT: usize = 64 * 1024;

impl RetryLayerBuilder {
    fn new(policy: RetryPolicy) -> Self {
        RetryLayerBuilder {
            policy,
            budget: None,
            routes: Routes::new(),
            body_limit: DEFAULT_BODY_LIMIT,
            grpc_response_limit: DEFAULT_GRPC_RESPONSE_LIMIT,
            grpc_codes: GrpcCodeSet::A6_DEFAULT,
            error_classifier: classify_transport_error,
            seed: None,
        }
    }

    /// Shares `budget` among all requests of this layer whose route names no budget of its
    /// own. Build one budget per downstream and share it (an `Arc`) across every layer that
    /// calls that downstream.
    pub fn with_budget(mut self, budget: Arc<dyn RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Per-route policies (see [`Routes`]). A default policy in `routes` replaces the
    /// builder's.
    pub fn with_routes(mut self, routes: Routes) -> Self {
        self.routes = routes;
        self
    }

    /// Replays request bodies of up to `bytes`; a longer body is sent once and its request
    /// is not retried.
    pub const fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Reads gRPC response bodies of up to `bytes` to find the status in their trailers; a
    /// longer response is handed on unread and counts as committed (not retried).
    pub const fn with_grpc_response_limit(mut self, bytes: usize) -> Self {
        self.grpc_response_limit = bytes;
        self
    }

    /// The gRPC status codes to retry (A6 `retryableStatusCodes`).
    pub const fn with_grpc_codes(mut self, codes: GrpcCodeSet) -> Self {
        self.grpc_codes = codes;
        self
    }

    /// Classifies transport errors of the inner service with `classifier` instead of
    /// [`classify_transport_error`].
    pub const fn with_error_classifier(mut self, classifier: ErrorClassifier) -> Self {
        self.error_classifier = classifier;
        self
    }

    /// Seeds the jitter, so that the same requests wait the same delays (tests,
    /// simulations). Leave it unset in production: processes must jitter differently.
    pub const fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The layer.
    pub fn build(self) -> RetryLayer {
        let fallback: Arc<dyn RetryBudget> = self.budget.unwrap_or_else(|| Arc::new(Unlimited));
        let seed = self.seed;
        let mut index = 0u64;
        let mut make = |policy: RoutePolicy| {
            let random = match seed {
                Some(seed) => SeededRandom::new(seed.wrapping_add(index)),
                None => SeededRandom::from_entropy(),
            };
            index += 1;
            RouteRetrier {
                retrier: Retrier::new(policy.retry)
                    .with_budget(policy.budget.unwrap_or_else(|| fallback.clone()))
                    .with_observer(Observe)
                    .with_random(random),
                overall: policy.overall,
            }
        };
        let (routes, default) = self.routes.into_parts();
        let default = make(default.unwrap_or(RoutePolicy {
            retry: self.policy,
            overall: None,
            budget: None,
        }));
        let routes = routes.into_iter().map(|(p, r)| (p, make(r))).collect();
        RetryLayer {
            shared: Arc::new(Shared {
                routes,
                default,
                body_limit: self.body_limit,
                grpc_response_limit: self.grpc_response_limit,
                grpc_codes: self.grpc_codes,
                error_classifier: self.error_classifier,
            }),
        }
    }
}

impl std::fmt::Debug for RetryLayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryLayerBuilder")
            .field("policy", &self.policy)
            .field("budget", &self.budget.is_some())
            .field("routes", &self.routes)
            .field("body_limit", &self.body_limit)
            .field("grpc_response_limit", &self.grpc_response_limit)
            .field("grpc_codes", &self.grpc_codes)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}
