//! The admission layer's configuration.

use std::sync::Arc;

use stormguard::admission::AttemptGate;
use tower_layer::Layer;

use super::Admission;
use super::refused::{ErrorOnRefusal, Http503};
use crate::client::DEFAULT_ROUTE;
use crate::observe::{Observer, Telemetry};
use crate::wire::HealthClassifier;

/// Puts a shared [`AttemptGate`] — a circuit breaker, an adaptive throttle, or both — in
/// front of a service; see the [module docs](super).
///
/// # Default
///
/// - results classified for health by [`HealthClassifier`] (HTTP status and `Retry-After`,
///   blind to `X-Retry-Exhausted`; transport errors by type), the classifier the
///   [client stack](crate::client) records with;
/// - refusals are errors: the core's [`Refusal`](stormguard::admission::Refusal), boxed;
/// - refusals reported to the [`Telemetry`] observer, as the endpoint
///   [`DEFAULT_ROUTE`] (`"default"`).
#[derive(Debug)]
pub struct AdmissionLayer<G, C = HealthClassifier, O = Telemetry, R = ErrorOnRefusal> {
    pub(super) gate: G,
    pub(super) classifier: C,
    pub(super) observer: Arc<O>,
    pub(super) endpoint: Arc<str>,
    pub(super) refused: R,
}

impl<G: Clone, C: Clone, O, R: Clone> Clone for AdmissionLayer<G, C, O, R> {
    fn clone(&self) -> Self {
        AdmissionLayer {
            gate: self.gate.clone(),
            classifier: self.classifier.clone(),
            observer: Arc::clone(&self.observer),
            endpoint: Arc::clone(&self.endpoint),
            refused: self.refused.clone(),
        }
    }
}

impl<G: AttemptGate> AdmissionLayer<G> {
    /// A layer that asks `gate` before every call: an `Arc` of a breaker or a throttle (share
    /// it with every other caller of the same downstream), a pair of them (asked in order), or
    /// an `Option` of one.
    pub fn new(gate: G) -> Self {
        AdmissionLayer {
            gate,
            classifier: HealthClassifier,
            observer: Arc::new(Telemetry),
            endpoint: Arc::from(DEFAULT_ROUTE),
            refused: ErrorOnRefusal,
        }
    }
}

impl<G, C, O, R> AdmissionLayer<G, C, O, R> {
    /// Classifies each result for the gate with `classifier` (any
    /// `Fn(&Result<T, E>) -> Outcome`, or a [`Classifier`](stormguard::classify::Classifier)
    /// that also tells refusals from further down).
    pub fn with_classifier<C2>(self, classifier: C2) -> AdmissionLayer<G, C2, O, R> {
        AdmissionLayer {
            gate: self.gate,
            classifier,
            observer: self.observer,
            endpoint: self.endpoint,
            refused: self.refused,
        }
    }

    /// Reports refusals to `observer` instead (a pair `(Telemetry, mine)` keeps both).
    pub fn with_observer<O2: Observer>(self, observer: O2) -> AdmissionLayer<G, C, O2, R> {
        AdmissionLayer {
            gate: self.gate,
            classifier: self.classifier,
            observer: Arc::new(observer),
            endpoint: self.endpoint,
            refused: self.refused,
        }
    }

    /// Names the endpoint in the observer's events (its metrics' `endpoint` label).
    pub fn with_endpoint(mut self, endpoint: &str) -> Self {
        self.endpoint = Arc::from(endpoint);
        self
    }

    /// Answers refused requests with a `503` response instead of an error (see [`Http503`]).
    pub fn with_http_503(self) -> AdmissionLayer<G, C, O, Http503> {
        AdmissionLayer {
            gate: self.gate,
            classifier: self.classifier,
            observer: self.observer,
            endpoint: self.endpoint,
            refused: Http503,
        }
    }

    /// The gate.
    pub fn gate(&self) -> &G {
        &self.gate
    }
}

impl<S, G: Clone, C: Clone, O, R: Clone> Layer<S> for AdmissionLayer<G, C, O, R> {
    type Service = Admission<S, G, C, O, R>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission {
            inner,
            layer: self.clone(),
        }
    }
}
