//! The breaker layer's configuration.

use std::sync::Arc;

use stormguard::breaker::{BreakerObserver, CircuitBreaker};
use tower_layer::Layer;

use super::CircuitBreakerService;
use crate::reject::{ErrorOnReject, Http503};
use crate::wire::HealthClassifier as HttpStatus;

/// Wraps a service in a shared [`CircuitBreaker`].
///
/// # Default
///
/// Responses are classified with [`HttpStatus`] and rejections are
/// [`BreakerError::Open`](super::BreakerError::Open) errors.
#[derive(Debug)]
pub struct CircuitBreakerLayer<C = HttpStatus, R = ErrorOnReject, O = ()> {
    breaker: Arc<CircuitBreaker<O>>,
    classifier: C,
    reject: R,
}

impl<C: Clone, R: Clone, O> Clone for CircuitBreakerLayer<C, R, O> {
    fn clone(&self) -> Self {
        CircuitBreakerLayer {
            breaker: Arc::clone(&self.breaker),
            classifier: self.classifier.clone(),
            reject: self.reject.clone(),
        }
    }
}

impl<O: BreakerObserver> CircuitBreakerLayer<HttpStatus, ErrorOnReject, O> {
    /// A layer over `breaker`, shared with every other user of the same downstream.
    pub fn new(breaker: Arc<CircuitBreaker<O>>) -> Self {
        CircuitBreakerLayer {
            breaker,
            classifier: HttpStatus,
            reject: ErrorOnReject,
        }
    }
}

impl<C, R, O: BreakerObserver> CircuitBreakerLayer<C, R, O> {
    /// Classifies each result with `classifier` (any `Fn(&Result<T, E>) -> Outcome`).
    pub fn with_classifier<C2>(self, classifier: C2) -> CircuitBreakerLayer<C2, R, O> {
        CircuitBreakerLayer {
            breaker: self.breaker,
            classifier,
            reject: self.reject,
        }
    }

    /// Answers rejected requests with a `503` response instead of an error (see
    /// [`Http503`]).
    pub fn with_http_503(self) -> CircuitBreakerLayer<C, Http503, O> {
        CircuitBreakerLayer {
            breaker: self.breaker,
            classifier: self.classifier,
            reject: Http503,
        }
    }

    /// The breaker.
    pub fn breaker(&self) -> &Arc<CircuitBreaker<O>> {
        &self.breaker
    }
}

impl<S, C: Clone, R: Clone, O> Layer<S> for CircuitBreakerLayer<C, R, O> {
    type Service = CircuitBreakerService<S, C, R, O>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreakerService {
            inner,
            breaker: Arc::clone(&self.breaker),
            classifier: self.classifier.clone(),
            reject: self.reject.clone(),
        }
    }
}
