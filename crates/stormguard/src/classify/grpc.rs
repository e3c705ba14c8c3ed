//! gRPC status codes, retryable-code sets and server pushback (gRPC proposal A6).

use std::fmt;
use std::time::Duration;

use super::Outcome;
use super::http::parse_decimal;

/// gRPC status codes (`0..=16`), with names as in the gRPC spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum GrpcCode {
    /// `OK`: not an error.
    Ok = 0,
    /// `CANCELLED`: the operation was cancelled, typically by the caller.
    Cancelled = 1,
    /// `UNKNOWN`: an error without more specific information.
    Unknown = 2,
    /// `INVALID_ARGUMENT`: the client specified an invalid argument.
    InvalidArgument = 3,
    /// `DEADLINE_EXCEEDED`: the deadline expired before the operation could complete.
    DeadlineExceeded = 4,
    /// `NOT_FOUND`: a requested entity was not found.
    NotFound = 5,
    /// `ALREADY_EXISTS`: the entity the client tried to create already exists.
    AlreadyExists = 6,
    /// `PERMISSION_DENIED`: the caller may not execute the operation.
    PermissionDenied = 7,
    /// `RESOURCE_EXHAUSTED`: a resource (quota, capacity) has been exhausted.
    ResourceExhausted = 8,
    /// `FAILED_PRECONDITION`: the system is not in a state the operation requires.
    FailedPrecondition = 9,
    /// `ABORTED`: the operation was aborted, typically by a concurrency conflict.
    Aborted = 10,
    /// `OUT_OF_RANGE`: the operation was attempted past the valid range.
    OutOfRange = 11,
    /// `UNIMPLEMENTED`: the operation is not implemented or supported.
    Unimplemented = 12,
    /// `INTERNAL`: an internal invariant was broken.
    Internal = 13,
    /// `UNAVAILABLE`: the service is currently unavailable; usually transient.
    Unavailable = 14,
    /// `DATA_LOSS`: unrecoverable data loss or corruption.
    DataLoss = 15,
    /// `UNAUTHENTICATED`: the request lacks valid authentication credentials.
    Unauthenticated = 16,
}

/// Why a `grpc-status` header value was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrpcStatusError {
    /// The value is empty.
    #[error("grpc-status is empty")]
    Empty,
    /// The value contains something other than ASCII digits.
    #[error("grpc-status is not an ASCII decimal integer")]
    NotAnInteger,
    /// The value is an integer, but not a status code this crate knows (`0..=16`).
    #[error("grpc-status is not a known status code (0..=16)")]
    OutOfRange,
}

impl GrpcCode {
    /// Every code, in numeric order: `GrpcCode::ALL[n]` has the value `n`.
    pub const ALL: [GrpcCode; 17] = [
        GrpcCode::Ok,
        GrpcCode::Cancelled,
        GrpcCode::Unknown,
        GrpcCode::InvalidArgument,
        GrpcCode::DeadlineExceeded,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::PermissionDenied,
        GrpcCode::ResourceExhausted,
        GrpcCode::FailedPrecondition,
        GrpcCode::Aborted,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
        GrpcCode::Unauthenticated,
    ];

    /// The code with this numeric value, or `None` outside `0..=16`.
    ///
    /// ```
    /// use stormguard::classify::GrpcCode;
    /// assert_eq!(GrpcCode::from_i32(14), Some(GrpcCode::Unavailable));
    /// assert_eq!(GrpcCode::from_i32(17), None);
    /// ```
    pub fn from_i32(code: i32) -> Option<GrpcCode> {
        usize::try_from(code)
            .ok()
            .and_then(|i| GrpcCode::ALL.get(i))
            .copied()
    }

    /// Parses a `grpc-status` header value: ASCII decimal digits, as the gRPC HTTP/2 protocol
    /// specifies. Leading zeros are accepted; signs and whitespace are not.
    ///
    /// ```
    /// use stormguard::classify::{GrpcCode, GrpcStatusError};
    /// assert_eq!(GrpcCode::parse_header(b"8"), Ok(GrpcCode::ResourceExhausted));
    /// assert_eq!(GrpcCode::parse_header(b"99"), Err(GrpcStatusError::OutOfRange));
    /// ```
    ///
    /// # Errors
    ///
    /// A [`GrpcStatusError`] naming what is wrong with the value.
    pub fn parse_header(v: &[u8]) -> Result<GrpcCode, GrpcStatusError> {
        if v.is_empty() {
            return Err(GrpcStatusError::Empty);
        }
        if !v.iter().all(u8::is_ascii_digit) {
            return Err(GrpcStatusError::NotAnInteger);
        }
        parse_decimal(v)
            .and_then(|n| usize::try_from(n).ok())
            .and_then(|i| GrpcCode::ALL.get(i))
            .copied()
            .ok_or(GrpcStatusError::OutOfRange)
    }

    /// The code's name in the gRPC spec, such as `"UNAVAILABLE"`.
    pub const fn name(self) -> &'static str {
        match self {
            GrpcCode::Ok => "OK",
            GrpcCode::Cancelled => "CANCELLED",
            GrpcCode::Unknown => "UNKNOWN",
            GrpcCode::InvalidArgument => "INVALID_ARGUMENT",
            GrpcCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            GrpcCode::NotFound => "NOT_FOUND",
            GrpcCode::AlreadyExists => "ALREADY_EXISTS",
            GrpcCode::PermissionDenied => "PERMISSION_DENIED",
            GrpcCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GrpcCode::FailedPrecondition => "FAILED_PRECONDITION",
            GrpcCode::Aborted => "ABORTED",
            GrpcCode::OutOfRange => "OUT_OF_RANGE",
            GrpcCode::Unimplemented => "UNIMPLEMENTED",
            GrpcCode::Internal => "INTERNAL",
            GrpcCode::Unavailable => "UNAVAILABLE",
            GrpcCode::DataLoss => "DATA_LOSS",
            GrpcCode::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The code named `name`, case-insensitively, for policy files. Because gRPC A6
    /// `retryableStatusCodes` may list codes by name or by number, a decimal number such as
    /// `"14"` is accepted too.
    ///
    /// ```
    /// use stormguard::classify::GrpcCode;
    /// assert_eq!(GrpcCode::from_name("unavailable"), Some(GrpcCode::Unavailable));
    /// assert_eq!(GrpcCode::from_name("14"), Some(GrpcCode::Unavailable));
    /// assert_eq!(GrpcCode::from_name("SLOW"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<GrpcCode> {
        GrpcCode::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(name))
            .or_else(|| GrpcCode::parse_header(name.as_bytes()).ok())
    }

    /// The bit that stands for this code in a [`GrpcCodeSet`].
    const fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// Shows the spec name, such as `UNAVAILABLE`.
impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The set of gRPC codes a policy retries (gRPC A6 `retryableStatusCodes`).
///
/// A bitset, `Copy` and buildable in `const` context:
///
/// ```
/// use stormguard::classify::{GrpcCode, GrpcCodeSet};
///
/// const RETRY: GrpcCodeSet = GrpcCodeSet::of(&[GrpcCode::Unavailable, GrpcCode::Aborted]);
/// assert!(RETRY.contains(GrpcCode::Aborted));
/// assert!(!RETRY.contains(GrpcCode::Internal));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GrpcCodeSet(u32);

impl GrpcCodeSet {
    /// The empty set: retry no status code.
    pub const EMPTY: GrpcCodeSet = GrpcCodeSet(0);

    /// gRPC A6's usual choice, `{UNAVAILABLE}`.
    pub const A6_DEFAULT: GrpcCodeSet = GrpcCodeSet::EMPTY.with(GrpcCode::Unavailable);

    /// The set of these codes.
    pub const fn of(codes: &[GrpcCode]) -> GrpcCodeSet {
        let mut set = GrpcCodeSet::EMPTY;
        let mut i = 0;
        while i < codes.len() {
            set = set.with(codes[i]);
            i += 1;
        }
        set
    }

    /// This set plus `code`.
    pub const fn with(self, code: GrpcCode) -> GrpcCodeSet {
        GrpcCodeSet(self.0 | code.bit())
    }

    /// Whether `code` is in the set.
    pub const fn contains(self, code: GrpcCode) -> bool {
        self.0 & code.bit() != 0
    }
}

impl FromIterator<GrpcCode> for GrpcCodeSet {
    fn from_iter<I: IntoIterator<Item = GrpcCode>>(iter: I) -> GrpcCodeSet {
        iter.into_iter().fold(GrpcCodeSet::EMPTY, GrpcCodeSet::with)
    }
}

/// What a `grpc-retry-pushback-ms` header asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushback {
    /// Retry, but not sooner than this.
    RetryAfter(Duration),
    /// Do not retry at all.
    DoNotRetry,
}

/// Parses a `grpc-retry-pushback-ms` header value (gRPC A6).
///
/// A valid value is a non-negative decimal integer of milliseconds (ASCII digits only, up to
/// `u64::MAX`). Anything else (negative, empty, signed, fractional, whitespace, overflow)
/// means the server asked us not to retry, as A6 specifies.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::{parse_grpc_pushback, Pushback};
///
/// assert_eq!(parse_grpc_pushback(b"1500"), Pushback::RetryAfter(Duration::from_millis(1500)));
/// assert_eq!(parse_grpc_pushback(b"-1"), Pushback::DoNotRetry);
/// assert_eq!(parse_grpc_pushback(b"soon"), Pushback::DoNotRetry);
/// ```
pub fn parse_grpc_pushback(v: &[u8]) -> Pushback {
    match parse_decimal(v) {
        Some(ms) => Pushback::RetryAfter(Duration::from_millis(ms)),
        None => Pushback::DoNotRetry,
    }
}

/// Classifies a gRPC status by the rules of gRPC A6.
///
/// - `OK` is [`Outcome::Success`], whatever else the response says.
/// - With a `grpc-retry-pushback-ms` value (`pushback`, the raw header bytes):
///   - a valid delay makes the code retryable after that delay, [`Outcome::Overloaded`] with
///     `retry_after: Some(delay)`, if the code is in `retryable` or is `RESOURCE_EXHAUSTED`
///     (which is the server asking for a pause by definition); any other code is
///     [`Outcome::NeverRetry`];
///   - a negative or malformed value means "do not retry": [`Outcome::NeverRetry`].
/// - Without pushback, a code in `retryable` is [`Outcome::Retryable`], except
///   `RESOURCE_EXHAUSTED`, which is [`Outcome::Overloaded`] with no delay; a code not in
///   `retryable` is [`Outcome::NeverRetry`].
///
/// `DEADLINE_EXCEEDED` is not special: A6 retries exactly the configured codes, so it is
/// [`Outcome::NeverRetry`] unless `retryable` contains it. (It is not [`Outcome::InDoubt`],
/// which would let the retrier retry idempotent calls that the policy did not ask for.)
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::{classify_grpc, GrpcCode, GrpcCodeSet, Outcome};
///
/// let set = GrpcCodeSet::A6_DEFAULT;
/// assert_eq!(classify_grpc(GrpcCode::Unavailable, set, None), Outcome::Retryable);
/// assert_eq!(classify_grpc(GrpcCode::Unavailable, set, Some(b"-1")), Outcome::NeverRetry);
/// assert_eq!(classify_grpc(GrpcCode::DeadlineExceeded, set, None), Outcome::NeverRetry);
/// assert_eq!(
///     classify_grpc(GrpcCode::ResourceExhausted, set, Some(b"100")),
///     Outcome::Overloaded { retry_after: Some(Duration::from_millis(100)) },
/// );
/// ```
pub fn classify_grpc(code: GrpcCode, retryable: GrpcCodeSet, pushback: Option<&[u8]>) -> Outcome {
    if code == GrpcCode::Ok {
        return Outcome::Success;
    }
    let in_set = retryable.contains(code);
    match pushback.map(parse_grpc_pushback) {
        Some(Pushback::DoNotRetry) => Outcome::NeverRetry,
        Some(Pushback::RetryAfter(delay)) if in_set || code == GrpcCode::ResourceExhausted => {
            Outcome::Overloaded {
                retry_after: Some(delay),
            }
        }
        Some(Pushback::RetryAfter(_)) => Outcome::NeverRetry,
        None if !in_set => Outcome::NeverRetry,
        None if code == GrpcCode::ResourceExhausted => Outcome::Overloaded { retry_after: None },
        None => Outcome::Retryable,
    }
}
