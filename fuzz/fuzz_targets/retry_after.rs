//! `Retry-After` (delay-seconds and the three HTTP-date forms) and `grpc-retry-pushback-ms`:
//! digits parse to their value, a date to its distance from now (zero when past), everything
//! else is refused with a typed error; pushback is a delay only for plain digits.
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use stormguard::classify::{Pushback, parse_grpc_pushback, parse_retry_after};

fn digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

// Input: 4 bytes of "now" in Unix seconds (little-endian), then the header value.
fuzz_target!(|data: &[u8]| {
    let Some((now, value)) = data.split_first_chunk::<4>() else {
        return;
    };
    let now_secs = u32::from_le_bytes(*now);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(now_secs));
    match (parse_retry_after(value, now), digits(value)) {
        (Ok(d), Some(secs)) => assert_eq!(d, Duration::from_secs(secs)),
        (Ok(d), None) => {
            // Not delay-seconds, so an HTTP-date, which httpdate (the date parser this
            // crate uses for it) must read the same way.
            let text = std::str::from_utf8(value).expect("accepted values are ASCII");
            let date = httpdate::parse_http_date(text).expect("accepted dates parse");
            assert_eq!(d, date.duration_since(now).unwrap_or(Duration::ZERO));
            // An IMF-fixdate written back is read back to the same delay.
            let again = httpdate::fmt_http_date(date);
            assert_eq!(parse_retry_after(again.as_bytes(), now), Ok(d));
        }
        (Err(_), Some(_)) => panic!("digits refused: {value:?}"),
        (Err(_), None) => {}
    }
    let expected = match digits(value) {
        Some(ms) => Pushback::RetryAfter(Duration::from_millis(ms)),
        None => Pushback::DoNotRetry,
    };
    assert_eq!(parse_grpc_pushback(value), expected, "{value:?}");
});
