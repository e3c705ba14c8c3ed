//! What an injected failure looks like to the caller.

use std::io;
use std::time::Duration;

use crate::classify::{Classify, Outcome, classify_http_status, classify_io_error};

/// A failure injected instead of calling the downstream.
///
/// It is an error value (so an operation's error type can carry it: implement
/// `From<Abort>`), and it classifies itself exactly as the real failure would
/// ([`Classify`]): a 503 is [`Outcome::Retryable`], a 503 with `retry_after` is
/// [`Outcome::Overloaded`], a 404 is [`Outcome::NeverRetry`], and a reset is
/// [`Outcome::InDoubt`] — the caller of a real connection cannot tell whether the request
/// was written before the reset, so neither can the caller of an injected one.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::{Classify, Outcome};
/// use stormguard::fault::Abort;
///
/// assert_eq!(Abort::Reset.classify(), Outcome::InDoubt);
/// let shed = Abort::Status { status: 503, retry_after: Some(Duration::from_secs(1)) };
/// assert!(matches!(shed.classify(), Outcome::Overloaded { .. }));
/// let io: std::io::Error = Abort::Reset.into();
/// assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Abort {
    /// Answer with this HTTP status (400..=599), and a `Retry-After` when `retry_after` is set.
    #[error("injected fault: HTTP status {status}")]
    Status {
        /// The status code.
        status: u16,
        /// The `Retry-After` to send with it, if any.
        retry_after: Option<Duration>,
    },
    /// Fail as if the connection had been reset ([`io::ErrorKind::ConnectionReset`]).
    #[error("injected fault: connection reset")]
    Reset,
}

impl Classify for Abort {
    fn classify(&self) -> Outcome {
        match *self {
            Abort::Status {
                status,
                retry_after,
            } => classify_http_status(status, retry_after),
            Abort::Reset => classify_io_error(io::ErrorKind::ConnectionReset, true),
        }
    }
}

/// A reset becomes [`io::ErrorKind::ConnectionReset`]; a status becomes
/// [`io::ErrorKind::Other`]. Either way the [`Abort`] is the error's inner value
/// (`get_ref().and_then(|e| e.downcast_ref::<Abort>())`). An `io::Error` classifies by its
/// kind, so a status converted this way classifies as [`Outcome::NeverRetry`]: keep the
/// `Abort` itself where the status matters.
impl From<Abort> for io::Error {
    fn from(abort: Abort) -> io::Error {
        let kind = match abort {
            Abort::Reset => io::ErrorKind::ConnectionReset,
            Abort::Status { .. } => io::ErrorKind::Other,
        };
        io::Error::new(kind, abort)
    }
}
