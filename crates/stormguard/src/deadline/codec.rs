//! Deadline headers: parsing and encoding the ways a deadline crosses the wire.
//!
//! Headers come from other processes, so every parser here treats its input as hostile: it
//! checks every byte, bounds the number of digits before doing arithmetic, and reports what
//! was wrong as a [`HeaderError`] naming the header and the rule, so a bad value from one
//! client shows up in logs as a clear reason instead of a silently ignored deadline (or a
//! panic).
//!
//! | Header | Meaning | Format |
//! |---|---|---|
//! | [`GRPC_TIMEOUT`] | relative | 1–8 ASCII digits + unit `H` `M` `S` `m` `u` `n` |
//! | [`CONNECT_TIMEOUT_MS`] | relative | 1–10 ASCII digits, milliseconds |
//! | [`ENVOY_EXPECTED_RQ_TIMEOUT_MS`] | relative | 1–10 ASCII digits, milliseconds |
//! | [`REQUEST_DEADLINE`] | absolute | 1–20 ASCII digits, Unix epoch milliseconds |
//!
//! # Whitespace and signs
//!
//! HTTP implementations (hyper among them) strip the optional whitespace around a field value
//! before handing it over, so the parsers accept none at all: leading, trailing or inner
//! whitespace is rejected with [`HeaderErrorKind::Whitespace`]. A leading `+` or `-` is
//! rejected with [`HeaderErrorKind::Sign`]: none of these formats has a sign.
//!
//! # Clock skew
//!
//! Relative timeouts ignore the time the request spent in flight but need no agreement between
//! clocks. The absolute `X-Request-Deadline` counts time in flight but is only as good as the
//! agreement between the sender's wall clock and the receiver's: a receiver whose clock runs
//! ahead sees less time left than the sender meant, one behind sees more. A deadline in the
//! past parses fine; it simply means the request has already expired (see
//! [`Deadline::from_epoch_millis`](super::Deadline::from_epoch_millis)).

use std::fmt;
use std::time::{Duration, SystemTime};

/// The gRPC timeout header, `grpc-timeout`.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";
/// The Connect protocol's timeout header, `connect-timeout-ms`.
pub const CONNECT_TIMEOUT_MS: &str = "connect-timeout-ms";
/// The timeout Envoy tells the upstream it will wait, `x-envoy-expected-rq-timeout-ms`.
pub const ENVOY_EXPECTED_RQ_TIMEOUT_MS: &str = "x-envoy-expected-rq-timeout-ms";
/// The absolute deadline header, `x-request-deadline`, in Unix epoch milliseconds.
pub const REQUEST_DEADLINE: &str = "x-request-deadline";

/// Most digits in a `grpc-timeout` value.
const GRPC_MAX_DIGITS: usize = 8;
/// Largest `grpc-timeout` value, `99999999`.
const GRPC_MAX_VALUE: u64 = 99_999_999;
/// Most digits in a millisecond timeout header.
const MILLIS_MAX_DIGITS: usize = 10;
/// Most digits in an epoch-milliseconds deadline (all of `u64`).
const EPOCH_MAX_DIGITS: usize = 20;

/// A deadline header value that could not be parsed: which header, and which rule it broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {header} value: {kind}")]
pub struct HeaderError {
    /// The header's name, e.g. [`GRPC_TIMEOUT`].
    pub header: &'static str,
    /// The rule the value broke.
    pub kind: HeaderErrorKind,
}

/// The rule a deadline header value broke. Positions are byte offsets into the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderErrorKind {
    /// The value is empty.
    #[error("the value is empty")]
    Empty,
    /// The value has no digits before its unit.
    #[error("there are no digits before the unit")]
    MissingDigits,
    /// The value has more digits than the format allows.
    #[error("{found} digits, at most {max} allowed")]
    TooManyDigits {
        /// Most digits the format allows.
        max: usize,
        /// Digits found.
        found: usize,
    },
    /// An ASCII byte that is not a digit where a digit belongs.
    #[error("byte {byte:#04x} ({}) at position {position} is not a digit", char::from(*byte))]
    NotADigit {
        /// Where it is.
        position: usize,
        /// The byte.
        byte: u8,
    },
    /// A non-ASCII byte; all these formats are plain ASCII.
    #[error("non-ASCII byte {byte:#04x} at position {position}")]
    NonAscii {
        /// Where it is.
        position: usize,
        /// The byte.
        byte: u8,
    },
    /// Whitespace; values must be trimmed and may not contain any.
    #[error("whitespace at position {position}; values may not contain whitespace")]
    Whitespace {
        /// Where it is.
        position: usize,
    },
    /// A leading `+` or `-`; these formats are unsigned.
    #[error("leading '{}': the value must be unsigned", char::from(*sign))]
    Sign {
        /// `b'+'` or `b'-'`.
        sign: u8,
    },
    /// A `grpc-timeout` value made only of digits.
    #[error("missing unit: the value must end in one of H M S m u n")]
    MissingUnit,
    /// A `grpc-timeout` unit other than `H` `M` `S` `m` `u` `n`.
    #[error("unknown unit '{}': expected one of H M S m u n", char::from(*unit))]
    BadUnit {
        /// The unit byte found.
        unit: u8,
    },
    /// The value is too large to represent.
    #[error("the value is too large to represent")]
    Overflow,
}

/// Why `byte` at `position` is not acceptable as a digit.
fn reject(position: usize, byte: u8) -> HeaderErrorKind {
    match byte {
        b'+' | b'-' if position == 0 => HeaderErrorKind::Sign { sign: byte },
        b if b >= 0x80 => HeaderErrorKind::NonAscii { position, byte },
        b if b.is_ascii_whitespace() || b == 0x0b => HeaderErrorKind::Whitespace { position },
        _ => HeaderErrorKind::NotADigit { position, byte },
    }
}

/// The first non-digit in `digits` as an error, if any.
fn check_digits(digits: &[u8]) -> Result<(), HeaderErrorKind> {
    match digits.iter().position(|b| !b.is_ascii_digit()) {
        Some(i) => Err(reject(i, digits[i])),
        None => Ok(()),
    }
}

/// Parses 1..=`max` ASCII digits as a `u64`.
fn parse_digits(digits: &[u8], max: usize) -> Result<u64, HeaderErrorKind> {
    if digits.is_empty() {
        return Err(HeaderErrorKind::Empty);
    }
    check_digits(digits)?;
    if digits.len() > max {
        return Err(HeaderErrorKind::TooManyDigits {
            max,
            found: digits.len(),
        });
    }
    digits.iter().try_fold(0u64, |n, &b| {
        n.checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or(HeaderErrorKind::Overflow)
    })
}

/// Parses a `grpc-timeout` value: 1–8 ASCII digits followed by a unit, `H` (hours), `M`
/// (minutes), `S` (seconds), `m` (milliseconds), `u` (microseconds) or `n` (nanoseconds).
///
/// ```
/// use std::time::Duration;
/// use stormguard::deadline::{parse_grpc_timeout, HeaderErrorKind};
///
/// assert_eq!(parse_grpc_timeout(b"100m"), Ok(Duration::from_millis(100)));
/// assert_eq!(parse_grpc_timeout(b"1H"), Ok(Duration::from_secs(3600)));
/// let err = parse_grpc_timeout(b"10x").unwrap_err();
/// assert_eq!(err.kind, HeaderErrorKind::BadUnit { unit: b'x' });
/// assert_eq!(err.to_string(), "invalid grpc-timeout value: unknown unit 'x': expected one of H M S m u n");
/// ```
pub fn parse_grpc_timeout(value: &[u8]) -> Result<Duration, HeaderError> {
    parse_grpc(value).map_err(|kind| HeaderError {
        header: GRPC_TIMEOUT,
        kind,
    })
}

fn parse_grpc(value: &[u8]) -> Result<Duration, HeaderErrorKind> {
    let Some((&unit, digits)) = value.split_last() else {
        return Err(HeaderErrorKind::Empty);
    };
    // Bytes never valid anywhere (whitespace, non-ASCII) are reported first, so that "1S "
    // reads as trailing whitespace rather than as a bad digit 'S'.
    if let Some(i) = value
        .iter()
        .position(|&b| b >= 0x80 || b.is_ascii_whitespace() || b == 0x0b)
    {
        return Err(reject(i, value[i]));
    }
    if unit.is_ascii_digit() {
        check_digits(value)?;
        return Err(HeaderErrorKind::MissingUnit);
    }
    check_digits(digits)?;
    let nanos_per_unit: u64 = match unit {
        b'H' => 3_600_000_000_000,
        b'M' => 60_000_000_000,
        b'S' => 1_000_000_000,
        b'm' => 1_000_000,
        b'u' => 1_000,
        b'n' => 1,
        _ => {
            return Err(match reject(digits.len(), unit) {
                HeaderErrorKind::NotADigit { byte, .. } => HeaderErrorKind::BadUnit { unit: byte },
                other => other,
            });
        }
    };
    if digits.is_empty() {
        return Err(HeaderErrorKind::MissingDigits);
    }
    let n = parse_digits(digits, GRPC_MAX_DIGITS)?;
    // Cannot overflow: 99999999 hours is about 3.6e20 ns, which fits in u128 and in Duration.
    let nanos = u128::from(n) * u128::from(nanos_per_unit);
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| HeaderErrorKind::Overflow)?;
    let subsec = u32::try_from(nanos % 1_000_000_000).map_err(|_| HeaderErrorKind::Overflow)?;
    Ok(Duration::new(secs, subsec))
}

/// An encoded `grpc-timeout` value, held inline (no allocation): 1–8 digits and a unit.
///
/// Use [`GrpcTimeout::as_str`] or its [`Display`](fmt::Display) form as the header value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrpcTimeout {
    buf: [u8; GRPC_MAX_DIGITS + 1],
    len: u8,
}

impl GrpcTimeout {
    /// The header value, e.g. `"100m"`.
    pub fn as_str(&self) -> &str {
        let bytes = self.buf.get(..usize::from(self.len)).unwrap_or(b"0n");
        // Always ASCII digits and a unit letter, written by `encode_grpc_timeout`.
        std::str::from_utf8(bytes).unwrap_or("0n")
    }
}

impl fmt::Display for GrpcTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for GrpcTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("GrpcTimeout").field(&self.as_str()).finish()
    }
}

impl AsRef<str> for GrpcTimeout {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// Encodes `timeout` as a `grpc-timeout` value, the way grpc-go does.
///
/// The unit is the finest of `n` `u` `m` `S` `M` `H` in which the timeout, rounded **up**,
/// fits in 8 digits; rounding up means the callee never gets less time than the caller meant
/// (at most one unit more, which is under 0.002 % once a coarser unit is needed). A zero
/// timeout encodes as `"0n"`, which the callee treats as already expired. Timeouts beyond
/// `99999999H` (about 11,400 years) are clamped to `"99999999H"`.
///
/// ```
/// use std::time::Duration;
/// use stormguard::deadline::encode_grpc_timeout;
///
/// assert_eq!(encode_grpc_timeout(Duration::from_millis(900)).as_str(), "900000u");
/// assert_eq!(encode_grpc_timeout(Duration::from_secs(3600)).as_str(), "3600000m");
/// assert_eq!(encode_grpc_timeout(Duration::ZERO).to_string(), "0n");
/// ```
pub fn encode_grpc_timeout(timeout: Duration) -> GrpcTimeout {
    const UNITS: [(u128, u8); 6] = [
        (1, b'n'),
        (1_000, b'u'),
        (1_000_000, b'm'),
        (1_000_000_000, b'S'),
        (60_000_000_000, b'M'),
        (3_600_000_000_000, b'H'),
    ];
    let nanos = timeout.as_nanos();
    let (value, unit) = UNITS
        .iter()
        .map(|&(per, unit)| (nanos.div_ceil(per), unit))
        .find(|&(value, _)| value <= u128::from(GRPC_MAX_VALUE))
        .unwrap_or((u128::from(GRPC_MAX_VALUE), b'H'));
    let mut value = u64::try_from(value).unwrap_or(GRPC_MAX_VALUE);

    let mut digits = [0u8; GRPC_MAX_DIGITS];
    let mut start = GRPC_MAX_DIGITS;
    loop {
        start -= 1;
        digits[start] = b'0' + u8::try_from(value % 10).unwrap_or(0);
        value /= 10;
        if value == 0 || start == 0 {
            break;
        }
    }
    let mut out = GrpcTimeout {
        buf: [0; GRPC_MAX_DIGITS + 1],
        len: 0,
    };
    let n = GRPC_MAX_DIGITS - start;
    out.buf[..n].copy_from_slice(&digits[start..]);
    out.buf[n] = unit;
    out.len = u8::try_from(n + 1).unwrap_or(0);
    out
}

/// Parses a header holding a timeout in milliseconds as 1..=`max_digits` ASCII digits; errors
/// name `header`.
///
/// ```
/// use std::time::Duration;
/// use stormguard::deadline::{parse_millis_header, HeaderErrorKind};
///
/// assert_eq!(parse_millis_header("my-timeout-ms", b"1500", 6), Ok(Duration::from_millis(1500)));
/// let err = parse_millis_header("my-timeout-ms", b"1234567", 6).unwrap_err();
/// assert_eq!(err.kind, HeaderErrorKind::TooManyDigits { max: 6, found: 7 });
/// ```
pub fn parse_millis_header(
    header: &'static str,
    value: &[u8],
    max_digits: usize,
) -> Result<Duration, HeaderError> {
    parse_digits(value, max_digits)
        .map(Duration::from_millis)
        .map_err(|kind| HeaderError { header, kind })
}

/// Parses `connect-timeout-ms` (the Connect protocol): 1–10 ASCII digits, milliseconds.
///
/// ```
/// use std::time::Duration;
/// use stormguard::deadline::parse_connect_timeout_ms;
///
/// assert_eq!(parse_connect_timeout_ms(b"250"), Ok(Duration::from_millis(250)));
/// assert!(parse_connect_timeout_ms(b"12345678901").is_err());
/// ```
pub fn parse_connect_timeout_ms(value: &[u8]) -> Result<Duration, HeaderError> {
    parse_millis_header(CONNECT_TIMEOUT_MS, value, MILLIS_MAX_DIGITS)
}

/// Parses `x-envoy-expected-rq-timeout-ms`: 1–10 ASCII digits, milliseconds.
///
/// ```
/// use std::time::Duration;
/// use stormguard::deadline::parse_envoy_expected_timeout_ms;
///
/// assert_eq!(parse_envoy_expected_timeout_ms(b"15000"), Ok(Duration::from_secs(15)));
/// ```
pub fn parse_envoy_expected_timeout_ms(value: &[u8]) -> Result<Duration, HeaderError> {
    parse_millis_header(ENVOY_EXPECTED_RQ_TIMEOUT_MS, value, MILLIS_MAX_DIGITS)
}

/// Parses `X-Request-Deadline`: an absolute time as 1–20 ASCII digits of Unix epoch
/// milliseconds.
///
/// A time in the past is valid and means the request has already expired. The value is only as
/// accurate as the agreement between the two hosts' wall clocks (see the
/// [module docs](self#clock-skew)); convert with
/// [`Deadline::from_epoch_millis`](super::Deadline::from_epoch_millis).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use stormguard::deadline::parse_request_deadline;
///
/// let at = parse_request_deadline(b"1700000000250")?;
/// assert_eq!(at, SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250));
/// # Ok::<(), stormguard::deadline::HeaderError>(())
/// ```
pub fn parse_request_deadline(value: &[u8]) -> Result<SystemTime, HeaderError> {
    let error = |kind| HeaderError {
        header: REQUEST_DEADLINE,
        kind,
    };
    let millis = parse_digits(value, EPOCH_MAX_DIGITS).map_err(error)?;
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_millis(millis))
        .ok_or(error(HeaderErrorKind::Overflow))
}

/// Encodes `at` as an `X-Request-Deadline` value in Unix epoch milliseconds, rounding up to the
/// next millisecond (the callee never gets less time than meant). Times before the epoch
/// encode as `"0"`, which is long expired.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use stormguard::deadline::encode_request_deadline;
///
/// let at = SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_250_001);
/// assert_eq!(encode_request_deadline(at), "1700000000251");
/// ```
pub fn encode_request_deadline(at: SystemTime) -> String {
    let since_epoch = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    since_epoch.as_nanos().div_ceil(1_000_000).to_string()
}

#[cfg(test)]
mod tests;
