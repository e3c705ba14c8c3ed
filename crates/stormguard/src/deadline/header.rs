//! The four deadline headers as one vocabulary: which header, how its value is read and
//! written, which one wins when a request carries several, and the wall clock the absolute one
//! needs.
//!
//! The grammar of each value lives in [`codec`](super::codec); this module names the headers
//! ([`DeadlineHeader`]), orders them ([`DeadlineHeaders`]), picks one among several on a
//! request ([`Selection`], [`read_deadline`]) and encodes a remaining time into a header value
//! without allocating ([`EncodedDeadline`]). It holds no HTTP types, so every HTTP stack (the
//! tower layers, the reqwest middleware, a proxy) reads and writes deadlines the same way.
//!
//! # Which one wins
//!
//! - [`Selection::Earliest`] (the default): every listed header present is read and the
//!   earliest deadline wins, the list order only breaking ties. A server should stop when the
//!   *first* of its callers stops waiting: if Envoy gives up after 1 s, a `grpc-timeout` of 5 s
//!   from the client behind it does not make the remaining 4 s useful.
//! - [`Selection::FirstPresent`]: the first listed header that is present *and valid* wins and
//!   later ones are not read. For deployments that trust one source over another.
//!
//! # Malformed and repeated values
//!
//! A value that does not parse is a [`DeadlineHeaderError::Malformed`]. A header that appears
//! more than once is a [`DeadlineHeaderError::Repeated`]: which of two disagreeing deadlines
//! was meant cannot be known, so the error is reported, and the *earliest* valid value among
//! the repeats still counts as that header's deadline (a caller that ignores the error gets
//! the most conservative reading, never no deadline at all). [`read_deadline`] never fails: it
//! reports every error in [`Reading::errors`] and still returns the deadline of the valid
//! headers, so the caller decides whether to ignore or reject.
//!
//! # Clock skew
//!
//! `x-request-deadline` is converted to time left by subtracting *this* host's wall-clock time
//! ([`WallClock`]), so the result is off by exactly the skew between the sender's clock and
//! this one: a receiver whose clock runs ahead sees less time left than the sender meant (and
//! may refuse the request as expired), one running behind sees more. The relative headers do
//! not depend on clocks agreeing, but do not count the time the request spent in flight. Where
//! hosts' clocks are not kept within a few milliseconds of each other (NTP), prefer the
//! relative formats, or list `x-request-deadline` last with [`Selection::FirstPresent`].

use std::fmt;
use std::time::{Duration, SystemTime};

use super::FAR_FUTURE;
use super::codec::{
    CONNECT_TIMEOUT_MS, ENVOY_EXPECTED_RQ_TIMEOUT_MS, GRPC_TIMEOUT, HeaderError, REQUEST_DEADLINE,
    encode_grpc_timeout, parse_connect_timeout_ms, parse_envoy_expected_timeout_ms,
    parse_grpc_timeout, parse_request_deadline,
};
use super::wall::WallClock;

/// Largest value of the millisecond headers: 10 digits.
const MAX_MILLIS_VALUE: u64 = 9_999_999_999;

/// One of the four headers that carry a deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeadlineHeader {
    /// `grpc-timeout`: 1–8 digits and a unit (`100m`, `5S`), relative.
    GrpcTimeout,
    /// `connect-timeout-ms`: milliseconds, relative (the Connect protocol).
    ConnectTimeoutMs,
    /// `x-envoy-expected-rq-timeout-ms`: milliseconds, relative (set by Envoy).
    EnvoyExpectedRqTimeoutMs,
    /// `x-request-deadline`: Unix epoch milliseconds, absolute (subject to clock skew).
    RequestDeadline,
}

impl DeadlineHeader {
    /// The header's name, lower case, as it appears on the wire.
    pub const fn name(self) -> &'static str {
        match self {
            DeadlineHeader::GrpcTimeout => GRPC_TIMEOUT,
            DeadlineHeader::ConnectTimeoutMs => CONNECT_TIMEOUT_MS,
            DeadlineHeader::EnvoyExpectedRqTimeoutMs => ENVOY_EXPECTED_RQ_TIMEOUT_MS,
            DeadlineHeader::RequestDeadline => REQUEST_DEADLINE,
        }
    }

    /// Whether the header carries an absolute time (and so depends on clocks agreeing).
    pub const fn is_absolute(self) -> bool {
        matches!(self, DeadlineHeader::RequestDeadline)
    }

    /// Parses one value of this header into the time left, reading `wall` only for the
    /// absolute format. An absolute deadline in the past is zero time left, not an error.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use stormguard::deadline::{DeadlineHeader, WallClock};
    ///
    /// let wall = WallClock::fixed(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000));
    /// let left = DeadlineHeader::RequestDeadline.parse(b"1000250", &wall)?;
    /// assert_eq!(left, Duration::from_millis(250));
    /// assert_eq!(DeadlineHeader::GrpcTimeout.parse(b"2S", &wall)?, Duration::from_secs(2));
    /// # Ok::<(), stormguard::deadline::HeaderError>(())
    /// ```
    pub fn parse(self, value: &[u8], wall: &WallClock) -> Result<Duration, HeaderError> {
        match self {
            DeadlineHeader::GrpcTimeout => parse_grpc_timeout(value),
            DeadlineHeader::ConnectTimeoutMs => parse_connect_timeout_ms(value),
            DeadlineHeader::EnvoyExpectedRqTimeoutMs => parse_envoy_expected_timeout_ms(value),
            DeadlineHeader::RequestDeadline => {
                let at = parse_request_deadline(value)?;
                Ok(at.duration_since(wall.now()).unwrap_or(Duration::ZERO))
            }
        }
    }

    /// Encodes `remaining` (time left now, with `wall` giving now's wall-clock time for the
    /// absolute format) as a value of this header, without allocating.
    ///
    /// The millisecond formats round down (and stop at their 10-digit maximum);
    /// `grpc-timeout` uses the finest unit that fits, rounded up by less than one unit
    /// ([`encode_grpc_timeout`]); `x-request-deadline` rounds up to the next millisecond.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::deadline::{DeadlineHeader, WallClock};
    ///
    /// let wall = WallClock::system();
    /// let left = Duration::from_micros(899_700);
    /// assert_eq!(DeadlineHeader::GrpcTimeout.encode(left, &wall).as_str(), "899700u");
    /// assert_eq!(DeadlineHeader::ConnectTimeoutMs.encode(left, &wall).as_str(), "899");
    /// ```
    pub fn encode(self, remaining: Duration, wall: &WallClock) -> EncodedDeadline {
        match self {
            DeadlineHeader::GrpcTimeout => {
                EncodedDeadline::from_ascii(encode_grpc_timeout(remaining).as_str().as_bytes())
            }
            DeadlineHeader::ConnectTimeoutMs | DeadlineHeader::EnvoyExpectedRqTimeoutMs => {
                let millis = u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX);
                EncodedDeadline::from_u64(millis.min(MAX_MILLIS_VALUE))
            }
            DeadlineHeader::RequestDeadline => {
                let now = wall.now();
                let at = now
                    .checked_add(remaining)
                    .or_else(|| now.checked_add(FAR_FUTURE))
                    .unwrap_or(now);
                let since_epoch = at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO);
                let millis = since_epoch.as_nanos().div_ceil(1_000_000);
                EncodedDeadline::from_u64(u64::try_from(millis).unwrap_or(u64::MAX))
            }
        }
    }

    /// Index into per-header arrays, in declaration order.
    const fn index(self) -> usize {
        match self {
            DeadlineHeader::GrpcTimeout => 0,
            DeadlineHeader::ConnectTimeoutMs => 1,
            DeadlineHeader::EnvoyExpectedRqTimeoutMs => 2,
            DeadlineHeader::RequestDeadline => 3,
        }
    }
}

impl fmt::Display for DeadlineHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A deadline header value, held inline: at most 20 ASCII characters (all of `u64` in
/// digits, or `grpc-timeout`'s 8 digits and a unit).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EncodedDeadline {
    buf: [u8; 20],
    len: u8,
}

impl EncodedDeadline {
    fn from_ascii(bytes: &[u8]) -> Self {
        let mut out = EncodedDeadline {
            buf: [0; 20],
            len: 0,
        };
        let n = bytes.len().min(out.buf.len());
        out.buf[..n].copy_from_slice(&bytes[..n]);
        out.len = u8::try_from(n).unwrap_or(0);
        out
    }

    fn from_u64(mut value: u64) -> Self {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + u8::try_from(value % 10).unwrap_or(0);
            value /= 10;
            if value == 0 || start == 0 {
                break;
            }
        }
        EncodedDeadline::from_ascii(&digits[start..])
    }

    /// The value's bytes (ASCII digits, and a unit letter for `grpc-timeout`).
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..usize::from(self.len)).unwrap_or(b"0")
    }

    /// The value as text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits and unit letters are ever written.
        std::str::from_utf8(self.as_bytes()).unwrap_or("0")
    }
}

impl fmt::Display for EncodedDeadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for EncodedDeadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EncodedDeadline")
            .field(&self.as_str())
            .finish()
    }
}

/// A header list that cannot be used: empty, or naming a header twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidHeaderList {
    /// The list is empty: nothing would be read or written.
    #[error("the deadline header list is empty: list at least one header")]
    Empty,
    /// A header is listed twice.
    #[error("the deadline header list names {0} twice")]
    Repeated(DeadlineHeader),
}

/// An ordered list of distinct deadline headers: which to read, in which precedence, or which
/// to write.
///
/// # Default
///
/// [`DeadlineHeaders::ALL`]: `grpc-timeout`, `connect-timeout-ms`,
/// `x-envoy-expected-rq-timeout-ms`, `x-request-deadline` — the relative formats first, because
/// they do not depend on clocks agreeing.
///
/// ```
/// use stormguard::deadline::{DeadlineHeader, DeadlineHeaders};
///
/// let headers = DeadlineHeaders::new(&[DeadlineHeader::RequestDeadline, DeadlineHeader::GrpcTimeout])?;
/// assert_eq!(headers.iter().next(), Some(DeadlineHeader::RequestDeadline));
/// assert!(DeadlineHeaders::new(&[]).is_err());
/// # Ok::<(), stormguard::deadline::InvalidHeaderList>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeadlineHeaders {
    list: [DeadlineHeader; 4],
    len: u8,
}

impl DeadlineHeaders {
    /// All four headers, relative formats first.
    pub const ALL: DeadlineHeaders = DeadlineHeaders {
        list: [
            DeadlineHeader::GrpcTimeout,
            DeadlineHeader::ConnectTimeoutMs,
            DeadlineHeader::EnvoyExpectedRqTimeoutMs,
            DeadlineHeader::RequestDeadline,
        ],
        len: 4,
    };

    /// Just one header.
    pub const fn only(header: DeadlineHeader) -> DeadlineHeaders {
        DeadlineHeaders {
            list: [header; 4],
            len: 1,
        }
    }

    /// The headers in `order`, first the most preferred. Rejects an empty list and a header
    /// listed twice.
    pub fn new(order: &[DeadlineHeader]) -> Result<DeadlineHeaders, InvalidHeaderList> {
        let Some(&first) = order.first() else {
            return Err(InvalidHeaderList::Empty);
        };
        let mut out = DeadlineHeaders {
            list: [first; 4],
            len: 0,
        };
        for &header in order {
            if out.contains(header) {
                return Err(InvalidHeaderList::Repeated(header));
            }
            // At most four distinct headers exist, so `len` stays below 4 here.
            if let Some(slot) = out.list.get_mut(usize::from(out.len)) {
                *slot = header;
                out.len += 1;
            }
        }
        Ok(out)
    }

    /// The headers, first the most preferred.
    pub fn iter(&self) -> impl Iterator<Item = DeadlineHeader> + '_ {
        self.as_slice().iter().copied()
    }

    /// Whether `header` is in the list.
    pub fn contains(&self, header: DeadlineHeader) -> bool {
        self.as_slice().contains(&header)
    }

    fn as_slice(&self) -> &[DeadlineHeader] {
        self.list.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

impl Default for DeadlineHeaders {
    fn default() -> Self {
        DeadlineHeaders::ALL
    }
}

/// How [`read_deadline`] picks among several deadline headers on one request.
///
/// # Default
///
/// [`Selection::Earliest`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Selection {
    /// Every listed header is read; the earliest deadline wins (list order breaks ties).
    #[default]
    Earliest,
    /// The first listed header that is present and valid wins; later ones are not read.
    FirstPresent,
}

/// A deadline header that was present but not cleanly usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeadlineHeaderError {
    /// The value does not parse.
    #[error("{source}")]
    Malformed {
        /// Which header.
        header: DeadlineHeader,
        /// What rule the value broke.
        source: HeaderError,
    },
    /// The header appears more than once: which of two disagreeing deadlines was meant cannot
    /// be known, so this is reported, and the earliest valid value among the repeats still
    /// counts as the header's deadline (see [`read_deadline`]).
    #[error("{header} appears {count} times; a deadline header may appear only once")]
    Repeated {
        /// Which header.
        header: DeadlineHeader,
        /// How many times it appears.
        count: usize,
    },
}

impl DeadlineHeaderError {
    /// The header the error is about.
    pub fn header(&self) -> DeadlineHeader {
        match *self {
            DeadlineHeaderError::Malformed { header, .. }
            | DeadlineHeaderError::Repeated { header, .. } => header,
        }
    }
}

/// The deadline a request announced: which header said so and how much time it leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    /// The header that supplied the deadline.
    pub header: DeadlineHeader,
    /// Time left, as of reading (zero for an absolute deadline already past).
    pub remaining: Duration,
}

/// What [`read_deadline`] saw on one request: the winning deadline, if any, and every
/// malformed or repeated header it met on the way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// The deadline chosen, if any listed header was present with a valid value.
    pub found: Option<Found>,
    errors: [Option<DeadlineHeaderError>; 4],
}

impl Reading {
    /// The malformed or repeated headers met, in list order.
    pub fn errors(&self) -> impl Iterator<Item = &DeadlineHeaderError> + '_ {
        self.errors.iter().flatten()
    }

    /// The first malformed or repeated header met, if any.
    pub fn first_error(&self) -> Option<&DeadlineHeaderError> {
        self.errors().next()
    }
}

/// Reads the deadline a request announces: `values(header)` yields every value of one header
/// on the request (as bytes, in order), `headers` says which to read in which precedence and
/// `selection` how to pick ([`Selection::Earliest`] by default: a server should stop when the
/// first of its callers stops waiting).
///
/// A value that does not parse is a [`DeadlineHeaderError::Malformed`]; a header that
/// appears more than once is a [`DeadlineHeaderError::Repeated`], and the earliest valid
/// value among the repeats still counts (a caller that ignores the error gets the most
/// conservative reading, never no deadline at all). `x-request-deadline` is converted to time
/// left with `wall`, so it is off by the skew between the sender's clock and this host's
/// (prefer the relative headers where clocks are not kept in sync). A pure function of the values and the wall-clock time; it never
/// fails and never panics, whatever the bytes. HTTP stacks wrap it over their header maps
/// (`stormguard_tower::wire::read_deadline` for `http::HeaderMap`).
///
/// ```
/// use std::time::Duration;
/// use stormguard::deadline::{DeadlineHeader, DeadlineHeaders, Selection, WallClock, read_deadline};
///
/// let request: [(&str, &[u8]); 3] = [
///     ("grpc-timeout", b"5S"),
///     ("x-envoy-expected-rq-timeout-ms", b"1000"),
///     ("connect-timeout-ms", b"soon"),
/// ];
/// let values = |h: DeadlineHeader| request.iter().filter(move |(n, _)| *n == h.name()).map(|(_, v)| *v);
/// let reading = read_deadline(DeadlineHeaders::ALL, Selection::Earliest, values, &WallClock::system());
/// let found = reading.found.expect("a deadline");
/// // Envoy gives up first, so its deadline wins.
/// assert_eq!(found.header, DeadlineHeader::EnvoyExpectedRqTimeoutMs);
/// assert_eq!(found.remaining, Duration::from_secs(1));
/// // The malformed header is reported, not fatal.
/// assert_eq!(reading.first_error().map(|e| e.header()), Some(DeadlineHeader::ConnectTimeoutMs));
/// ```
pub fn read_deadline<'v, I>(
    headers: DeadlineHeaders,
    selection: Selection,
    mut values: impl FnMut(DeadlineHeader) -> I,
    wall: &WallClock,
) -> Reading
where
    I: Iterator<Item = &'v [u8]>,
{
    let mut reading = Reading {
        found: None,
        errors: [None; 4],
    };
    for header in headers.iter() {
        let mut count = 0usize;
        let mut earliest: Option<Duration> = None;
        let mut malformed = None;
        for value in values(header) {
            count += 1;
            match header.parse(value, wall) {
                Ok(left) => earliest = Some(earliest.map_or(left, |e| e.min(left))),
                Err(source) => malformed = malformed.or(Some(source)),
            }
        }
        if count == 0 {
            continue;
        }
        let error = if count > 1 {
            Some(DeadlineHeaderError::Repeated { header, count })
        } else {
            malformed.map(|source| DeadlineHeaderError::Malformed { header, source })
        };
        if let Some(error) = error {
            if let Some(slot) = reading.errors.get_mut(header.index()) {
                *slot = Some(error);
            }
        }
        let Some(remaining) = earliest else {
            continue;
        };
        let candidate = Found { header, remaining };
        match (selection, reading.found) {
            (Selection::FirstPresent, _) => {
                reading.found = Some(candidate);
                break;
            }
            (Selection::Earliest, Some(best)) if best.remaining <= remaining => {}
            (Selection::Earliest, _) => reading.found = Some(candidate),
        }
    }
    // Errors are reported in list order.
    let mut ordered = [None; 4];
    for (slot, header) in ordered.iter_mut().zip(headers.iter()) {
        *slot = reading.errors.get(header.index()).copied().flatten();
    }
    reading.errors = ordered;
    reading
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read(pairs: &[(&str, &[u8])], selection: Selection) -> Reading {
        let values = |h: DeadlineHeader| {
            pairs
                .iter()
                .filter(move |(n, _)| *n == h.name())
                .map(|(_, v)| *v)
        };
        read_deadline(
            DeadlineHeaders::ALL,
            selection,
            values,
            &WallClock::system(),
        )
    }

    #[test]
    fn header_list_rejects_empty_and_repeats() {
        assert_eq!(DeadlineHeaders::new(&[]), Err(InvalidHeaderList::Empty));
        assert_eq!(
            DeadlineHeaders::new(&[DeadlineHeader::GrpcTimeout, DeadlineHeader::GrpcTimeout]),
            Err(InvalidHeaderList::Repeated(DeadlineHeader::GrpcTimeout))
        );
        let all = DeadlineHeaders::new(&[
            DeadlineHeader::RequestDeadline,
            DeadlineHeader::EnvoyExpectedRqTimeoutMs,
            DeadlineHeader::ConnectTimeoutMs,
            DeadlineHeader::GrpcTimeout,
        ])
        .expect("four distinct");
        assert_eq!(all.iter().count(), 4);
    }

    #[test]
    fn a_repeated_header_keeps_its_earliest_value_and_reports_the_repeat() {
        let reading = read(
            &[("grpc-timeout", b"5S"), ("grpc-timeout", b"2S")],
            Selection::Earliest,
        );
        assert_eq!(
            reading.found,
            Some(Found {
                header: DeadlineHeader::GrpcTimeout,
                remaining: Duration::from_secs(2)
            })
        );
        assert_eq!(
            reading.first_error(),
            Some(&DeadlineHeaderError::Repeated {
                header: DeadlineHeader::GrpcTimeout,
                count: 2
            })
        );
    }

    #[test]
    fn first_present_skips_malformed_and_stops_at_the_first_valid() {
        let reading = read(
            &[
                ("grpc-timeout", b"soon"),
                ("connect-timeout-ms", b"700"),
                ("x-envoy-expected-rq-timeout-ms", b"100"),
            ],
            Selection::FirstPresent,
        );
        assert_eq!(
            reading.found.map(|f| f.header),
            Some(DeadlineHeader::ConnectTimeoutMs)
        );
        assert_eq!(reading.errors().count(), 1);
    }

    #[test]
    fn absolute_deadline_uses_the_wall_clock_and_saturates() {
        let wall = WallClock::fixed(SystemTime::UNIX_EPOCH + Duration::from_secs(10));
        let h = DeadlineHeader::RequestDeadline;
        assert_eq!(h.parse(b"10500", &wall), Ok(Duration::from_millis(500)));
        assert_eq!(h.parse(b"9000", &wall), Ok(Duration::ZERO));
        assert_eq!(
            h.encode(Duration::from_millis(250), &wall).as_str(),
            "10250"
        );
        assert!(!h.encode(Duration::MAX, &wall).as_str().is_empty());
    }

    #[test]
    fn millis_encoding_caps_at_ten_digits() {
        let wall = WallClock::system();
        let huge = Duration::from_secs(u64::MAX);
        assert_eq!(
            DeadlineHeader::ConnectTimeoutMs
                .encode(huge, &wall)
                .as_str(),
            "9999999999"
        );
        assert_eq!(
            DeadlineHeader::GrpcTimeout.encode(huge, &wall).as_str(),
            "99999999H"
        );
    }

    proptest! {
        #[test]
        fn every_encoding_parses_back_to_at_most_one_unit_away(
            nanos in 0u64..=10_000_000_000_000,
            header in prop_oneof![
                Just(DeadlineHeader::GrpcTimeout),
                Just(DeadlineHeader::ConnectTimeoutMs),
                Just(DeadlineHeader::EnvoyExpectedRqTimeoutMs),
                Just(DeadlineHeader::RequestDeadline),
            ],
        ) {
            let wall = WallClock::fixed(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000));
            let left = Duration::from_nanos(nanos);
            let encoded = header.encode(left, &wall);
            let parsed = header.parse(encoded.as_bytes(), &wall).expect("our own encoding parses");
            let diff = parsed.abs_diff(left);
            // grpc-timeout rounds up by less than one unit (at most a part in 10^7 of the
            // value once a coarse unit is needed); the millisecond formats by less than 1 ms.
            let tolerance = Duration::from_millis(1).max(left / 10_000_000);
            prop_assert!(diff <= tolerance, "{header}: {left:?} -> {encoded} -> {parsed:?}");
        }

        #[test]
        fn earliest_selection_matches_a_reference_model(
            values in proptest::collection::vec((0usize..4, 0u64..100_000), 0..6),
        ) {
            let names = ["grpc-timeout", "connect-timeout-ms", "x-envoy-expected-rq-timeout-ms", "x-request-deadline"];
            let texts: Vec<(String, Vec<u8>)> = values
                .iter()
                .filter(|(h, _)| *h < 3)
                .map(|&(h, ms)| {
                    let v = if h == 0 { format!("{ms}m") } else { ms.to_string() };
                    (names[h].to_owned(), v.into_bytes())
                })
                .collect();
            let pairs: Vec<(&str, &[u8])> = texts.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
            let reading = read(&pairs, Selection::Earliest);
            let model = values.iter().filter(|(h, _)| *h < 3).map(|&(_, ms)| Duration::from_millis(ms)).min();
            prop_assert_eq!(reading.found.map(|f| f.remaining), model);
        }
    }
}
