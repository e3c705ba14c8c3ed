//! The retry part of the client stack, for composing layers by hand.
//!
//! [`RetryLayer`] is the [client stack](crate::client) with a retry policy and nothing else: no
//! breaker, no throttle, and no deadline headers of its own — it leaves those to the layers
//! you put around it, and works with them in every order:
//!
//! - a [`PropagateDeadlineLayer`](crate::deadline::PropagateDeadlineLayer) *below* it writes
//!   each attempt's own deadline, min(per-try timeout, time left), because every attempt
//!   runs as the current deadline of the task ([`stormguard::deadline::scope`]);
//! - one *above* it has already written a deadline header: each attempt rewrites that header
//!   with its own, shorter time;
//! - an [`AdmissionLayer`](crate::admission::AdmissionLayer) (breaker, throttle) *below* it:
//!   a refusal stops the retries at once, uncharged to the budget, and is marked
//!   `X-Retry-Exhausted: true`;
//! - one *above* it records every call's real outcome: the exhausted mark is about retrying,
//!   not health, and does not hide a failure from a breaker.
//!
//! The orders that work are listed in the [crate docs](crate#composing-the-layers-by-hand).
//!
//! Prefer [`ClientLayer`] when you want all of it: it builds the
//! same pieces in the one order from one policy. Everything the client stack does to an
//! attempt (body replay, idempotency, `Retry-After`, gRPC, the exhausted mark, observability)
//! the retry layer does the same way: it is the same code.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::convert::Infallible;
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use stormguard::retry::RetryPolicy;
//! use stormguard_tower::body::ReplayBody;
//! use stormguard_tower::retry::RetryLayer;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! // A downstream that fails twice with 503, then succeeds.
//! let calls = Arc::new(AtomicU32::new(0));
//! let seen = calls.clone();
//! let downstream = service_fn(move |_req: Request<ReplayBody<Full<Bytes>>>| {
//!     let n = seen.fetch_add(1, Ordering::Relaxed) + 1;
//!     let status = if n < 3 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
//!     async move { Ok::<_, Infallible>(Response::builder().status(status).body(Full::new(Bytes::new())).unwrap()) }
//! });
//! let client = ServiceBuilder::new()
//!     .layer(RetryLayer::new(RetryPolicy::new(3)).unwrap())
//!     .service(downstream);
//! let request = Request::get("http://orders/1").body(Full::new(Bytes::new())).unwrap();
//! let response = client.oneshot(request).await.unwrap();
//! assert_eq!(response.status(), StatusCode::OK);
//! assert_eq!(calls.load(Ordering::Relaxed), 3);
//! # }
//! ```

use std::sync::Arc;

use stormguard::budget::RetryBudget;
use stormguard::classify::GrpcCodeSet;
use stormguard::policy::{EndpointPolicy, PolicyFile};
use stormguard::retry::RetryPolicy;
use tower_layer::Layer;

use crate::client::{
    Client, ClientLayer, ClientLayerBuilder, DEFAULT_ROUTE, ErrorClassifier, InvalidPolicies,
};
use crate::observe::{Observer, Telemetry};

/// Retries requests to a downstream service; see the [module docs](self).
#[derive(Debug)]
pub struct RetryLayer<O = Telemetry> {
    inner: ClientLayer<O>,
}

impl<O> Clone for RetryLayer<O> {
    fn clone(&self) -> Self {
        RetryLayer {
            inner: self.inner.clone(),
        }
    }
}

impl RetryLayer {
    /// A layer with `policy` for every request, no budget and the default limits.
    pub fn new(policy: RetryPolicy) -> Result<Self, InvalidPolicies> {
        RetryLayer::builder(policy).build()
    }

    /// Starts a layer with `policy` for every request.
    pub fn builder(policy: RetryPolicy) -> RetryLayerBuilder {
        RetryLayerBuilder {
            stack: ClientLayerBuilder::single(DEFAULT_ROUTE, EndpointPolicy::new(policy))
                .without_propagation(),
        }
    }

    /// Starts a layer routed by `file` (see [`ClientLayer::from_policy_file`]); only each
    /// endpoint's retry, timeouts and budget are used.
    pub fn routed(file: &PolicyFile) -> RetryLayerBuilder {
        RetryLayerBuilder {
            stack: ClientLayerBuilder::routes(&retry_only(file)).without_propagation(),
        }
    }
}

/// `file` with everything but retrying, timeouts and budgets taken out.
fn retry_only(file: &PolicyFile) -> PolicyFile {
    PolicyFile::new(
        file.endpoints()
            .iter()
            .map(|(name, policy)| {
                let mut only = EndpointPolicy::new(*policy.retry());
                if let Some(overall) = policy.overall_timeout() {
                    only = only.with_overall_timeout(overall);
                }
                if let Some(budget) = policy.budget() {
                    only = only.with_budget(*budget);
                }
                (name.clone(), only)
            })
            .collect(),
    )
}

impl<O: Observer> RetryLayer<O> {
    /// The live policies.
    pub fn policies(&self) -> &crate::client::Policies<O> {
        self.inner.policies()
    }
}

impl<S, O> Layer<S> for RetryLayer<O> {
    type Service = Client<S, O>;

    fn layer(&self, inner: S) -> Client<S, O> {
        self.inner.layer(inner)
    }
}

/// Builds a [`RetryLayer`].
///
/// # Default
///
/// As [`ClientLayer`]'s: no budget (set one with [`with_budget`](Self::with_budget), one per
/// downstream), bodies replayed up to 64 KiB, gRPC responses read up to 64 KiB, A6's
/// retryable codes, jitter seeded from the operating system, the [`Telemetry`] observer.
pub struct RetryLayerBuilder<O = Telemetry> {
    stack: ClientLayerBuilder<O>,
}

impl<O: Observer> RetryLayerBuilder<O> {
    /// Shares `budget` among all requests whose route names no budget of its own.
    pub fn with_budget(self, budget: Arc<dyn RetryBudget>) -> Self {
        RetryLayerBuilder {
            stack: self.stack.with_budget(budget),
        }
    }

    /// Replays request bodies of up to `bytes`; a longer body is sent once and its request
    /// is not retried.
    pub fn with_body_limit(self, bytes: usize) -> Self {
        RetryLayerBuilder {
            stack: self.stack.with_body_limit(bytes),
        }
    }

    /// Reads gRPC response bodies of up to `bytes` to find the status in their trailers.
    pub fn with_grpc_response_limit(self, bytes: usize) -> Self {
        RetryLayerBuilder {
            stack: self.stack.with_grpc_response_limit(bytes),
        }
    }

    /// The gRPC status codes to retry (A6 `retryableStatusCodes`).
    pub fn with_grpc_codes(self, codes: GrpcCodeSet) -> Self {
        RetryLayerBuilder {
            stack: self.stack.with_grpc_codes(codes),
        }
    }

    /// Classifies transport errors of the inner service with `classifier`.
    pub fn with_error_classifier(self, classifier: ErrorClassifier) -> Self {
        RetryLayerBuilder {
            stack: self.stack.with_error_classifier(classifier),
        }
    }

    /// Seeds the jitter (tests, simulations).
    pub fn with_seed(self, seed: u64) -> Self {
        RetryLayerBuilder {
            stack: self.stack.with_seed(seed),
        }
    }

    /// Reports to `observer` instead of [`Telemetry`].
    pub fn with_observer<O2: Observer>(self, observer: O2) -> RetryLayerBuilder<O2> {
        RetryLayerBuilder {
            stack: self.stack.with_observer(observer),
        }
    }

    /// The layer, with every policy validated.
    pub fn build(self) -> Result<RetryLayer<O>, InvalidPolicies> {
        Ok(RetryLayer {
            inner: self.stack.build()?,
        })
    }
}

impl<O> std::fmt::Debug for RetryLayerBuilder<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryLayerBuilder").finish_non_exhaustive()
    }
}
