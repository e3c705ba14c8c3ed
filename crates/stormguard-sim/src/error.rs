//! Refused parameters, named by the command-line flag that sets them.
//!
//! Every scenario's parameters are checked before anything runs. A refusal names the
//! parameter the way the `stormguard` command line spells it (`clients`, `bin`, ...), so the
//! CLI can say `invalid value for --bin: ...` without a mapping table, and a library caller
//! gets the same field name as the config struct.

use std::time::Duration;

use stormguard::backoff::Backoff;

use crate::time::{Nanos, nanos};

/// The longest duration any parameter may have: a day. Longer values are almost always a unit
/// mistake (`1000h` for `1000ms`), and they would make bins and runs absurdly long.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// The most bins a run may fill.
pub const MAX_BINS: u64 = 10_000_000;

/// A parameter was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for --{flag}: {reason}")]
pub struct InvalidParam {
    /// The parameter, spelled as its command-line flag without the dashes.
    pub flag: &'static str,
    /// Why.
    pub reason: String,
}

impl InvalidParam {
    /// A refusal of `flag` because of `reason`.
    pub fn new(flag: &'static str, reason: impl Into<String>) -> Self {
        InvalidParam {
            flag,
            reason: reason.into(),
        }
    }
}

/// Checks that `d` is above zero and at most [`MAX_DURATION`].
pub fn positive_duration(flag: &'static str, d: Duration) -> Result<Nanos, InvalidParam> {
    if d.is_zero() {
        return Err(InvalidParam::new(flag, "must be above zero"));
    }
    bounded_duration(flag, d)
}

/// Checks that `d` is at most [`MAX_DURATION`].
pub fn bounded_duration(flag: &'static str, d: Duration) -> Result<Nanos, InvalidParam> {
    if d > MAX_DURATION {
        return Err(InvalidParam::new(
            flag,
            format!("{d:?} is longer than the 24 h any simulated duration may last"),
        ));
    }
    Ok(nanos(d))
}

/// Checks a backoff's base and cap: each above zero and at most [`MAX_DURATION`], and the cap
/// not below the base by the core's own rule ([`Backoff::validate`], the one a policy file's
/// backoff passes too).
pub fn backoff_range(base: Duration, cap: Duration) -> Result<(), InvalidParam> {
    positive_duration("base", base)?;
    positive_duration("cap", cap)?;
    Backoff::exponential(base)
        .with_cap(cap)
        .validate()
        .map(drop)
        .map_err(|e| InvalidParam::new("cap", e.to_string()))
}

/// Checks that `x` is a finite number in `lo..=hi`.
pub fn in_range(flag: &'static str, x: f64, lo: f64, hi: f64) -> Result<f64, InvalidParam> {
    if x.is_finite() && (lo..=hi).contains(&x) {
        Ok(x)
    } else {
        Err(InvalidParam::new(
            flag,
            format!("{x} is not a number between {lo} and {hi}"),
        ))
    }
}

/// Checks a bin width against the run it divides: above zero, no longer than the run, and no
/// more than [`MAX_BINS`] bins.
pub fn bin_width(bin: Duration, run: Nanos) -> Result<Nanos, InvalidParam> {
    let width = positive_duration("bin", bin)?;
    if width > run {
        return Err(InvalidParam::new(
            "bin",
            format!(
                "{bin:?} is longer than the whole run ({:?})",
                crate::time::duration(run)
            ),
        ));
    }
    if run / width > MAX_BINS {
        return Err(InvalidParam::new(
            "bin",
            format!("{bin:?} would cut the run into more than {MAX_BINS} bins"),
        ));
    }
    Ok(width)
}

/// Checks that a list has at least one entry.
pub fn non_empty<T>(flag: &'static str, items: &[T]) -> Result<(), InvalidParam> {
    if items.is_empty() {
        Err(InvalidParam::new(flag, "needs at least one entry"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_flag() {
        let e = positive_duration("base", Duration::ZERO).expect_err("zero");
        assert_eq!(
            e.to_string(),
            "invalid value for --base: must be above zero"
        );
        assert!(bounded_duration("cap", Duration::from_secs(90_000)).is_err());
        assert_eq!(
            bin_width(Duration::from_secs(5), 1_000_000_000)
                .expect_err("longer than run")
                .flag,
            "bin"
        );
        assert!(bin_width(Duration::from_nanos(1), 1_000_000_000_000).is_err());
        assert!(in_range("p", f64::NAN, 0.0, 1.0).is_err());
        let e = backoff_range(Duration::from_secs(1), Duration::from_millis(100))
            .expect_err("cap below base");
        assert_eq!(e.flag, "cap");
        assert!(e.reason.contains("below its base"), "{e}");
        assert_eq!(
            backoff_range(Duration::ZERO, Duration::from_secs(1))
                .expect_err("zero base")
                .flag,
            "base"
        );
        assert_eq!(in_range("p", 0.5, 0.0, 1.0), Ok(0.5));
    }
}
