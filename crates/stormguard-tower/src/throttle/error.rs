//! The throttle layer's error.

use std::fmt;

use stormguard::throttle::Throttled;

/// The throttle rejected the request, or the inner service failed.
#[derive(Debug)]
pub enum ThrottleError<E> {
    /// The throttle rejected the request locally; it was not sent.
    Throttled(Throttled),
    /// The inner service's error.
    Service(E),
}

impl<E> ThrottleError<E> {
    /// The rejection, if the throttle rejected the request.
    pub fn throttled(&self) -> Option<&Throttled> {
        match self {
            ThrottleError::Throttled(t) => Some(t),
            ThrottleError::Service(_) => None,
        }
    }

    /// The inner service's error, if it failed.
    pub fn into_service(self) -> Option<E> {
        match self {
            ThrottleError::Throttled(_) => None,
            ThrottleError::Service(e) => Some(e),
        }
    }
}

impl<E: fmt::Display> fmt::Display for ThrottleError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThrottleError::Throttled(t) => t.fmt(f),
            ThrottleError::Service(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for ThrottleError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ThrottleError::Throttled(t) => Some(t),
            ThrottleError::Service(e) => Some(e),
        }
    }
}
