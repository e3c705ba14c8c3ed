//! A tower middleware that fails calls fast while the downstream is failing.
//!
//! # Why a layer around the core breaker?
//!
//! The breaker itself ([`stormguard::breaker`]) decides; this layer puts it where the calls
//! are. Each request asks the shared breaker for a permit before the inner service is called;
//! a rejected request never reaches the inner service and fails at once with
//! [`BreakerError::Open`] (or, with [`CircuitBreakerLayer::with_http_503`], is answered with a
//! `503` carrying `Retry-After`). An admitted request's result is classified (HTTP status by
//! default, or any classifier) and recorded, with its elapsed time on the breaker's clock, in
//! the breaker's window, which the retrier, the hedger and the other layers of the same
//! downstream read too.
//!
//! The permit is taken in `call`, not in `poll_ready`: readiness stays the inner service's
//! business, and a breaker that opens between the two still stops the request.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::sync::Arc;
//! use stormguard::breaker::{BreakerConfig, CircuitBreaker};
//! use stormguard::clock::Clock;
//! use stormguard::health::HealthConfig;
//! use stormguard_tower::breaker::{BreakerError, CircuitBreakerLayer};
//! use tower::{Layer, Service, ServiceExt};
//!
//! let config = BreakerConfig::new(HealthConfig::count(5)).with_minimum_throughput(5);
//! let breaker = Arc::new(CircuitBreaker::new(config, Clock::tokio()).unwrap());
//! let mut svc = CircuitBreakerLayer::new(breaker).layer(tower::service_fn(|_: ()| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::builder().status(502).body(()).unwrap())
//! }));
//! for _ in 0..5 {
//!     assert_eq!(svc.ready().await.unwrap().call(()).await.unwrap().status(), 502);
//! }
//! let err = svc.ready().await.unwrap().call(()).await.unwrap_err();
//! assert!(matches!(err, BreakerError::Open(_)));
//! # }
//! ```

mod error;
mod future;
mod layer;

use std::sync::Arc;
use std::task::{Context, Poll};

use stormguard::breaker::{BreakerObserver, CircuitBreaker};
use stormguard::classify::Classifier;
use tower_service::Service;

pub use error::BreakerError;
pub use future::ResponseFuture;
pub use layer::CircuitBreakerLayer;

use crate::reject::{ErrorOnReject, RejectWith, Rejected};
use crate::wire::HealthClassifier as HttpStatus;

/// A service behind a shared [`CircuitBreaker`]; built by [`CircuitBreakerLayer`].
#[derive(Debug)]
pub struct CircuitBreakerService<S, C = HttpStatus, R = ErrorOnReject, O = ()> {
    inner: S,
    breaker: Arc<CircuitBreaker<O>>,
    classifier: C,
    reject: R,
}

impl<S: Clone, C: Clone, R: Clone, O> Clone for CircuitBreakerService<S, C, R, O> {
    fn clone(&self) -> Self {
        CircuitBreakerService {
            inner: self.inner.clone(),
            breaker: Arc::clone(&self.breaker),
            classifier: self.classifier.clone(),
            reject: self.reject.clone(),
        }
    }
}

impl<S, C, R, O> CircuitBreakerService<S, C, R, O> {
    /// The breaker.
    pub fn breaker(&self) -> &Arc<CircuitBreaker<O>> {
        &self.breaker
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, Req, C, R, O> Service<Req> for CircuitBreakerService<S, C, R, O>
where
    S: Service<Req>,
    C: Classifier<S::Response, S::Error> + Clone,
    R: RejectWith<S::Response>,
    O: BreakerObserver,
{
    type Response = S::Response;
    type Error = BreakerError<S::Error>;
    type Future = ResponseFuture<S::Future, C, S::Response, S::Error, O>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(BreakerError::Service)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.breaker.try_acquire_owned() {
            Ok(permit) => {
                ResponseFuture::called(self.inner.call(req), permit, self.classifier.clone())
            }
            Err(open) => {
                let result = match self.reject.reject(Rejected::Breaker(open)) {
                    Some(response) => Ok(response),
                    None => Err(BreakerError::Open(open)),
                };
                ResponseFuture::rejected(result, self.classifier.clone())
            }
        }
    }
}
