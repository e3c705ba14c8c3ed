//! What an attempt's result means for retrying.
//!
//! A retrier that retries everything turns one slow dependency into an outage: every caller
//! multiplies its load at exactly the moment it can least take it. A retrier that retries
//! nothing gives up on faults that a second try would have hidden. The difference between
//! the two is knowing *why* an attempt failed, so this module sorts every result into one of
//! five [`Outcome`]s before any policy looks at it:
//!
//! - [`Outcome::Retryable`]: the request did not take effect and another try may succeed
//!   (connection refused before sending, 502/503/504, gRPC `UNAVAILABLE`);
//! - [`Outcome::NeverRetry`]: the failure is deterministic, the same request will fail the same
//!   way (400, 401, 403, 404, 409, 422, and also 500 and 501, which are bugs, not weather);
//! - [`Outcome::Overloaded`]: the downstream asked us to back off (429, 503 with
//!   `Retry-After`, gRPC `RESOURCE_EXHAUSTED`, server pushback); a retry must wait at least as
//!   long as it was told to;
//! - [`Outcome::InDoubt`]: the request was sent and then the connection was lost or timed out,
//!   so it may or may not have taken effect; only an idempotent operation (or one carrying an
//!   idempotency key) may be retried;
//! - [`Outcome::Success`].
//!
//! Classification is pure: it reads status codes, error kinds and header bytes, and never
//! panics on any input. Malformed headers never make a failure *more* retryable than it
//! would be without them.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use stormguard::classify::{Outcome, classify_grpc, classify_http_status, GrpcCode, GrpcCodeSet};
//!
//! assert_eq!(classify_http_status(404, None), Outcome::NeverRetry);
//! assert_eq!(classify_http_status(503, None), Outcome::Retryable);
//! assert_eq!(
//!     classify_http_status(429, Some(Duration::from_secs(2))),
//!     Outcome::Overloaded { retry_after: Some(Duration::from_secs(2)) },
//! );
//! assert_eq!(
//!     classify_grpc(GrpcCode::Unavailable, GrpcCodeSet::A6_DEFAULT, Some(b"250")),
//!     Outcome::Overloaded { retry_after: Some(Duration::from_millis(250)) },
//! );
//! ```

mod grpc;
mod http;
#[cfg(test)]
mod tests;

use std::io;
use std::time::Duration;

pub use grpc::{
    GrpcCode, GrpcCodeSet, GrpcStatusError, Pushback, classify_grpc, parse_grpc_pushback,
};
pub use http::{
    RETRY_EXHAUSTED, RetryAfterError, classify_http_response, classify_http_status,
    parse_retry_after,
};

/// What one attempt's result means for retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The attempt succeeded.
    Success,
    /// The attempt failed without taking effect; trying again is safe and may help.
    Retryable,
    /// A deterministic failure: the same request will fail the same way, so retrying cannot help.
    NeverRetry,
    /// The downstream asked us to back off.
    Overloaded {
        /// The earliest time to try again, if the downstream said (`Retry-After`, gRPC
        /// pushback). A retry must not start sooner than this.
        retry_after: Option<Duration>,
    },
    /// The request was sent and may or may not have taken effect (a timeout or a lost
    /// connection after sending). Retry only an idempotent operation or one that carries an
    /// idempotency key.
    InDoubt,
}

impl Outcome {
    /// `true` only for [`Outcome::Success`].
    pub const fn is_success(&self) -> bool {
        matches!(self, Outcome::Success)
    }

    /// `true` for every outcome except [`Outcome::Success`].
    pub const fn is_failure(&self) -> bool {
        !self.is_success()
    }

    /// A stable `snake_case` label for metrics and logs: `"success"`, `"retryable"`,
    /// `"never_retry"`, `"overloaded"` or `"in_doubt"`.
    ///
    /// ```
    /// use stormguard::classify::Outcome;
    /// assert_eq!(Outcome::Overloaded { retry_after: None }.label(), "overloaded");
    /// ```
    pub const fn label(&self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Retryable => "retryable",
            Outcome::NeverRetry => "never_retry",
            Outcome::Overloaded { .. } => "overloaded",
            Outcome::InDoubt => "in_doubt",
        }
    }
}

/// Classifies an I/O error by its kind and by whether the request had been written.
///
/// A failure to reach the server at all (`ConnectionRefused`, `AddrNotAvailable`,
/// `HostUnreachable`, `NetworkUnreachable`, `NetworkDown`) is always [`Outcome::Retryable`]:
/// no connection means nothing was sent, whatever `request_sent` says.
///
/// A failure of an established connection (`ConnectionReset`, `ConnectionAborted`,
/// `NotConnected`, `BrokenPipe`, `TimedOut`, `Interrupted`, `WouldBlock`, `UnexpectedEof`)
/// is [`Outcome::Retryable`] before the request was sent, because nothing can have taken
/// effect, and [`Outcome::InDoubt`] after, because the server may have processed it.
///
/// Every other kind (`NotFound`, `PermissionDenied`, `InvalidInput`, `InvalidData`,
/// `Unsupported`, `Other`, and kinds this function does not know) is [`Outcome::NeverRetry`]:
/// retrying what we do not understand is how retry storms start. Wrap the operation in a
/// closure [`Classifier`] to treat a specific error otherwise.
///
/// ```
/// use std::io::ErrorKind;
/// use stormguard::classify::{classify_io_error, Outcome};
///
/// assert_eq!(classify_io_error(ErrorKind::ConnectionRefused, false), Outcome::Retryable);
/// assert_eq!(classify_io_error(ErrorKind::TimedOut, true), Outcome::InDoubt);
/// assert_eq!(classify_io_error(ErrorKind::PermissionDenied, false), Outcome::NeverRetry);
/// ```
pub fn classify_io_error(kind: io::ErrorKind, request_sent: bool) -> Outcome {
    use io::ErrorKind as K;
    match kind {
        K::ConnectionRefused
        | K::AddrNotAvailable
        | K::HostUnreachable
        | K::NetworkUnreachable
        | K::NetworkDown => Outcome::Retryable,
        K::ConnectionReset
        | K::ConnectionAborted
        | K::NotConnected
        | K::BrokenPipe
        | K::TimedOut
        | K::Interrupted
        | K::WouldBlock
        | K::UnexpectedEof => {
            if request_sent {
                Outcome::InDoubt
            } else {
                Outcome::Retryable
            }
        }
        _ => Outcome::NeverRetry,
    }
}

/// Turns an operation's result into an [`Outcome`].
///
/// Implemented for every `Fn(&Result<T, E>) -> Outcome`, so a closure is a classifier:
///
/// ```
/// use stormguard::classify::{Classifier, Outcome};
///
/// let by_status = |r: &Result<u16, ()>| match r {
///     Ok(200) => Outcome::Success,
///     Ok(_) | Err(()) => Outcome::Retryable,
/// };
/// assert_eq!(by_status.classify(&Ok(200)), Outcome::Success);
/// assert_eq!(by_status.classify(&Err(())), Outcome::Retryable);
/// ```
pub trait Classifier<T, E> {
    /// Classifies one attempt's result.
    fn classify(&self, result: &Result<T, E>) -> Outcome;

    /// Whether a failed result is a [`Refusal`](crate::admission::Refusal) from further down
    /// (a breaker, a throttle or a deadline check between the retrier and the network): the
    /// attempt was then never sent, so a retrier stops at once with the refusal's stop reason,
    /// records nothing in its budget or gate, and does not count the attempt. Asked only
    /// for results [`classify`](Classifier::classify) calls failures. The default: never.
    fn refusal(&self, result: &Result<T, E>) -> Option<crate::admission::Refusal> {
        let _ = result;
        None
    }

    /// What the result says about the downstream's *health*, for the circuit breaker a
    /// retrier's gate records into. It differs from [`classify`](Classifier::classify) where
    /// the result carries a signal for retriers only (an HTTP response marked
    /// `X-Retry-Exhausted: true` is a failure of the downstream all the same). The default:
    /// the same as `classify`.
    fn health(&self, result: &Result<T, E>) -> Outcome {
        self.classify(result)
    }
}

impl<T, E, F> Classifier<T, E> for F
where
    F: Fn(&Result<T, E>) -> Outcome,
{
    fn classify(&self, result: &Result<T, E>) -> Outcome {
        self(result)
    }
}

/// Errors that know their own class.
pub trait Classify {
    /// What this error means for retrying.
    fn classify(&self) -> Outcome;
}

/// An [`io::Error`] does not say whether the request was written before it happened, so this
/// assumes it was: a lost connection or a timeout is [`Outcome::InDoubt`], never
/// [`Outcome::Retryable`] (a refused connection is still retryable: nothing was sent). When you know the request was not sent (say, the error came from
/// `connect`), call [`classify_io_error`] with `request_sent: false` instead.
impl Classify for io::Error {
    fn classify(&self) -> Outcome {
        classify_io_error(self.kind(), true)
    }
}

/// A classifier for `Result<T, E>` where `E:` [`Classify`]: `Ok` is [`Outcome::Success`],
/// `Err(e)` is `e.classify()`.
///
/// ```
/// use std::io;
/// use stormguard::classify::{ByErrorClass, Classifier, Outcome};
///
/// let reset: Result<(), io::Error> = Err(io::ErrorKind::ConnectionReset.into());
/// assert_eq!(ByErrorClass.classify(&reset), Outcome::InDoubt);
/// assert_eq!(ByErrorClass.classify(&Ok::<(), io::Error>(())), Outcome::Success);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByErrorClass;

impl<T, E: Classify> Classifier<T, E> for ByErrorClass {
    fn classify(&self, result: &Result<T, E>) -> Outcome {
        match result {
            Ok(_) => Outcome::Success,
            Err(e) => e.classify(),
        }
    }
}
