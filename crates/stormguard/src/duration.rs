//! Human-readable durations for policy files: `"250ms"`, `"1.5s"`, `"2m"`.
//!
//! Policy files are written and reviewed by people, and a timeout of `250` means nothing
//! without its unit: the classic outage is a value meant as seconds read as milliseconds (or
//! the reverse). So every non-zero duration here must carry its unit, and anything ambiguous or
//! lossy is rejected with a [`DurationError`] that quotes the input and names the rule, rather
//! than being guessed at or silently rounded.
//!
//! # Grammar
//!
//! A duration is a decimal number followed immediately by a unit:
//!
//! - the number is ASCII digits with at most one `.`, which must have digits on both sides
//!   (`1.5s`, not `.5s` or `1.s`); no sign, exponent, `NaN` or `inf`;
//! - the unit is one of `ns`, `us` (also `µs` with the micro sign U+00B5 or `μs` with the Greek
//!   mu U+03BC), `ms`, `s`, `m` (minutes), `h`; units are case-sensitive (`M` is not `m`), and
//!   there are no days, because a day is not always 24 hours;
//! - a bare zero (`"0"`) needs no unit;
//! - no whitespace anywhere, not even leading or trailing;
//! - the value must be a whole number of nanoseconds (`1.5ns` is rejected) and fit in a
//!   [`Duration`].
//!
//! [`format_duration`] writes the inverse: an integer in the largest unit that represents the
//! duration exactly (`"1500ms"` rather than `"1.5s"`, `"90s"` rather than `"1.5m"`), so that
//! the output round-trips exactly and never carries a decimal point.
//!
//! With the `config` feature, [`serde_duration`] and [`serde_duration_opt`] plug these into
//! serde for `Duration` and `Option<Duration>` fields.

use std::time::Duration;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// How many characters of a bad input an error quotes.
pub const MAX_QUOTED: usize = 64;

/// `s` itself when it has at most `max` characters, else its first `max` characters and `…`.
pub(crate) fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((end, _)) => format!("{}…", &s[..end]),
    }
}

/// Units accepted by [`parse_duration`], with their length in nanoseconds.
const UNITS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("\u{b5}s", 1_000),
    ("\u{3bc}s", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Units written by [`format_duration`], largest first.
const FORMAT_UNITS: [(&str, u128); 6] = [
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

/// More fractional digits than this (after dropping trailing zeros) can never be a whole number
/// of nanoseconds, even in hours (3.6e12 ns = 2^13 · 3^2 · 5^11).
const MAX_FRACTION_DIGITS: usize = 13;

/// A duration string that could not be parsed. Each variant carries the offending input, cut
/// to its first [`MAX_QUOTED`] characters (a megabyte of junk is quoted as a short prefix and
/// `…`, so an error message stays small whatever the input).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// The input is empty.
    #[error("invalid duration \"\": expected a number and a unit, e.g. \"250ms\"")]
    Empty,
    /// The input contains whitespace.
    #[error(
        "invalid duration {input:?}: whitespace at byte {position}; durations may not contain whitespace"
    )]
    Whitespace {
        /// The input.
        input: String,
        /// Byte offset of the first whitespace character.
        position: usize,
    },
    /// The input starts with `-`.
    #[error("invalid duration {input:?}: durations cannot be negative")]
    Negative {
        /// The input.
        input: String,
    },
    /// The input is `NaN` or infinity.
    #[error("invalid duration {input:?}: NaN and infinity are not durations")]
    NotFinite {
        /// The input.
        input: String,
    },
    /// The number part is malformed; `rule` says how.
    #[error("invalid duration {input:?}: {rule}")]
    InvalidNumber {
        /// The input.
        input: String,
        /// The rule it broke.
        rule: &'static str,
    },
    /// The number has more than one decimal point.
    #[error("invalid duration {input:?}: a number may have at most one decimal point")]
    MultipleDots {
        /// The input.
        input: String,
    },
    /// A non-zero number without a unit.
    #[error("invalid duration {input:?}: a non-zero duration needs a unit (ns, us, ms, s, m, h)")]
    MissingUnit {
        /// The input.
        input: String,
    },
    /// A unit that is not one of `ns` `us` `µs` `ms` `s` `m` `h`.
    #[error(
        "invalid duration {input:?}: unknown unit {unit:?}; expected one of ns, us, \u{b5}s, ms, s, m, h"
    )]
    UnknownUnit {
        /// The input.
        input: String,
        /// The unit found.
        unit: String,
    },
    /// The value is not a whole number of nanoseconds.
    #[error("invalid duration {input:?}: finer than one nanosecond")]
    SubNanosecond {
        /// The input.
        input: String,
    },
    /// The value does not fit in a `Duration` (about 584 billion years).
    #[error(
        "invalid duration {input:?}: too large to represent (the maximum is about 584 billion years)"
    )]
    Overflow {
        /// The input.
        input: String,
    },
}

/// Parses a human-readable duration such as `"250ms"`, `"1.5s"` or `"2m"`.
///
/// See the [module docs](self#grammar) for the exact grammar.
///
/// ```
/// use std::time::Duration;
/// use stormguard::duration::{parse_duration, DurationError};
///
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
/// assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
/// assert!(matches!(parse_duration("-1s"), Err(DurationError::Negative { .. })));
/// assert_eq!(
///     parse_duration("3d").unwrap_err().to_string(),
///     "invalid duration \"3d\": unknown unit \"d\"; expected one of ns, us, µs, ms, s, m, h",
/// );
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let input = || cut(s, MAX_QUOTED);
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if let Some((position, _)) = s.char_indices().find(|(_, c)| c.is_whitespace()) {
        return Err(DurationError::Whitespace {
            input: input(),
            position,
        });
    }
    if s.starts_with('-') {
        return Err(DurationError::Negative { input: input() });
    }
    let number_len = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(number_len);
    if number.is_empty() {
        let word = s.strip_prefix('+').unwrap_or(s);
        let non_finite = ["nan", "inf"]
            .iter()
            .any(|w| word.get(..3).is_some_and(|p| p.eq_ignore_ascii_case(w)));
        return Err(if non_finite {
            DurationError::NotFinite { input: input() }
        } else {
            DurationError::InvalidNumber {
                input: input(),
                rule: "expected a number (ASCII digits) before the unit",
            }
        });
    }
    let (int, frac) = match number.split_once('.') {
        None => (number, ""),
        Some((_, f)) if f.contains('.') => {
            return Err(DurationError::MultipleDots { input: input() });
        }
        Some(("", _)) => {
            return Err(DurationError::InvalidNumber {
                input: input(),
                rule: "a decimal point needs a digit before it",
            });
        }
        Some((_, "")) => {
            return Err(DurationError::InvalidNumber {
                input: input(),
                rule: "a decimal point needs a digit after it",
            });
        }
        Some(parts) => parts,
    };
    if unit.is_empty() {
        return if number.bytes().all(|b| b == b'0' || b == b'.') {
            Ok(Duration::ZERO)
        } else {
            Err(DurationError::MissingUnit { input: input() })
        };
    }
    let Some(&(_, unit_nanos)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(DurationError::UnknownUnit {
            input: input(),
            unit: cut(unit, MAX_QUOTED),
        });
    };

    let frac = frac.trim_end_matches('0');
    if frac.len() > MAX_FRACTION_DIGITS {
        return Err(DurationError::SubNanosecond { input: input() });
    }
    let overflow = || DurationError::Overflow { input: input() };
    let int_value = decimal(int).ok_or_else(overflow)?;
    // Both fit easily: at most 13 digits, times at most 3.6e12.
    let frac_scaled = decimal(frac).unwrap_or(0) * unit_nanos;
    let scale = 10u128.pow(u32::try_from(frac.len()).unwrap_or(0));
    if frac_scaled % scale != 0 {
        return Err(DurationError::SubNanosecond { input: input() });
    }
    let nanos = int_value
        .checked_mul(unit_nanos)
        .and_then(|n| n.checked_add(frac_scaled / scale))
        .ok_or_else(overflow)?;
    let secs = u64::try_from(nanos / NANOS_PER_SEC).map_err(|_| overflow())?;
    let subsec = u32::try_from(nanos % NANOS_PER_SEC).map_err(|_| overflow())?;
    Ok(Duration::new(secs, subsec))
}

/// The value of a string of ASCII digits, or `None` on overflow.
fn decimal(digits: &str) -> Option<u128> {
    digits.bytes().try_fold(0u128, |n, b| {
        n.checked_mul(10)?
            .checked_add(u128::from(b.wrapping_sub(b'0')))
    })
}

/// Formats `d` as an integer in the largest unit that represents it exactly: `"250ms"`,
/// `"1s"`, `"1500ms"`, `"90s"`, `"2h"`; zero is `"0s"`. Never uses a decimal point, and
/// [`parse_duration`] reads the result back exactly.
///
/// ```
/// use std::time::Duration;
/// use stormguard::duration::{format_duration, parse_duration};
///
/// assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
/// assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
/// let d = Duration::new(3, 7);
/// assert_eq!(parse_duration(&format_duration(d)), Ok(d));
/// ```
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    let (per, unit) = FORMAT_UNITS
        .iter()
        .map(|&(unit, per)| (per, unit))
        .find(|&(per, _)| nanos % per == 0)
        .unwrap_or((1, "ns"));
    format!("{}{unit}", nanos / per)
}

/// `#[serde(with = "...")]` support for `Duration` fields written as duration strings.
///
/// Serializes with [`format_duration`] and deserializes with [`parse_duration`]; numbers
/// without a unit are not accepted, by design (see the [module docs](super)).
///
/// ```
/// use std::time::Duration;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Policy {
///     #[serde(with = "stormguard::duration::serde_duration")]
///     timeout: Duration,
/// }
///
/// let p: Policy = serde_json::from_str(r#"{"timeout": "1.5s"}"#)?;
/// assert_eq!(p.timeout, Duration::from_millis(1500));
/// assert_eq!(serde_json::to_string(&p)?, r#"{"timeout":"1500ms"}"#);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[cfg(feature = "policy")]
pub mod serde_duration {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    /// Serializes `d` as a duration string such as `"250ms"`.
    pub fn serialize<S: Serializer>(d: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::format_duration(*d))
    }

    /// Deserializes a duration string such as `"250ms"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        deserializer.deserialize_str(super::DurationVisitor)
    }
}

/// `#[serde(with = "...")]` support for `Option<Duration>` fields written as duration strings
/// or null.
///
/// Add `#[serde(default)]` as well if the field may be missing altogether.
///
/// ```
/// use std::time::Duration;
///
/// #[derive(serde::Deserialize)]
/// struct Policy {
///     #[serde(default, with = "stormguard::duration::serde_duration_opt")]
///     deadline: Option<Duration>,
/// }
///
/// let p: Policy = serde_json::from_str(r#"{"deadline": "2m"}"#)?;
/// assert_eq!(p.deadline, Some(Duration::from_secs(120)));
/// let p: Policy = serde_json::from_str("{}")?;
/// assert_eq!(p.deadline, None);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[cfg(feature = "policy")]
pub mod serde_duration_opt {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    /// Serializes `Some(d)` as a duration string and `None` as none/null.
    pub fn serialize<S: Serializer>(
        d: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => serializer.serialize_some(&super::format_duration(*d)),
            None => serializer.serialize_none(),
        }
    }

    /// Deserializes a duration string, or none/null as `None`.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        deserializer.deserialize_option(super::OptionVisitor)
    }
}

#[cfg(feature = "policy")]
struct DurationVisitor;

#[cfg(feature = "policy")]
impl serde::de::Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a duration string such as \"250ms\" or \"1.5s\"")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
        parse_duration(v).map_err(E::custom)
    }
}

#[cfg(feature = "policy")]
struct OptionVisitor;

#[cfg(feature = "policy")]
impl<'de> serde::de::Visitor<'de> for OptionVisitor {
    type Value = Option<Duration>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a duration string such as \"250ms\", or null")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        serde_duration::deserialize(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(s: &str) -> Duration {
        parse_duration(s).expect(s)
    }

    #[test]
    fn accepts_every_unit() {
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok("1s"), Duration::from_secs(1));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("500us"), Duration::from_micros(500));
        assert_eq!(ok("500\u{b5}s"), Duration::from_micros(500));
        assert_eq!(ok("500\u{3bc}s"), Duration::from_micros(500));
        assert_eq!(ok("10ns"), Duration::from_nanos(10));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0.0"), Duration::ZERO);
        assert_eq!(ok("0ms"), Duration::ZERO);
        assert_eq!(ok("0.25h"), Duration::from_secs(900));
        assert_eq!(ok("1.500000000000000000s"), Duration::from_millis(1500));
        assert_eq!(ok("0.000000001s"), Duration::from_nanos(1));
        assert_eq!(ok("0.0000000000025h"), Duration::from_nanos(9));
        assert_eq!(ok("007s"), Duration::from_secs(7));
    }

    #[test]
    fn rejects_with_named_rules() {
        use DurationError as E;
        let err = |s: &str| parse_duration(s).expect_err(s);
        let input = |s: &str| s.to_owned();
        assert_eq!(err(""), E::Empty);
        assert_eq!(
            err("-1s"),
            E::Negative {
                input: input("-1s")
            }
        );
        assert_eq!(err("10"), E::MissingUnit { input: input("10") });
        assert_eq!(
            err("3d"),
            E::UnknownUnit {
                input: input("3d"),
                unit: input("d")
            }
        );
        assert_eq!(
            err("1S"),
            E::UnknownUnit {
                input: input("1S"),
                unit: input("S")
            }
        );
        assert_eq!(
            err("1e3s"),
            E::UnknownUnit {
                input: input("1e3s"),
                unit: input("e3s")
            }
        );
        for s in ["NaN", "nan", "inf", "Infinity", "+inf", "infs"] {
            assert_eq!(err(s), E::NotFinite { input: input(s) }, "{s}");
        }
        assert_eq!(
            err("1.2.3s"),
            E::MultipleDots {
                input: input("1.2.3s")
            }
        );
        assert_eq!(
            err("1..5s"),
            E::MultipleDots {
                input: input("1..5s")
            }
        );
        assert!(matches!(err(".5s"), E::InvalidNumber { .. }));
        assert!(matches!(err("1.s"), E::InvalidNumber { .. }));
        assert!(matches!(err("s"), E::InvalidNumber { .. }));
        assert!(matches!(err("+1s"), E::InvalidNumber { .. }));
        assert_eq!(
            err("1 s"),
            E::Whitespace {
                input: input("1 s"),
                position: 1
            }
        );
        assert!(matches!(err(" 1s"), E::Whitespace { position: 0, .. }));
        assert!(matches!(err("1s\n"), E::Whitespace { position: 2, .. }));
        assert_eq!(
            err("1.5ns"),
            E::SubNanosecond {
                input: input("1.5ns")
            }
        );
        assert!(matches!(
            err("0.00000000000000000001h"),
            E::SubNanosecond { .. }
        ));
        assert!(matches!(err("18446744073709551616s"), E::Overflow { .. }));
        assert!(matches!(
            err("99999999999999999999999999999999999999999ns"),
            E::Overflow { .. }
        ));
        let msg = err("5x").to_string();
        assert!(
            msg.contains("\"5x\"") && msg.contains("unknown unit \"x\""),
            "{msg}"
        );
        let msg = err("-1s").to_string();
        assert!(msg.contains("\"-1s\"") && msg.contains("negative"), "{msg}");
    }

    #[test]
    fn extremes() {
        assert_eq!(ok("18446744073709551615.999999999s"), Duration::MAX);
        assert_eq!(
            parse_duration(&format_duration(Duration::MAX)),
            Ok(Duration::MAX)
        );
    }

    #[test]
    fn formats_in_the_largest_exact_unit() {
        let f = format_duration;
        assert_eq!(f(Duration::ZERO), "0s");
        assert_eq!(f(Duration::from_millis(250)), "250ms");
        assert_eq!(f(Duration::from_secs(1)), "1s");
        assert_eq!(f(Duration::from_millis(1500)), "1500ms");
        assert_eq!(f(Duration::from_secs(90)), "90s");
        assert_eq!(f(Duration::from_secs(120)), "2m");
        assert_eq!(f(Duration::from_secs(3600)), "1h");
        assert_eq!(f(Duration::from_micros(500)), "500us");
        assert_eq!(f(Duration::from_nanos(10)), "10ns");
    }

    #[cfg(feature = "policy")]
    #[test]
    fn serde_helpers() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Policy {
            #[serde(with = "crate::duration::serde_duration")]
            timeout: Duration,
            #[serde(default, with = "crate::duration::serde_duration_opt")]
            deadline: Option<Duration>,
        }
        let p: Policy =
            serde_json::from_str(r#"{"timeout":"250ms","deadline":"1.5s"}"#).expect("valid");
        assert_eq!(
            p,
            Policy {
                timeout: Duration::from_millis(250),
                deadline: Some(Duration::from_millis(1500))
            }
        );
        assert_eq!(
            serde_json::to_string(&p).expect("serializable"),
            r#"{"timeout":"250ms","deadline":"1500ms"}"#
        );
        let p: Policy = serde_json::from_str(r#"{"timeout":"1s","deadline":null}"#).expect("null");
        assert_eq!(p.deadline, None);
        assert_eq!(
            serde_json::to_string(&p).expect("ok"),
            r#"{"timeout":"1s","deadline":null}"#
        );
        let p: Policy = serde_json::from_str(r#"{"timeout":"1s"}"#).expect("missing");
        assert_eq!(p.deadline, None);
        let err = serde_json::from_str::<Policy>(r#"{"timeout":"10"}"#).expect_err("no unit");
        assert!(err.to_string().contains("\"10\""), "{err}");
        let err = serde_json::from_str::<Policy>(r#"{"timeout":10}"#).expect_err("number");
        assert!(err.to_string().contains("duration string"), "{err}");
    }

    /// Durations up to a million hours, some aligned to each unit.
    fn duration() -> impl Strategy<Value = Duration> {
        const MAX_NANOS: u64 = 1_000_000 * 3_600_000_000_000;
        prop_oneof![
            (0..=MAX_NANOS).prop_map(Duration::from_nanos),
            (0..=MAX_NANOS, 0..FORMAT_UNITS.len()).prop_map(|(n, i)| {
                let per = u64::try_from(FORMAT_UNITS[i].1).unwrap_or(1);
                Duration::from_nanos(n / per * per)
            }),
        ]
    }

    /// The grammar read plainly, for `parse_matches_the_grammar`.
    fn grammar_model(s: &str) -> Option<Duration> {
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
            "" => return None,
            _ => UNITS.iter().find(|(name, _)| *name == unit)?.1,
        };
        let (int, frac) = (int.trim_start_matches('0'), frac.trim_end_matches('0'));
        // More digits than these can only overflow, or leave a fraction of a nanosecond.
        if int.len() > 30 || frac.len() > 30 {
            return None;
        }
        let whole: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
        let part: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse().ok()?
        };
        let scale = 10u128.pow(u32::try_from(frac.len()).ok()?);
        let part_nanos = part.checked_mul(per)?;
        if part_nanos % scale != 0 {
            return None;
        }
        let nanos = whole.checked_mul(per)?.checked_add(part_nanos / scale)?;
        let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
        Some(Duration::new(
            secs,
            u32::try_from(nanos % NANOS_PER_SEC).ok()?,
        ))
    }

    proptest! {
        // Parsers are cheap: many more cases than the default 256.
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn format_then_parse_is_identity(d in duration()) {
            let s = format_duration(d);
            prop_assert_eq!(parse_duration(&s), Ok(d), "{}", s);
        }

        /// Accepted exactly when the grammar in the module docs says so, with the value
        /// it states: (int.frac) × unit, a whole number of nanoseconds below 2^64 s.
        #[test]
        fn parse_matches_the_grammar(
            s in prop_oneof![
                any::<String>(),
                "[-+0-9.nsuµμmhdaifNI ]{0,24}",
                "0{0,3}[0-9]{1,22}(\\.[0-9]{1,16})?(ns|us|µs|μs|ms|s|m|h)?",
            ],
        ) {
            prop_assert_eq!(parse_duration(&s).ok(), grammar_model(&s), "{:?}", s);
        }

        #[test]
        fn decimal_seconds_match_millis(ms in 0u64..10_000_000) {
            let s = format!("{}.{:03}s", ms / 1000, ms % 1000);
            prop_assert_eq!(parse_duration(&s), Ok(Duration::from_millis(ms)));
        }
    }
}
