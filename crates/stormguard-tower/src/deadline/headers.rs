//! Which headers carry a deadline, which one wins, and how each is read and written.
//!
//! Four wire formats are in use (see [`stormguard::deadline::codec`] for their grammar):
//! `grpc-timeout`, `connect-timeout-ms` and `x-envoy-expected-rq-timeout-ms` are *relative*
//! (time left when the request was sent), `x-request-deadline` is *absolute* (Unix epoch
//! milliseconds). A request can carry several: a gRPC client sets `grpc-timeout`, and an Envoy
//! in front of the server adds `x-envoy-expected-rq-timeout-ms` with its own route timeout.
//!
//! # Which one wins
//!
//! [`HeaderReader`] reads the headers of a [`DeadlineHeaders`] list, in its order, and picks
//! one by [`Selection`]:
//!
//! - [`Selection::Earliest`] (the default): every listed header present is read and the
//!   earliest deadline wins, the list order only breaking ties. A server should stop when the
//!   *first* of its callers stops waiting: if Envoy gives up after 1 s, a `grpc-timeout` of 5 s
//!   from the client behind it does not make the remaining 4 s useful.
//! - [`Selection::FirstPresent`]: the first listed header that is present *and valid* wins and
//!   later ones are not read. For deployments that trust one source over another.
//!
//! # Malformed values
//!
//! A value that does not parse, and a header that appears more than once (which of two
//! disagreeing deadlines would be meant?), is a [`DeadlineHeaderError`]. The reader never
//! fails: it reports every error it met in [`Reading::errors`] and still returns the deadline
//! of the valid headers, so the caller decides (the server layer ignores or rejects by its
//! [`MalformedPolicy`](super::MalformedPolicy), and counts either way).
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
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use stormguard::deadline::{
    CONNECT_TIMEOUT_MS, ENVOY_EXPECTED_RQ_TIMEOUT_MS, FAR_FUTURE, GRPC_TIMEOUT, HeaderError,
    REQUEST_DEADLINE, encode_grpc_timeout, encode_request_deadline, parse_connect_timeout_ms,
    parse_envoy_expected_timeout_ms, parse_grpc_timeout, parse_request_deadline,
};

use super::error::InvalidDeadlineConfig;

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

    /// The header's name as an [`http::HeaderName`] (a constant: nothing is parsed per call).
    pub const fn header_name(self) -> HeaderName {
        const GRPC: HeaderName = HeaderName::from_static(GRPC_TIMEOUT);
        const CONNECT: HeaderName = HeaderName::from_static(CONNECT_TIMEOUT_MS);
        const ENVOY: HeaderName = HeaderName::from_static(ENVOY_EXPECTED_RQ_TIMEOUT_MS);
        const ABSOLUTE: HeaderName = HeaderName::from_static(REQUEST_DEADLINE);
        match self {
            DeadlineHeader::GrpcTimeout => GRPC,
            DeadlineHeader::ConnectTimeoutMs => CONNECT,
            DeadlineHeader::EnvoyExpectedRqTimeoutMs => ENVOY,
            DeadlineHeader::RequestDeadline => ABSOLUTE,
        }
    }

    /// Whether the header carries an absolute time (and so depends on clocks agreeing).
    pub const fn is_absolute(self) -> bool {
        matches!(self, DeadlineHeader::RequestDeadline)
    }

    /// Index into per-header arrays, in declaration order.
    pub(crate) const fn index(self) -> usize {
        match self {
            DeadlineHeader::GrpcTimeout => 0,
            DeadlineHeader::ConnectTimeoutMs => 1,
            DeadlineHeader::EnvoyExpectedRqTimeoutMs => 2,
            DeadlineHeader::RequestDeadline => 3,
        }
    }

    /// Parses one value of this header into the time left, reading `wall` only for the
    /// absolute format. An absolute deadline in the past is zero time left, not an error.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use stormguard_tower::deadline::{DeadlineHeader, WallClock};
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
    /// absolute format) as a value of this header.
    ///
    /// Rounding never hands downstream noticeably more than `remaining`: the millisecond
    /// formats round down (and stop at their 10-digit maximum), `grpc-timeout` uses the
    /// finest unit that fits (less than one unit up), and `x-request-deadline` rounds up to
    /// the next millisecond (as [`encode_request_deadline`] documents).
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_tower::deadline::{DeadlineHeader, WallClock};
    ///
    /// let wall = WallClock::system();
    /// let left = Duration::from_micros(899_700);
    /// assert_eq!(DeadlineHeader::GrpcTimeout.encode(left, &wall), "899700u");
    /// assert_eq!(DeadlineHeader::ConnectTimeoutMs.encode(left, &wall), "899");
    /// ```
    pub fn encode(self, remaining: Duration, wall: &WallClock) -> HeaderValue {
        match self {
            DeadlineHeader::GrpcTimeout => {
                let encoded = encode_grpc_timeout(remaining);
                // Always 1-8 ASCII digits and a unit letter: a valid header value.
                HeaderValue::from_str(encoded.as_str())
                    .unwrap_or_else(|_| HeaderValue::from_static("0n"))
            }
            DeadlineHeader::ConnectTimeoutMs | DeadlineHeader::EnvoyExpectedRqTimeoutMs => {
                let millis = u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX);
                HeaderValue::from(millis.min(MAX_MILLIS_VALUE))
            }
            DeadlineHeader::RequestDeadline => {
                let now = wall.now();
                let at = now
                    .checked_add(remaining)
                    .or_else(|| now.checked_add(FAR_FUTURE))
                    .unwrap_or(now);
                // Only ASCII digits: a valid header value.
                HeaderValue::from_str(&encode_request_deadline(at))
                    .unwrap_or_else(|_| HeaderValue::from_static("0"))
            }
        }
    }
}

impl fmt::Display for DeadlineHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
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
/// use stormguard_tower::deadline::{DeadlineHeader, DeadlineHeaders};
///
/// let headers = DeadlineHeaders::new(&[DeadlineHeader::RequestDeadline, DeadlineHeader::GrpcTimeout])?;
/// assert_eq!(headers.iter().next(), Some(DeadlineHeader::RequestDeadline));
/// assert!(DeadlineHeaders::new(&[]).is_err());
/// # Ok::<(), stormguard_tower::deadline::InvalidDeadlineConfig>(())
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
    pub fn new(order: &[DeadlineHeader]) -> Result<DeadlineHeaders, InvalidDeadlineConfig> {
        let Some(&first) = order.first() else {
            return Err(InvalidDeadlineConfig::NoHeaders);
        };
        let mut out = DeadlineHeaders {
            list: [first; 4],
            len: 0,
        };
        for &header in order {
            if out.contains(header) {
                return Err(InvalidDeadlineConfig::RepeatedHeader(header));
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

/// How [`HeaderReader`] picks among several deadline headers on one request.
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

/// A deadline header that was present but unusable.
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
    /// The header appears more than once.
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

/// What [`HeaderReader::read`] saw on one request: the winning deadline, if any, and every
/// malformed or repeated header it met on the way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// The deadline chosen, if any listed header was present and valid.
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

/// Reads the deadline a request announces from its headers: which headers, in which
/// precedence, and how to pick among several. A pure function of the headers and the
/// wall-clock time; it never fails and never panics, whatever the bytes.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use stormguard_tower::deadline::{DeadlineHeader, HeaderReader, WallClock};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("grpc-timeout", "5S".parse()?);
/// headers.insert("x-envoy-expected-rq-timeout-ms", "1000".parse()?);
/// headers.insert("connect-timeout-ms", "soon".parse()?);
///
/// let reading = HeaderReader::default().read(&headers, &WallClock::system());
/// let found = reading.found.expect("a deadline");
/// // Envoy gives up first, so its deadline wins.
/// assert_eq!(found.header, DeadlineHeader::EnvoyExpectedRqTimeoutMs);
/// assert_eq!(found.remaining, Duration::from_secs(1));
/// // The malformed header is reported, not fatal.
/// assert_eq!(reading.first_error().map(|e| e.header()), Some(DeadlineHeader::ConnectTimeoutMs));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeaderReader {
    headers: DeadlineHeaders,
    selection: Selection,
}

impl HeaderReader {
    /// A reader of `headers` that picks by `selection`.
    pub const fn new(headers: DeadlineHeaders, selection: Selection) -> HeaderReader {
        HeaderReader { headers, selection }
    }

    /// The headers read, in precedence order.
    pub const fn headers(&self) -> DeadlineHeaders {
        self.headers
    }

    /// How one is picked among several.
    pub const fn selection(&self) -> Selection {
        self.selection
    }

    /// Reads `headers`, with `wall` as this host's wall clock for `x-request-deadline` (read
    /// only if that header is present).
    pub fn read(&self, headers: &HeaderMap, wall: &WallClock) -> Reading {
        let mut reading = Reading {
            found: None,
            errors: [None; 4],
        };
        for (slot, header) in self.headers.iter().enumerate() {
            let mut values = headers.get_all(header.header_name()).iter();
            let Some(value) = values.next() else {
                continue;
            };
            let extra = values.count();
            let parsed = if extra > 0 {
                Err(DeadlineHeaderError::Repeated {
                    header,
                    count: extra + 1,
                })
            } else {
                header
                    .parse(value.as_bytes(), wall)
                    .map_err(|source| DeadlineHeaderError::Malformed { header, source })
            };
            match parsed {
                Err(error) => {
                    if let Some(e) = reading.errors.get_mut(slot) {
                        *e = Some(error);
                    }
                }
                Ok(remaining) => {
                    let candidate = Found { header, remaining };
                    match (self.selection, reading.found) {
                        (Selection::FirstPresent, _) => {
                            reading.found = Some(candidate);
                            return reading;
                        }
                        (Selection::Earliest, Some(best)) if best.remaining <= remaining => {}
                        (Selection::Earliest, _) => reading.found = Some(candidate),
                    }
                }
            }
        }
        reading
    }
}

/// Where this host's wall-clock time comes from, for the absolute `x-request-deadline`
/// header. Cheap to clone.
///
/// # Default
///
/// [`WallClock::system`]. Tests under paused tokio time use [`WallClock::fixed`] or
/// [`WallClock::from_fn`] so that wall-clock and monotonic time move together.
#[derive(Clone)]
pub struct WallClock {
    source: WallSource,
}

#[derive(Clone)]
enum WallSource {
    System,
    Fixed(SystemTime),
    Custom(Arc<dyn Fn() -> SystemTime + Send + Sync>),
}

impl WallClock {
    /// The operating system's wall clock.
    pub const fn system() -> WallClock {
        WallClock {
            source: WallSource::System,
        }
    }

    /// A wall clock that always reads `at`.
    pub const fn fixed(at: SystemTime) -> WallClock {
        WallClock {
            source: WallSource::Fixed(at),
        }
    }

    /// A wall clock read by calling `now`.
    pub fn from_fn(now: impl Fn() -> SystemTime + Send + Sync + 'static) -> WallClock {
        WallClock {
            source: WallSource::Custom(Arc::new(now)),
        }
    }

    /// The current wall-clock time.
    pub fn now(&self) -> SystemTime {
        match &self.source {
            WallSource::System => SystemTime::now(),
            WallSource::Fixed(at) => *at,
            WallSource::Custom(now) => now(),
        }
    }
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock::system()
    }
}

impl fmt::Debug for WallClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            WallSource::System => f.write_str("WallClock::system"),
            WallSource::Fixed(at) => f.debug_tuple("WallClock::fixed").field(at).finish(),
            WallSource::Custom(_) => f.write_str("WallClock::from_fn"),
        }
    }
}

/// Removes every deadline header from `headers` and writes `remaining` in each of `formats`.
pub(crate) fn write_deadline(
    headers: &mut HeaderMap,
    formats: DeadlineHeaders,
    remaining: Duration,
    wall: &WallClock,
) {
    for header in DeadlineHeaders::ALL.iter() {
        headers.remove(header.header_name());
    }
    for header in formats.iter() {
        headers.insert(header.header_name(), header.encode(remaining, wall));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn headers_list_rejects_empty_and_repeats() {
        assert_eq!(
            DeadlineHeaders::new(&[]),
            Err(InvalidDeadlineConfig::NoHeaders)
        );
        assert_eq!(
            DeadlineHeaders::new(&[DeadlineHeader::GrpcTimeout, DeadlineHeader::GrpcTimeout]),
            Err(InvalidDeadlineConfig::RepeatedHeader(
                DeadlineHeader::GrpcTimeout
            ))
        );
        let all: Vec<_> = DeadlineHeaders::ALL.iter().collect();
        assert_eq!(DeadlineHeaders::new(&all), Ok(DeadlineHeaders::ALL));
        let one = DeadlineHeaders::only(DeadlineHeader::RequestDeadline);
        assert_eq!(one.iter().count(), 1);
        assert!(!one.contains(DeadlineHeader::GrpcTimeout));
    }

    #[test]
    fn first_present_skips_malformed_and_stops_at_first_valid() {
        let headers = map(&[
            ("grpc-timeout", "10x"),
            ("connect-timeout-ms", "500"),
            ("x-envoy-expected-rq-timeout-ms", "garbage"),
        ]);
        let reader = HeaderReader::new(DeadlineHeaders::ALL, Selection::FirstPresent);
        let reading = reader.read(&headers, &WallClock::system());
        assert_eq!(
            reading.found,
            Some(Found {
                header: DeadlineHeader::ConnectTimeoutMs,
                remaining: Duration::from_millis(500)
            })
        );
        // The envoy header comes after the winner and is never read.
        let errors: Vec<_> = reading.errors().map(|e| e.header()).collect();
        assert_eq!(errors, [DeadlineHeader::GrpcTimeout]);
    }

    #[test]
    fn repeated_header_is_an_error() {
        let headers = map(&[("grpc-timeout", "1S"), ("grpc-timeout", "2S")]);
        let reading = HeaderReader::default().read(&headers, &WallClock::system());
        assert_eq!(reading.found, None);
        assert_eq!(
            reading.first_error(),
            Some(&DeadlineHeaderError::Repeated {
                header: DeadlineHeader::GrpcTimeout,
                count: 2
            })
        );
        assert_eq!(
            reading.first_error().map(ToString::to_string).as_deref(),
            Some("grpc-timeout appears 2 times; a deadline header may appear only once")
        );
    }

    #[test]
    fn absolute_deadline_uses_the_wall_clock_and_saturates() {
        let wall = WallClock::fixed(SystemTime::UNIX_EPOCH + Duration::from_secs(10));
        let headers = map(&[("x-request-deadline", "9000")]);
        let reading = HeaderReader::default().read(&headers, &wall);
        assert_eq!(reading.found.map(|f| f.remaining), Some(Duration::ZERO));
        let headers = map(&[("x-request-deadline", "10300")]);
        let reading = HeaderReader::default().read(&headers, &wall);
        assert_eq!(
            reading.found.map(|f| f.remaining),
            Some(Duration::from_millis(300))
        );
    }

    #[test]
    fn write_replaces_every_deadline_header() {
        let mut headers = map(&[("grpc-timeout", "9S"), ("connect-timeout-ms", "7")]);
        let wall = WallClock::fixed(SystemTime::UNIX_EPOCH + Duration::from_secs(1));
        let formats = DeadlineHeaders::new(&[
            DeadlineHeader::EnvoyExpectedRqTimeoutMs,
            DeadlineHeader::RequestDeadline,
        ])
        .expect("valid");
        write_deadline(&mut headers, formats, Duration::from_millis(250), &wall);
        assert_eq!(headers.get("grpc-timeout"), None);
        assert_eq!(headers.get("connect-timeout-ms"), None);
        assert_eq!(
            headers
                .get("x-envoy-expected-rq-timeout-ms")
                .map(HeaderValue::as_bytes),
            Some(&b"250"[..])
        );
        assert_eq!(
            headers.get("x-request-deadline").map(HeaderValue::as_bytes),
            Some(&b"1250"[..])
        );
    }

    #[test]
    fn millis_encoding_caps_at_ten_digits() {
        let wall = WallClock::system();
        assert_eq!(
            DeadlineHeader::ConnectTimeoutMs.encode(Duration::MAX, &wall),
            "9999999999"
        );
        assert_eq!(
            DeadlineHeader::GrpcTimeout.encode(Duration::MAX, &wall),
            "99999999H"
        );
        assert_eq!(
            DeadlineHeader::RequestDeadline
                .encode(Duration::MAX, &WallClock::fixed(SystemTime::UNIX_EPOCH)),
            // Far in the future (100 years), not "now".
            (FAR_FUTURE.as_millis()).to_string().as_str()
        );
    }
}
