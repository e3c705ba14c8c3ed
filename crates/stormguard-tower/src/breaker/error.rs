//! The breaker layer's error.

use std::fmt;

use stormguard::breaker::BreakerOpen;

/// The breaker rejected the request, or the inner service failed.
#[derive(Debug)]
pub enum BreakerError<E> {
    /// The breaker rejected the request; it was not sent.
    Open(BreakerOpen),
    /// The inner service's error.
    Service(E),
}

impl<E> BreakerError<E> {
    /// The rejection, if the breaker rejected the request.
    pub fn open(&self) -> Option<&BreakerOpen> {
        match self {
            BreakerError::Open(open) => Some(open),
            BreakerError::Service(_) => None,
        }
    }

    /// The inner service's error, if it failed.
    pub fn into_service(self) -> Option<E> {
        match self {
            BreakerError::Open(_) => None,
            BreakerError::Service(e) => Some(e),
        }
    }
}

impl<E: fmt::Display> fmt::Display for BreakerError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BreakerError::Open(open) => open.fmt(f),
            BreakerError::Service(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for BreakerError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BreakerError::Open(open) => Some(open),
            BreakerError::Service(e) => Some(e),
        }
    }
}
