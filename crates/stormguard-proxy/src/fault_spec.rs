//! Fault injection settings written on a command line: `RATE:STATUS`, `RATE:reset` and
//! `RATE:DURATION`, so that a chaos drill needs no config file.
//!
//! ```
//! use std::time::Duration;
//! use stormguard::fault::{Abort, Latency};
//! use stormguard_proxy::fault_spec::{parse_abort, parse_delay};
//!
//! assert_eq!(parse_abort("0.1:503")?, (0.1, Abort::Status { status: 503, retry_after: None }));
//! assert_eq!(parse_abort("1:reset")?, (1.0, Abort::Reset));
//! assert_eq!(parse_delay("0.05:250ms")?, (0.05, Latency::Fixed(Duration::from_millis(250))));
//! assert!(parse_abort("10%:503").is_err());
//! # Ok::<(), stormguard_proxy::fault_spec::InvalidFaultSpec>(())
//! ```

use stormguard::duration::parse_duration;
use stormguard::fault::{Abort, Latency};

/// Why a fault setting does not parse; the message names the part that is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidFaultSpec {
    /// Not `RATE:WHAT`.
    #[error("{0:?} is not RATE:WHAT (such as 0.1:503, 0.1:reset or 0.05:250ms)")]
    Shape(String),
    /// The rate is not a number in [0, 1].
    #[error("rate {0:?} is not a number from 0 to 1")]
    Rate(String),
    /// The status is not an HTTP error status (400..=599) or `reset`.
    #[error("abort {0:?} is not a status from 400 to 599 or 'reset'")]
    Abort(String),
    /// The delay is not a duration (`250ms`, `1s`).
    #[error("delay {0:?} is not a duration such as 250ms")]
    Delay(String),
}

fn split(s: &str) -> Result<(f64, &str), InvalidFaultSpec> {
    let (rate, what) = s
        .split_once(':')
        .ok_or_else(|| InvalidFaultSpec::Shape(s.to_owned()))?;
    let rate = rate
        .parse::<f64>()
        .ok()
        .filter(|r| (0.0..=1.0).contains(r))
        .ok_or_else(|| InvalidFaultSpec::Rate(rate.to_owned()))?;
    Ok((rate, what))
}

/// `RATE:STATUS` (an HTTP status 400..=599) or `RATE:reset`.
pub fn parse_abort(s: &str) -> Result<(f64, Abort), InvalidFaultSpec> {
    let (rate, what) = split(s)?;
    if what == "reset" {
        return Ok((rate, Abort::Reset));
    }
    let status = what
        .parse::<u16>()
        .ok()
        .filter(|s| (400..=599).contains(s))
        .ok_or_else(|| InvalidFaultSpec::Abort(what.to_owned()))?;
    Ok((
        rate,
        Abort::Status {
            status,
            retry_after: None,
        },
    ))
}

/// `RATE:DURATION`: a fixed delay before the call.
pub fn parse_delay(s: &str) -> Result<(f64, Latency), InvalidFaultSpec> {
    let (rate, what) = split(s)?;
    let delay = parse_duration(what).map_err(|_| InvalidFaultSpec::Delay(what.to_owned()))?;
    Ok((rate, Latency::Fixed(delay)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_broken_part_is_named() {
        assert!(matches!(
            parse_abort("503"),
            Err(InvalidFaultSpec::Shape(_))
        ));
        assert!(matches!(
            parse_abort("2:503"),
            Err(InvalidFaultSpec::Rate(_))
        ));
        assert!(matches!(
            parse_abort("NaN:503"),
            Err(InvalidFaultSpec::Rate(_))
        ));
        assert!(matches!(
            parse_abort("0.1:200"),
            Err(InvalidFaultSpec::Abort(_))
        ));
        assert!(matches!(
            parse_delay("0.1:fast"),
            Err(InvalidFaultSpec::Delay(_))
        ));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC{0,30}") {
            let _ = parse_abort(&s);
            let _ = parse_delay(&s);
        }

        #[test]
        fn a_valid_abort_round_trips(rate in 0.0f64..=1.0, status in 400u16..=599) {
            let (r, abort) = parse_abort(&format!("{rate}:{status}")).expect("valid");
            prop_assert_eq!(r, rate);
            prop_assert_eq!(abort, Abort::Status { status, retry_after: None });
        }
    }
}
