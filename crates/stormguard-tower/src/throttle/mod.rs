//! A tower middleware that rejects requests locally while the backend is refusing them
//! (Google SRE's adaptive client-side throttling).
//!
//! # Why a client-side throttle?
//!
//! An overloaded backend spends capacity even on the requests it refuses. The throttle
//! ([`stormguard::throttle`]) counts, over the last two minutes, the requests this client
//! tried to send and the ones the backend accepted, and rejects new requests locally with
//! probability `max(0, (requests − K·accepts) / (requests + 1))`, so the backend sees about
//! `K` times what it can serve. This layer asks it before each call: a throttled request
//! never reaches the inner service and fails with [`ThrottleError::Throttled`] (or, with
//! [`AdaptiveThrottleLayer::with_http_503`], is answered with a `503`). The result of every
//! request that was sent is classified (HTTP status by default) and recorded as accepted or
//! not.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::sync::Arc;
//! use stormguard::clock::Clock;
//! use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};
//! use stormguard_tower::throttle::{AdaptiveThrottleLayer, ThrottleError};
//! use tower::{Layer, Service, ServiceExt};
//!
//! let throttle = Arc::new(AdaptiveThrottle::new(ThrottleConfig::sre_default(), Clock::system()).unwrap());
//! let mut svc = AdaptiveThrottleLayer::new(throttle).layer(tower::service_fn(|_: ()| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::builder().status(429).body(()).unwrap())
//! }));
//! let mut throttled = 0;
//! for _ in 0..100 {
//!     if let Err(ThrottleError::Throttled(_)) = svc.ready().await.unwrap().call(()).await {
//!         throttled += 1;
//!     }
//! }
//! assert!(throttled > 50);
//! # }
//! ```

mod error;
mod future;
mod layer;

use std::sync::Arc;
use std::task::{Context, Poll};

use stormguard::classify::Classifier;
use stormguard::throttle::AdaptiveThrottle;
use tower_service::Service;

pub use error::ThrottleError;
pub use future::ResponseFuture;
pub use layer::AdaptiveThrottleLayer;

use crate::reject::{ErrorOnReject, RejectWith, Rejected};
use crate::wire::HealthClassifier as HttpStatus;

/// A service behind a shared [`AdaptiveThrottle`]; built by [`AdaptiveThrottleLayer`].
#[derive(Debug)]
pub struct AdaptiveThrottleService<S, C = HttpStatus, R = ErrorOnReject> {
    inner: S,
    throttle: Arc<AdaptiveThrottle>,
    classifier: C,
    reject: R,
}

impl<S: Clone, C: Clone, R: Clone> Clone for AdaptiveThrottleService<S, C, R> {
    fn clone(&self) -> Self {
        AdaptiveThrottleService {
            inner: self.inner.clone(),
            throttle: Arc::clone(&self.throttle),
            classifier: self.classifier.clone(),
            reject: self.reject.clone(),
        }
    }
}

impl<S, C, R> AdaptiveThrottleService<S, C, R> {
    /// The throttle.
    pub fn throttle(&self) -> &Arc<AdaptiveThrottle> {
        &self.throttle
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, Req, C, R> Service<Req> for AdaptiveThrottleService<S, C, R>
where
    S: Service<Req>,
    C: Classifier<S::Response, S::Error> + Clone,
    R: RejectWith<S::Response>,
{
    type Response = S::Response;
    type Error = ThrottleError<S::Error>;
    type Future = ResponseFuture<S::Future, C, S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(ThrottleError::Service)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.throttle.try_acquire() {
            Ok(()) => ResponseFuture::called(
                self.inner.call(req),
                Arc::clone(&self.throttle),
                self.classifier.clone(),
            ),
            Err(throttled) => {
                let result = match self.reject.reject(Rejected::Throttle(throttled)) {
                    Some(response) => Ok(response),
                    None => Err(ThrottleError::Throttled(throttled)),
                };
                ResponseFuture::rejected(result, self.classifier.clone())
            }
        }
    }
}
