//! The throttle layer's configuration.

use std::sync::Arc;

use stormguard::throttle::AdaptiveThrottle;
use tower_layer::Layer;

use super::AdaptiveThrottleService;
use crate::reject::{ErrorOnReject, Http503};
use crate::wire::HealthClassifier as HttpStatus;

/// Wraps a service in a shared [`AdaptiveThrottle`].
///
/// # Default
///
/// Responses are classified with [`HttpStatus`] (a request is *accepted* when its outcome is
/// a success or a deterministic answer such as a 404; see
/// [`stormguard::throttle`](stormguard::throttle#what-counts-as-accepted)) and rejections are
/// [`ThrottleError::Throttled`](super::ThrottleError::Throttled) errors.
#[derive(Debug)]
pub struct AdaptiveThrottleLayer<C = HttpStatus, R = ErrorOnReject> {
    throttle: Arc<AdaptiveThrottle>,
    classifier: C,
    reject: R,
}

impl<C: Clone, R: Clone> Clone for AdaptiveThrottleLayer<C, R> {
    fn clone(&self) -> Self {
        AdaptiveThrottleLayer {
            throttle: Arc::clone(&self.throttle),
            classifier: self.classifier.clone(),
            reject: self.reject.clone(),
        }
    }
}

impl AdaptiveThrottleLayer {
    /// A layer over `throttle`, shared with every other caller of the same backend.
    pub fn new(throttle: Arc<AdaptiveThrottle>) -> Self {
        AdaptiveThrottleLayer {
            throttle,
            classifier: HttpStatus,
            reject: ErrorOnReject,
        }
    }
}

impl<C, R> AdaptiveThrottleLayer<C, R> {
    /// Classifies each result with `classifier` (any `Fn(&Result<T, E>) -> Outcome`).
    pub fn with_classifier<C2>(self, classifier: C2) -> AdaptiveThrottleLayer<C2, R> {
        AdaptiveThrottleLayer {
            throttle: self.throttle,
            classifier,
            reject: self.reject,
        }
    }

    /// Answers throttled requests with a `503` response instead of an error (see
    /// [`Http503`]).
    pub fn with_http_503(self) -> AdaptiveThrottleLayer<C, Http503> {
        AdaptiveThrottleLayer {
            throttle: self.throttle,
            classifier: self.classifier,
            reject: Http503,
        }
    }

    /// The throttle.
    pub fn throttle(&self) -> &Arc<AdaptiveThrottle> {
        &self.throttle
    }
}

impl<S, C: Clone, R: Clone> Layer<S> for AdaptiveThrottleLayer<C, R> {
    type Service = AdaptiveThrottleService<S, C, R>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveThrottleService {
            inner,
            throttle: Arc::clone(&self.throttle),
            classifier: self.classifier.clone(),
            reject: self.reject.clone(),
        }
    }
}
