//! The errors the hedging layer adds to the inner service's own.

use tower::BoxError;

/// The deadline passed before any attempt succeeded; every attempt was cancelled.
#[derive(Debug, thiserror::Error)]
#[error("deadline exceeded after {sent} hedged attempt(s)")]
pub struct DeadlineExceeded {
    sent: u32,
}

impl DeadlineExceeded {
    pub(super) fn new(sent: u32) -> Self {
        DeadlineExceeded { sent }
    }

    /// Attempts sent before the deadline, the original included.
    pub fn sent(&self) -> u32 {
        self.sent
    }
}

/// The request body failed while it was being read for replay; nothing was sent.
#[derive(Debug, thiserror::Error)]
#[error("request body could not be read for hedging")]
pub struct BodyError {
    #[source]
    source: BoxError,
}

impl BodyError {
    pub(super) fn new(source: BoxError) -> Self {
        BodyError { source }
    }
}
