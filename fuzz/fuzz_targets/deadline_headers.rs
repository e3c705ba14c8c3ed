//! The four deadline headers: every value either parses to the duration a plain reading of
//! its grammar gives, or is refused; a parsed value encodes back to one that parses to
//! (nearly) the same time; `read_deadline` over any set of values never fails and picks the
//! earliest valid one.
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use stormguard::deadline::{DeadlineHeader, DeadlineHeaders, Selection, WallClock, read_deadline};

const HEADERS: [DeadlineHeader; 4] = [
    DeadlineHeader::GrpcTimeout,
    DeadlineHeader::ConnectTimeoutMs,
    DeadlineHeader::EnvoyExpectedRqTimeoutMs,
    DeadlineHeader::RequestDeadline,
];

/// The grammar as the table in `stormguard::deadline::codec` states it.
fn model(header: DeadlineHeader, value: &[u8], now_ms: u64) -> Option<Duration> {
    let digits = |d: &[u8], max: usize| -> Option<u64> {
        if d.is_empty() || d.len() > max || !d.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(d).ok()?.parse().ok()
    };
    match header {
        DeadlineHeader::GrpcTimeout => {
            let (&unit, d) = value.split_last()?;
            let n = u128::from(digits(d, 8)?);
            let per: u128 = match unit {
                b'H' => 3_600_000_000_000,
                b'M' => 60_000_000_000,
                b'S' => 1_000_000_000,
                b'm' => 1_000_000,
                b'u' => 1_000,
                b'n' => 1,
                _ => return None,
            };
            let nanos = n * per;
            Some(Duration::new(
                u64::try_from(nanos / 1_000_000_000).ok()?,
                u32::try_from(nanos % 1_000_000_000).ok()?,
            ))
        }
        DeadlineHeader::ConnectTimeoutMs | DeadlineHeader::EnvoyExpectedRqTimeoutMs => {
            digits(value, 10).map(Duration::from_millis)
        }
        DeadlineHeader::RequestDeadline => {
            let at = digits(value, 20)?;
            // A time past SystemTime's range is refused; this platform's reaches far beyond u64 ms.
            Some(Duration::from_millis(at.saturating_sub(now_ms)))
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let now_ms = 1_700_000_000_000u64 + u64::from(selector) * 7919;
    let wall = WallClock::fixed(SystemTime::UNIX_EPOCH + Duration::from_millis(now_ms));

    // One header value: the model decides acceptance and value.
    let header = HEADERS[usize::from(selector & 3)];
    let parsed = header.parse(rest, &wall);
    assert_eq!(
        parsed.as_ref().ok().copied(),
        model(header, rest, now_ms),
        "{header} {rest:?}"
    );
    if let Ok(left) = parsed {
        let encoded = header.encode(left, &wall);
        let back = header
            .parse(encoded.as_bytes(), &wall)
            .expect("an encoded value parses");
        match header {
            // Finest unit that fits, rounded up by less than one unit.
            DeadlineHeader::GrpcTimeout => {
                assert!(back >= left.min(Duration::from_secs(99_999_999 * 3600)))
            }
            // Milliseconds, rounded down, capped at ten digits.
            DeadlineHeader::ConnectTimeoutMs | DeadlineHeader::EnvoyExpectedRqTimeoutMs => {
                assert_eq!(back, left)
            }
            DeadlineHeader::RequestDeadline => assert_eq!(back, left),
        }
    }

    // Several values on one request, split at 0xff: read_deadline never fails, and the
    // earliest valid value wins.
    let values: Vec<(DeadlineHeader, &[u8])> = rest
        .split(|&b| b == 0xff)
        .enumerate()
        .map(|(i, v)| (HEADERS[(usize::from(selector >> 2) + i) % 4], v))
        .take(8)
        .collect();
    let of = |h: DeadlineHeader| values.iter().filter(move |(n, _)| *n == h).map(|(_, v)| *v);
    let reading = read_deadline(DeadlineHeaders::ALL, Selection::Earliest, of, &wall);
    let earliest = values
        .iter()
        .filter_map(|&(h, v)| h.parse(v, &wall).ok())
        .min();
    assert_eq!(reading.found.map(|f| f.remaining), earliest);
    let first = read_deadline(DeadlineHeaders::ALL, Selection::FirstPresent, of, &wall);
    assert_eq!(first.found.is_some(), earliest.is_some());
});
