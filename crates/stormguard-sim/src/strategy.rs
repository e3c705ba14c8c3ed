//! Backoff strategies by name, each mapped onto the core's [`Backoff`].
//!
//! The simulator has no backoff arithmetic of its own: a [`Strategy`] only chooses which
//! [`Backoff`] constructor and [`Jitter`] to use, and every delay comes from
//! [`Backoff::delay`] through the retry decision ([`RetryRun`](stormguard::retry::RetryRun)).

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use stormguard::backoff::{Backoff, InvalidBackoff, Jitter};

/// A backoff strategy, as named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// No wait at all: retry at once (Brooker's "no backoff").
    None,
    /// The base before every retry.
    Fixed,
    /// base · n before retry n.
    Linear,
    /// min(cap, base · 2^(n−1)), no jitter.
    Exponential,
    /// Exponential with full jitter: uniform[0, t).
    Full,
    /// Exponential with equal jitter: t/2 + uniform[0, t/2).
    Equal,
    /// Decorrelated jitter: min(cap, uniform[base, 3 · previous)).
    Decorrelated,
}

impl Strategy {
    /// Every strategy, in table order.
    pub const ALL: [Strategy; 7] = [
        Strategy::None,
        Strategy::Fixed,
        Strategy::Linear,
        Strategy::Exponential,
        Strategy::Full,
        Strategy::Equal,
        Strategy::Decorrelated,
    ];

    /// The command-line name (`"full"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::Fixed => "fixed",
            Strategy::Linear => "linear",
            Strategy::Exponential => "exponential",
            Strategy::Full => "full",
            Strategy::Equal => "equal",
            Strategy::Decorrelated => "decorrelated",
        }
    }

    /// A label for tables (`"exponential + full jitter"`, ...).
    pub const fn label(self) -> &'static str {
        match self {
            Strategy::None => "no backoff",
            Strategy::Fixed => "fixed",
            Strategy::Linear => "linear",
            Strategy::Exponential => "exponential",
            Strategy::Full => "exponential + full jitter",
            Strategy::Equal => "exponential + equal jitter",
            Strategy::Decorrelated => "decorrelated jitter",
        }
    }

    /// Parses a command-line name.
    ///
    /// ```
    /// use stormguard_sim::strategy::Strategy;
    /// assert_eq!(Strategy::parse("equal"), Some(Strategy::Equal));
    /// assert_eq!(Strategy::parse("fibonacci"), None);
    /// ```
    pub fn parse(name: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The core [`Backoff`] for this strategy with `base` and `cap`, validated.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_sim::strategy::Strategy;
    ///
    /// let b = Strategy::Exponential.backoff(Duration::from_secs(1), Duration::from_secs(30))?;
    /// assert_eq!(b.ceiling(4), Duration::from_secs(8));
    /// # Ok::<(), stormguard::backoff::InvalidBackoff>(())
    /// ```
    pub fn backoff(self, base: Duration, cap: Duration) -> Result<Backoff, InvalidBackoff> {
        let exponential = |jitter| Backoff::exponential(base).with_cap(cap).with_jitter(jitter);
        let backoff = match self {
            Strategy::None => Backoff::fixed(Duration::ZERO).with_cap(cap),
            Strategy::Fixed => Backoff::fixed(base).with_cap(cap),
            Strategy::Linear => Backoff::linear(base).with_cap(cap),
            Strategy::Exponential => exponential(Jitter::None),
            Strategy::Full => exponential(Jitter::Full),
            Strategy::Equal => exponential(Jitter::Equal),
            Strategy::Decorrelated => Backoff::decorrelated(base, cap),
        };
        backoff.validate()?;
        Ok(backoff)
    }

    /// This strategy's index in [`Strategy::ALL`]: its random stream number.
    pub const fn index(self) -> u64 {
        self as u64
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(Strategy::parse(s.name()), Some(s));
        }
    }

    #[test]
    fn cap_below_base_is_refused() {
        assert!(
            Strategy::Fixed
                .backoff(Duration::from_secs(2), Duration::from_secs(1))
                .is_err()
        );
    }
}
