//! The layer: which injector to put in front of a service.

use std::sync::Arc;

use stormguard::fault::FaultInjector;
use tower_layer::Layer;

use super::Fault;

/// Applies [`Fault`] to a service; see the [module documentation](super).
#[derive(Clone, Debug)]
pub struct FaultLayer {
    injector: Arc<FaultInjector>,
}

impl FaultLayer {
    /// Injects `injector`'s faults; keep a clone of the `Arc` to switch it at run time.
    pub fn new(injector: Arc<FaultInjector>) -> Self {
        FaultLayer { injector }
    }

    /// The injector.
    pub fn injector(&self) -> &Arc<FaultInjector> {
        &self.injector
    }
}

impl<S> Layer<S> for FaultLayer {
    type Service = Fault<S>;

    fn layer(&self, inner: S) -> Fault<S> {
        Fault::new(inner, Arc::clone(&self.injector))
    }
}
