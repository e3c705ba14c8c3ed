//! Deadline headers on an `http::HeaderMap`: the core's reader and encoder
//! ([`stormguard::deadline::read_deadline`], [`DeadlineHeader::encode`]) over HTTP headers.

use std::cell::RefCell;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use stormguard::deadline::{
    DeadlineHeader, DeadlineHeaders, EncodedDeadline, Reading, Selection, WallClock,
};

const GRPC: HeaderName = HeaderName::from_static(stormguard::deadline::GRPC_TIMEOUT);
const CONNECT: HeaderName = HeaderName::from_static(stormguard::deadline::CONNECT_TIMEOUT_MS);
const ENVOY: HeaderName =
    HeaderName::from_static(stormguard::deadline::ENVOY_EXPECTED_RQ_TIMEOUT_MS);
const ABSOLUTE: HeaderName = HeaderName::from_static(stormguard::deadline::REQUEST_DEADLINE);

/// The four deadline headers' names.
const NAMES: [HeaderName; 4] = [GRPC, CONNECT, ENVOY, ABSOLUTE];

/// The header's name as an [`http::HeaderName`] (a constant: nothing is parsed per call).
pub(crate) const fn header_name(header: DeadlineHeader) -> HeaderName {
    match header {
        DeadlineHeader::GrpcTimeout => GRPC,
        DeadlineHeader::ConnectTimeoutMs => CONNECT,
        DeadlineHeader::EnvoyExpectedRqTimeoutMs => ENVOY,
        DeadlineHeader::RequestDeadline => ABSOLUTE,
    }
}

/// Reads the deadline `headers` announce (see [`stormguard::deadline::read_deadline`] for
/// which one wins and what counts as malformed). Never fails, whatever the bytes.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use stormguard::deadline::{DeadlineHeader, DeadlineHeaders, Selection, WallClock};
/// use stormguard_tower::wire::read_deadline;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("grpc-timeout", "5S".parse()?);
/// headers.insert("x-envoy-expected-rq-timeout-ms", "1000".parse()?);
/// let reading = read_deadline(&headers, DeadlineHeaders::ALL, Selection::Earliest, &WallClock::system());
/// let found = reading.found.expect("a deadline");
/// assert_eq!(found.header, DeadlineHeader::EnvoyExpectedRqTimeoutMs);
/// assert_eq!(found.remaining, Duration::from_secs(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read_deadline(
    headers: &HeaderMap,
    list: DeadlineHeaders,
    selection: Selection,
    wall: &WallClock,
) -> Reading {
    stormguard::deadline::read_deadline(
        list,
        selection,
        |header| {
            headers
                .get_all(header_name(header))
                .iter()
                .map(HeaderValue::as_bytes)
        },
        wall,
    )
}

/// Whether `headers` carry any of the four deadline headers.
pub fn has_deadline_header(headers: &HeaderMap) -> bool {
    if headers.keys_len() > super::SCANNED_NAMES {
        return NAMES.iter().any(|name| headers.contains_key(name));
    }
    // One pass over the names present (see `carries`), not four look-ups.
    headers.keys().any(|present| NAMES.contains(present))
}

/// Removes every deadline header from `headers` and writes `remaining` in each of `formats`.
///
/// A value equal to the last one this thread wrote for the same header is a reference-counted
/// copy of it, so a fixed per-try timeout (the common case) costs no allocation per request.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use stormguard::deadline::{DeadlineHeader, DeadlineHeaders, WallClock};
/// use stormguard_tower::wire::write_deadline;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("connect-timeout-ms", "9999".parse()?);
/// write_deadline(&mut headers, DeadlineHeaders::only(DeadlineHeader::GrpcTimeout), Duration::from_millis(250), &WallClock::system());
/// assert_eq!(headers["grpc-timeout"], "250000u");
/// assert!(!headers.contains_key("connect-timeout-ms"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn write_deadline(
    headers: &mut HeaderMap,
    formats: DeadlineHeaders,
    remaining: Duration,
    wall: &WallClock,
) {
    if has_deadline_header(headers) {
        for header in DeadlineHeaders::ALL.iter() {
            if !formats.contains(header) {
                headers.remove(header_name(header));
            }
        }
    }
    for header in formats.iter() {
        let encoded = header.encode(remaining, wall);
        headers.insert(header_name(header), cached_value(header, encoded));
    }
}

thread_local! {
    /// The last value written per header on this thread.
    static LAST: RefCell<[Option<(EncodedDeadline, HeaderValue)>; 4]> =
        const { RefCell::new([None, None, None, None]) };
}

fn cached_value(header: DeadlineHeader, encoded: EncodedDeadline) -> HeaderValue {
    let slot = match header {
        DeadlineHeader::GrpcTimeout => 0,
        DeadlineHeader::ConnectTimeoutMs => 1,
        DeadlineHeader::EnvoyExpectedRqTimeoutMs => 2,
        DeadlineHeader::RequestDeadline => 3,
    };
    LAST.with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else {
            return to_value(encoded);
        };
        match last.get_mut(slot) {
            Some(Some((seen, value))) if *seen == encoded => value.clone(),
            Some(entry) => {
                let value = to_value(encoded);
                *entry = Some((encoded, value.clone()));
                value
            }
            None => to_value(encoded),
        }
    })
}

/// A header value whose clones share one buffer.
fn to_value(encoded: EncodedDeadline) -> HeaderValue {
    let bytes = Bytes::from_owner(Owned(encoded));
    // Only ASCII digits and a unit letter: always a valid header value.
    HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

struct Owned(EncodedDeadline);

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
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
    fn write_replaces_every_deadline_header() {
        let mut headers = map(&[
            ("grpc-timeout", "5S"),
            ("connect-timeout-ms", "1"),
            ("x-request-deadline", "1"),
            ("x-other", "kept"),
        ]);
        let formats = DeadlineHeaders::new(&[
            DeadlineHeader::GrpcTimeout,
            DeadlineHeader::EnvoyExpectedRqTimeoutMs,
        ])
        .expect("valid");
        write_deadline(
            &mut headers,
            formats,
            Duration::from_millis(1500),
            &WallClock::system(),
        );
        assert_eq!(headers["grpc-timeout"], "1500000u");
        assert_eq!(headers["x-envoy-expected-rq-timeout-ms"], "1500");
        assert!(!headers.contains_key("connect-timeout-ms"));
        assert!(!headers.contains_key("x-request-deadline"));
        assert_eq!(headers["x-other"], "kept");
        assert_eq!(headers.get_all("grpc-timeout").iter().count(), 1);
    }

    #[test]
    fn repeated_values_share_one_buffer_and_new_values_replace_it() {
        let only = DeadlineHeaders::only(DeadlineHeader::ConnectTimeoutMs);
        let wall = WallClock::system();
        let mut a = HeaderMap::new();
        let mut b = HeaderMap::new();
        write_deadline(&mut a, only, Duration::from_millis(300), &wall);
        write_deadline(&mut b, only, Duration::from_millis(300), &wall);
        assert_eq!(
            a["connect-timeout-ms"].as_bytes().as_ptr(),
            b["connect-timeout-ms"].as_bytes().as_ptr()
        );
        write_deadline(&mut b, only, Duration::from_millis(301), &wall);
        assert_eq!(b["connect-timeout-ms"], "301");
        assert_eq!(a["connect-timeout-ms"], "300");
    }

    #[test]
    fn reading_sees_repeats_and_malformed_values() {
        let headers = map(&[
            ("grpc-timeout", "5S"),
            ("grpc-timeout", "2S"),
            ("connect-timeout-ms", "soon"),
        ]);
        let reading = read_deadline(
            &headers,
            DeadlineHeaders::ALL,
            Selection::Earliest,
            &WallClock::system(),
        );
        assert_eq!(
            reading.found.map(|f| f.remaining),
            Some(Duration::from_secs(2))
        );
        assert_eq!(reading.errors().count(), 2);
        assert!(has_deadline_header(&headers));
        assert!(!has_deadline_header(&HeaderMap::new()));
    }
}
