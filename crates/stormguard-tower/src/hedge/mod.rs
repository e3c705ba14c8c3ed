//! The hedging part of the client stack, for composing layers by hand.
//!
//! [`HedgeLayer`] is the [client stack](crate::client) with a hedging policy and nothing else:
//! the original request goes out at once, another copy follows after the policy's delay while
//! no answer has come (gRPC A6 `hedgingPolicy`), the first success wins and the others are
//! cancelled (their futures dropped, which makes hyper reset the stream or close the
//! connection). Every copy after the first is paid from the retry budget; see
//! [`stormguard::hedge`] for the rules and why they matter.
//!
//! # Which requests are hedged
//!
//! A request is hedged only when it is safe to send twice — an idempotent method, a valid
//! `Idempotency-Key`, or a policy that declares the endpoint idempotent (see
//! [`wire::is_retry_safe`](crate::wire::is_retry_safe)) — **and** its body is known to fit
//! the body limit (64 KiB by default; its size hint has an upper bound within it), because
//! copies run side by side and a body that outgrew the limit could not be sent to the later
//! ones. Any other request gets exactly one attempt.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use stormguard::policy::{BudgetSpec, HedgeDelaySpec, HedgeSpec};
//! use stormguard_tower::body::ReplayBody;
//! use stormguard_tower::hedge::HedgeLayer;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! let spec = HedgeSpec { max_attempts: 2, delay: HedgeDelaySpec::Fixed(Duration::from_millis(20)) };
//! let layer = HedgeLayer::builder(spec)
//!     .with_budget(BudgetSpec::Grpc { max_tokens: 10, token_ratio: 0.1 })
//!     .build()
//!     .unwrap();
//! let calls = Arc::new(AtomicU32::new(0));
//! let counted = calls.clone();
//! let mut svc = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(move |_req: Request<ReplayBody<Full<Bytes>>>| {
//!         // The first call is stuck; the hedge answers at once.
//!         let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
//!         async move {
//!             if first {
//!                 tokio::time::sleep(Duration::from_secs(10)).await;
//!             }
//!             Ok::<_, std::convert::Infallible>(Response::new(Full::<Bytes>::from("ok")))
//!         }
//!     });
//! let start = tokio::time::Instant::now();
//! let response = svc.ready().await.unwrap().call(Request::new(Full::default())).await.unwrap();
//! assert!(response.status().is_success());
//! assert_eq!(start.elapsed(), Duration::from_millis(20));
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! # }
//! ```

use stormguard::policy::{BudgetSpec, EndpointPolicy, HedgeSpec};
use stormguard::retry::RetryPolicy;
use tower_layer::Layer;

use crate::client::{Client, ClientLayer, ClientLayerBuilder, DEFAULT_ROUTE, InvalidPolicies};
use crate::observe::{Observer, Telemetry};

/// Hedges requests to a downstream service; see the [module docs](self).
#[derive(Debug)]
pub struct HedgeLayer<O = Telemetry> {
    inner: ClientLayer<O>,
}

impl<O> Clone for HedgeLayer<O> {
    fn clone(&self) -> Self {
        HedgeLayer {
            inner: self.inner.clone(),
        }
    }
}

impl HedgeLayer {
    /// A layer that hedges by `spec`, with no budget.
    pub fn new(spec: HedgeSpec) -> Result<Self, InvalidPolicies> {
        HedgeLayer::builder(spec).build()
    }

    /// Starts a layer that hedges by `spec`.
    pub fn builder(spec: HedgeSpec) -> HedgeLayerBuilder {
        HedgeLayerBuilder {
            policy: EndpointPolicy::new(RetryPolicy::new(1)).with_hedge(spec),
            observer: Telemetry,
            body_limit: crate::client::DEFAULT_BODY_LIMIT,
        }
    }
}

impl<S, O> Layer<S> for HedgeLayer<O> {
    type Service = Client<S, O>;

    fn layer(&self, inner: S) -> Client<S, O> {
        self.inner.layer(inner)
    }
}

/// Builds a [`HedgeLayer`].
///
/// # Default
///
/// No budget (set one: every copy after the first is a withdrawal), the policy's own
/// idempotency rule (methods and keys), bodies replayed up to 64 KiB, the [`Telemetry`]
/// observer.
pub struct HedgeLayerBuilder<O = Telemetry> {
    policy: EndpointPolicy,
    observer: O,
    body_limit: usize,
}

impl<O: Observer> HedgeLayerBuilder<O> {
    /// Pays for hedges from a budget built from `budget`.
    pub fn with_budget(mut self, budget: BudgetSpec) -> Self {
        self.policy = self.policy.with_budget(budget);
        self
    }

    /// Hedges every request, whatever its method: the operation is idempotent.
    pub fn with_idempotent(mut self, idempotent: bool) -> Self {
        let retry = self.policy.retry().with_idempotent(idempotent);
        self.policy = self.policy.with_retry(retry);
        self
    }

    /// Hedges requests whose body is known to be at most `bytes` long; larger ones (and
    /// bodies of unknown length) get one attempt.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Reports to `observer` instead of [`Telemetry`].
    pub fn with_observer<O2: Observer>(self, observer: O2) -> HedgeLayerBuilder<O2> {
        HedgeLayerBuilder {
            policy: self.policy,
            observer,
            body_limit: self.body_limit,
        }
    }

    /// The layer, with the policy validated.
    pub fn build(self) -> Result<HedgeLayer<O>, InvalidPolicies> {
        let stack = ClientLayerBuilder::single(DEFAULT_ROUTE, self.policy)
            .without_propagation()
            .with_body_limit(self.body_limit)
            .with_observer(self.observer);
        Ok(HedgeLayer {
            inner: stack.build()?,
        })
    }
}

impl<O> std::fmt::Debug for HedgeLayerBuilder<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HedgeLayerBuilder")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}
