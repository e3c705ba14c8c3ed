//! Admission: a tower middleware that asks a circuit breaker, an adaptive throttle, or both,
//! before each call, and tells them how it went.
//!
//! # Why one layer for the breaker and the throttle
//!
//! Both answer the same question — may this call be sent at all? — and both need the same
//! thing afterwards: the call's outcome, read for the downstream's *health*. The core's
//! [`AttemptGate`] is that question, with one typed answer for every refusal
//! ([`Refusal`]: breaker open, throttled, deadline too close); this layer puts a gate where
//! the calls are. Each request asks the gate in `call` (not in `poll_ready`: readiness stays
//! the inner service's business, and a breaker that opens between the two still stops the
//! request); a refused request never reaches the inner service. An admitted request's result
//! is classified for health and recorded, with its elapsed time on the gate's clock, in the
//! breaker's window (which the retrier, the hedger and the other layers of the same
//! downstream read too) and in the throttle's counts.
//!
//! # Refusals are not failures
//!
//! A refusal is the core's [`Refusal`], boxed as the layer's error ([`wire::refusal_of`]
//! finds it in any cause chain), or — with [`AdmissionLayer::with_http_503`] — a `503`
//! response marked as a refusal ([`wire::REJECTED_BY`]) and `X-Retry-Exhausted: true`.
//! Either way, a [`RetryLayer`](crate::retry::RetryLayer) or [`HedgeLayer`](crate::hedge::HedgeLayer)
//! above it stops at once, with the refusal's stop reason, without charging its budget or
//! waiting a backoff, and nobody records it as a failure: a refusal from further down that
//! reaches this layer is not recorded in its gate either. Each refusal is reported to the
//! layer's [`Observer`] ([`Observer::refused`]).
//!
//! # What is recorded
//!
//! The health view of the result ([`HealthClassifier`], the one the
//! [client stack](crate::client) records with, by default): a `503` is a failure even when a
//! retry layer below marked it `X-Retry-Exhausted: true` — the mark is about retrying, not
//! about the downstream, and reading it here is how a breaker above a retry layer would never
//! open. A call cut by the deadline it was called under (below a retry layer, each attempt
//! runs under its per-try timeout) is recorded in doubt, as the core's retrier records it, so
//! a hanging downstream still opens the breaker; a call its caller dropped for another reason
//! records nothing (a half-open probe gives its slot back).
//!
//! # Breaker transitions
//!
//! A breaker is shared by every layer and stack that calls the same downstream, so it reports
//! its own transitions, once each: build it with
//! [`.with_observer(BreakerEvents::new(endpoint, observer))`](crate::observe::BreakerEvents),
//! and they reach [`Observer::breaker_changed`].
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::sync::Arc;
//! use stormguard::admission::Refusal;
//! use stormguard::breaker::{BreakerConfig, CircuitBreaker};
//! use stormguard::clock::Clock;
//! use stormguard::health::HealthConfig;
//! use stormguard_tower::admission::AdmissionLayer;
//! use stormguard_tower::observe::{BreakerEvents, Telemetry};
//! use stormguard_tower::wire::refusal_of;
//! use tower::{Layer, Service, ServiceExt};
//!
//! let config = BreakerConfig::new(HealthConfig::count(5)).with_minimum_throughput(5);
//! let breaker = CircuitBreaker::new(config, Clock::tokio())
//!     .unwrap()
//!     .with_observer(BreakerEvents::new("users", Telemetry));
//! let mut svc = AdmissionLayer::new(Arc::new(breaker))
//!     .with_endpoint("users")
//!     .layer(tower::service_fn(|_: http::Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::builder().status(502).body(()).unwrap())
//!     }));
//! for _ in 0..5 {
//!     let response = svc.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
//!     assert_eq!(response.status(), 502);
//! }
//! let err = svc.ready().await.unwrap().call(http::Request::new(())).await.unwrap_err();
//! assert!(matches!(refusal_of(err.as_ref()), Some(Refusal::BreakerOpen(_))));
//! # }
//! ```

mod future;
mod layer;
mod refused;

use std::task::{Context, Poll};

use http::Request;
use stormguard::admission::{AttemptGate, Refusal};
use stormguard::classify::Classifier;
use tower_service::Service;

pub use future::ResponseFuture;
pub use layer::AdmissionLayer;
pub use refused::{ErrorOnRefusal, Http503, RefusalAnswer};

use crate::observe::{CallInfo, Observer, Telemetry};
use crate::wire::{self, BoxError, HealthClassifier, Protocol};

/// A service behind a shared [`AttemptGate`]; made by [`AdmissionLayer`].
#[derive(Debug)]
pub struct Admission<S, G, C = HealthClassifier, O = Telemetry, R = ErrorOnRefusal> {
    inner: S,
    layer: AdmissionLayer<G, C, O, R>,
}

impl<S: Clone, G: Clone, C: Clone, O, R: Clone> Clone for Admission<S, G, C, O, R> {
    fn clone(&self) -> Self {
        Admission {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, G, C, O, R> Admission<S, G, C, O, R> {
    /// The gate.
    pub fn gate(&self) -> &G {
        &self.layer.gate
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, G, C, O, R> Admission<S, G, C, O, R>
where
    O: Observer,
{
    fn report<B>(&self, request: &Request<B>, refusal: &Refusal) {
        if !O::ENABLED {
            return;
        }
        let request_id = request
            .headers()
            .get(wire::REQUEST_ID)
            .and_then(|v| v.to_str().ok());
        let info = CallInfo::new(
            &self.layer.endpoint,
            request.method(),
            Protocol::of(request.headers()),
            request_id,
        );
        self.layer.observer.refused(&info, refusal);
    }
}

impl<S, B, G, C, O, R> Service<Request<B>> for Admission<S, G, C, O, R>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    G: AttemptGate,
    C: Classifier<S::Response, S::Error> + Clone,
    O: Observer,
    R: RefusalAnswer<S::Response>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, G::OwnedPass, C, S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let classifier = self.layer.classifier.clone();
        match self.layer.gate.admit_owned() {
            Ok(pass) => ResponseFuture::admitted(self.inner.call(request), pass, classifier),
            Err(refusal) => {
                self.report(&request, &refusal);
                let answer = match self.layer.refused.answer(&refusal) {
                    Some(response) => Ok(response),
                    None => Err(BoxError::from(refusal)),
                };
                ResponseFuture::refused(answer, classifier)
            }
        }
    }
}
