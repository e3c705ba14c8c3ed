//! The duration grammar of policy files and the CLI (`stormguard::duration`): a string is
//! accepted exactly when the grammar in the module docs says so, with the value it states;
//! `format_duration` writes every duration so that it reads back exactly.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use stormguard::duration::{format_duration, parse_duration};

/// The grammar, read plainly: digits, an optional `.digits`, a unit; `0` (any zeros) alone.
fn model(s: &str) -> Option<Duration> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() || (number.contains('.') && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    let per: u128 = match unit {
        "" if number.bytes().all(|b| b == b'0' || b == b'.') => return Some(Duration::ZERO),
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    };
    // value = (int . frac) × per, which must be a whole number of nanoseconds below 2^64 s.
    let int = int.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    if int.len() > 30 || frac.len() > 30 {
        return None;
    }
    let scale = 10u128.pow(u32::try_from(frac.len()).ok()?);
    let whole: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let part: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    // part × per fits: at most 30 digits would not, but a non-zero remainder is certain then.
    let part_nanos = part.checked_mul(per)?;
    if part_nanos % scale != 0 {
        return None;
    }
    let nanos = whole.checked_mul(per)?.checked_add(part_nanos / scale)?;
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(
        secs,
        u32::try_from(nanos % 1_000_000_000).ok()?,
    ))
}

// Input: 12 bytes of a duration to format (seconds and nanoseconds, little-endian), then
// the text to parse.
fuzz_target!(|data: &[u8]| {
    let Some((raw, text)) = data.split_first_chunk::<12>() else {
        return;
    };
    let secs = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
    let nanos = u32::from_le_bytes(raw[8..].try_into().expect("4 bytes"));
    let Ok(s) = std::str::from_utf8(text) else {
        return;
    };
    let parsed = parse_duration(s);
    assert_eq!(parsed.as_ref().ok().copied(), model(s), "{s:?}: {parsed:?}");
    if let Ok(d) = parsed {
        assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{s:?}");
    }
    let d = Duration::new(secs, nanos % 1_000_000_000);
    let text = format_duration(d);
    assert!(!text.contains('.'), "{text}");
    assert_eq!(parse_duration(&text), Ok(d), "{text}");
});
