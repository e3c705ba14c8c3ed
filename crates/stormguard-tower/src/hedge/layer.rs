//! The layer: the hedger, the classifier and the body limit.

use std::sync::Arc;

use stormguard::budget::Unlimited;
use stormguard::hedge::Hedger;
use tower_layer::Layer;

use super::{Hedge, HttpClassifier};

/// Applies [`Hedge`] to a service; see the [module documentation](super).
///
/// # Default
///
/// [`HttpClassifier`], and bodies of up to 64 KiB buffered for replay.
#[derive(Debug)]
pub struct HedgeLayer<B = Unlimited, O = (), C = HttpClassifier> {
    hedger: Arc<Hedger<B, O>>,
    classifier: C,
    body_limit: usize,
}

impl<B, O, C: Clone> Clone for HedgeLayer<B, O, C> {
    fn clone(&self) -> Self {
        HedgeLayer {
            hedger: Arc::clone(&self.hedger),
            classifier: self.classifier.clone(),
            body_limit: self.body_limit,
        }
    }
}

/// The default body limit: 64 KiB.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

impl<B, O> HedgeLayer<B, O> {
    /// Hedges with `hedger` (its policy, budget and observer), shared by every service this
    /// layer makes.
    pub fn new(hedger: Hedger<B, O>) -> Self {
        HedgeLayer {
            hedger: Arc::new(hedger),
            classifier: HttpClassifier,
            body_limit: DEFAULT_BODY_LIMIT,
        }
    }
}

impl<B, O, C> HedgeLayer<B, O, C> {
    /// Classifies responses and errors with `classifier` instead.
    pub fn with_classifier<C2>(self, classifier: C2) -> HedgeLayer<B, O, C2> {
        HedgeLayer {
            hedger: self.hedger,
            classifier,
            body_limit: self.body_limit,
        }
    }

    /// Buffers request bodies of up to `bytes` for replay; larger ones are not hedged.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The hedger.
    pub fn hedger(&self) -> &Arc<Hedger<B, O>> {
        &self.hedger
    }
}

impl<S, B, O, C: Clone> Layer<S> for HedgeLayer<B, O, C> {
    type Service = Hedge<S, B, O, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Hedge {
            inner,
            hedger: Arc::clone(&self.hedger),
            classifier: self.classifier.clone(),
            body_limit: self.body_limit,
        }
    }
}
