//! `grpc-timeout` encode → parse: every duration encodes to 1–8 digits and a unit, and
//! parses back to at least the duration and less than one unit more (clamped at 99999999H).
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use stormguard::deadline::{encode_grpc_timeout, parse_grpc_timeout};

const MAX: Duration = Duration::from_secs(99_999_999 * 3600);

// Input: 8 bytes of seconds and 4 of nanoseconds, little-endian (missing bytes are zero).
fuzz_target!(|data: &[u8]| {
    let mut raw = [0u8; 12];
    let n = data.len().min(12);
    raw[..n].copy_from_slice(&data[..n]);
    let secs = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
    let nanos = u32::from_le_bytes(raw[8..].try_into().expect("4 bytes"));
    let d = Duration::new(secs >> (secs % 64), nanos % 1_000_000_000);
    let encoded = encode_grpc_timeout(d);
    let s = encoded.as_str();
    let (digits, unit) = s.split_at(s.len() - 1);
    assert!((1..=8).contains(&digits.len()), "{s}");
    assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{s}");
    let per: u128 = match unit {
        "n" => 1,
        "u" => 1_000,
        "m" => 1_000_000,
        "S" => 1_000_000_000,
        "M" => 60_000_000_000,
        "H" => 3_600_000_000_000,
        _ => panic!("unit of {s}"),
    };
    let back = parse_grpc_timeout(s.as_bytes()).expect("an encoded value parses");
    if d >= MAX {
        assert_eq!(back, MAX, "{d:?} clamps");
        return;
    }
    assert!(back >= d, "{d:?} -> {s} -> {back:?}");
    assert!(back.as_nanos() < d.as_nanos() + per, "{d:?} -> {s}");
    // The finest unit that fits: one unit finer would need more than 8 digits.
    if per > 1 {
        let finer: u128 = match unit {
            "u" => 1,
            "m" => 1_000,
            "S" => 1_000_000,
            "M" => 1_000_000_000,
            _ => 60_000_000_000,
        };
        assert!(
            d.as_nanos().div_ceil(finer) > 99_999_999,
            "{d:?} -> {s}: a finer unit fits"
        );
    }
});
