//! HTTP status codes and the `Retry-After` header.

use std::time::{Duration, SystemTime};

use super::Outcome;

/// Classifies an HTTP response status.
///
/// - `100..=399` is [`Outcome::Success`]: informational responses and redirects are not
///   failures of the attempt; following a redirect is the HTTP client's job.
/// - 408 Request Timeout and 425 Too Early are [`Outcome::Retryable`]: the server says it
///   did not process the request.
/// - 429 Too Many Requests is [`Outcome::Overloaded`], carrying `retry_after`.
/// - 502 and 504 are [`Outcome::Retryable`].
/// - 503 is [`Outcome::Overloaded`] when the response carried a `Retry-After` (the server
///   asked for a pause), and [`Outcome::Retryable`] otherwise.
/// - 409 Conflict with a `Retry-After` is [`Outcome::Overloaded`]: "not now, come back then"
///   — the answer of an idempotency server (the IETF `Idempotency-Key` draft) to a duplicate
///   of a request it is still processing, whose stored result a retry after the pause will
///   get. A 409 without one is a conflict retrying cannot fix.
/// - Every other 4xx and 5xx is [`Outcome::NeverRetry`]. That includes 500 and 501: an
///   internal error that the server did not flag as temporary is a deterministic bug, and
///   retrying it only multiplies the load on a server that is already failing.
/// - A status outside `100..=599` (including `600..=999`, which no RFC defines) is
///   [`Outcome::NeverRetry`]: a response we cannot interpret is not evidence that a retry
///   would help.
///
/// `retry_after` is the parsed `Retry-After` header (see [`parse_retry_after`]); it only
/// changes the outcome of 409, 429 and 503 and is ignored for every other status.
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::{classify_http_status, Outcome};
///
/// assert_eq!(classify_http_status(204, None), Outcome::Success);
/// assert_eq!(classify_http_status(500, None), Outcome::NeverRetry);
/// assert_eq!(classify_http_status(503, None), Outcome::Retryable);
/// let wait = Some(Duration::from_secs(5));
/// assert_eq!(classify_http_status(503, wait), Outcome::Overloaded { retry_after: wait });
/// assert_eq!(classify_http_status(409, None), Outcome::NeverRetry);
/// assert_eq!(classify_http_status(409, wait), Outcome::Overloaded { retry_after: wait });
/// ```
pub fn classify_http_status(status: u16, retry_after: Option<Duration>) -> Outcome {
    match status {
        100..=399 => Outcome::Success,
        408 | 425 | 502 | 504 => Outcome::Retryable,
        429 => Outcome::Overloaded { retry_after },
        409 | 503 if retry_after.is_some() => Outcome::Overloaded { retry_after },
        503 => Outcome::Retryable,
        _ => Outcome::NeverRetry,
    }
}

/// The response header by which a hop says it already retried and gave up
/// (`X-Retry-Exhausted: true`): the caller must not retry again, or every layer of a call
/// chain would multiply the load.
pub const RETRY_EXHAUSTED: &str = "x-retry-exhausted";

/// Classifies a response like [`classify_http_status`], and as [`Outcome::NeverRetry`] when
/// it failed and its sender says it already retried (`already_retried`: the response carried
/// [`RETRY_EXHAUSTED`] or a Finagle-style non-retryable nack). Only one layer of a call chain
/// retries.
///
/// ```
/// use stormguard::classify::{classify_http_response, Outcome};
///
/// assert_eq!(classify_http_response(503, None, false), Outcome::Retryable);
/// assert_eq!(classify_http_response(503, None, true), Outcome::NeverRetry);
/// assert_eq!(classify_http_response(200, None, true), Outcome::Success);
/// ```
pub fn classify_http_response(
    status: u16,
    retry_after: Option<Duration>,
    already_retried: bool,
) -> Outcome {
    match classify_http_status(status, retry_after) {
        outcome if already_retried && outcome.is_failure() => Outcome::NeverRetry,
        outcome => outcome,
    }
}

/// Why a `Retry-After` value was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryAfterError {
    /// The value is empty.
    #[error("Retry-After is empty")]
    Empty,
    /// The value contains a byte outside ASCII.
    #[error("Retry-After contains a non-ASCII byte")]
    NonAscii,
    /// The value starts or ends with whitespace (an HTTP parser strips it; a value that still
    /// carries it did not come from one).
    #[error("Retry-After has leading or trailing whitespace")]
    Whitespace,
    /// The value is a negative number; delay-seconds is a non-negative integer.
    #[error("Retry-After is negative")]
    Negative,
    /// The value is a decimal fraction; delay-seconds is a whole number of seconds.
    #[error("Retry-After is fractional; delay-seconds must be a whole number")]
    Fractional,
    /// The value starts like a number but is not one (`"12abc"`, `"+5"`).
    #[error("Retry-After is not an integer")]
    NotAnInteger,
    /// The value is an integer too large to be a number of seconds (more than `u64::MAX`).
    #[error("Retry-After is too large")]
    Overflow,
    /// The value is neither delay-seconds nor an HTTP-date.
    #[error("Retry-After is neither delay-seconds nor an HTTP-date")]
    BadDate,
}

/// Parses a `Retry-After` header value (RFC 9110 §10.2.3) into a delay from `now`.
///
/// The value is either delay-seconds (`1*DIGIT`) or an HTTP-date in any of the three formats
/// RFC 9110 asks recipients to accept. A date in the past yields [`Duration::ZERO`]. Nothing
/// is capped here: the retrier weighs the delay against its deadline.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use stormguard::classify::{parse_retry_after, RetryAfterError};
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_450);
/// assert_eq!(parse_retry_after(b"120", now), Ok(Duration::from_secs(120)));
/// assert_eq!(
///     parse_retry_after(b"Wed, 21 Oct 2015 07:28:00 GMT", now),
///     Ok(Duration::from_secs(30)),
/// );
/// assert_eq!(parse_retry_after(b"1.5", now), Err(RetryAfterError::Fractional));
/// ```
///
/// # Errors
///
/// A [`RetryAfterError`] naming what is wrong with the value.
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Result<Duration, RetryAfterError> {
    let (Some(first), Some(last)) = (value.first(), value.last()) else {
        return Err(RetryAfterError::Empty);
    };
    if !value.is_ascii() {
        return Err(RetryAfterError::NonAscii);
    }
    if first.is_ascii_whitespace() || last.is_ascii_whitespace() {
        return Err(RetryAfterError::Whitespace);
    }
    if value.iter().all(u8::is_ascii_digit) {
        return parse_decimal(value)
            .map(Duration::from_secs)
            .ok_or(RetryAfterError::Overflow);
    }
    if first.is_ascii_digit() || matches!(first, b'-' | b'+' | b'.') {
        return Err(number_error(value));
    }
    let text = std::str::from_utf8(value).map_err(|_| RetryAfterError::NonAscii)?;
    let date = httpdate::parse_http_date(text).map_err(|_| RetryAfterError::BadDate)?;
    Ok(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Names the problem with a value that starts like a number but is not delay-seconds.
fn number_error(value: &[u8]) -> RetryAfterError {
    let (negative, body) = match value.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, value),
    };
    let digits = body.iter().filter(|b| b.is_ascii_digit()).count();
    let dots = body.iter().filter(|&&b| b == b'.').count();
    let numeric = digits > 0 && dots <= 1 && digits + dots == body.len();
    match (negative, numeric, dots) {
        (true, true, _) => RetryAfterError::Negative,
        (false, true, 1) => RetryAfterError::Fractional,
        _ => RetryAfterError::NotAnInteger,
    }
}

/// Parses ASCII digits as a `u64`; `None` on an empty input, a non-digit, or overflow.
pub(super) fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        acc.checked_mul(10)?.checked_add(u64::from(digit))
    })
}
