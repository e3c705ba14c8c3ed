//! What a window adds up: the public totals, and one call packed into a byte.

use std::time::Duration;

use super::config::HealthConfig;
use crate::classify::Outcome;

/// Totals over a window (or over one bucket of it).
///
/// ```
/// use stormguard::health::HealthCounts;
///
/// let counts = HealthCounts { calls: 4, successes: 3, retryable: 1, failures: 1, ..Default::default() };
/// assert_eq!(counts.failure_ratio(), 0.25);
/// assert_eq!(counts.slow_call_ratio(), 0.0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HealthCounts {
    /// Every recorded call.
    pub calls: u64,
    /// [`Outcome::Success`] calls.
    pub successes: u64,
    /// [`Outcome::Retryable`] calls.
    pub retryable: u64,
    /// [`Outcome::Overloaded`] calls.
    pub overloaded: u64,
    /// [`Outcome::InDoubt`] calls.
    pub in_doubt: u64,
    /// [`Outcome::NeverRetry`] calls.
    pub never_retry: u64,
    /// Calls that count as health failures (see [`HealthConfig::is_failure`]).
    pub failures: u64,
    /// Calls slower than the slow-call threshold, whatever their outcome.
    pub slow: u64,
}

impl HealthCounts {
    /// `failures / calls`, or 0 with no calls.
    pub fn failure_ratio(&self) -> f64 {
        ratio(self.failures, self.calls)
    }

    /// `slow / calls`, or 0 with no calls.
    pub fn slow_call_ratio(&self) -> f64 {
        ratio(self.slow, self.calls)
    }

    pub(super) fn add(&mut self, other: &HealthCounts) {
        self.calls += other.calls;
        self.successes += other.successes;
        self.retryable += other.retryable;
        self.overloaded += other.overloaded;
        self.in_doubt += other.in_doubt;
        self.never_retry += other.never_retry;
        self.failures += other.failures;
        self.slow += other.slow;
    }

    pub(super) fn sub(&mut self, other: &HealthCounts) {
        self.calls -= other.calls;
        self.successes -= other.successes;
        self.retryable -= other.retryable;
        self.overloaded -= other.overloaded;
        self.in_doubt -= other.in_doubt;
        self.never_retry -= other.never_retry;
        self.failures -= other.failures;
        self.slow -= other.slow;
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// One call, packed into a byte for the count-based ring: the class in the low bits, then
/// the failure and slow flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Call(pub(super) u8);

pub(super) const CLASS_MASK: u8 = 0b0111;
pub(super) const FAILURE: u8 = 0b1000;
pub(super) const SLOW: u8 = 0b1_0000;

impl Call {
    /// The value of a ring slot that holds no call yet.
    pub(super) const EMPTY: Call = Call(0);

    pub(super) fn new(config: &HealthConfig, outcome: Outcome, elapsed: Duration) -> Call {
        let class = match outcome {
            Outcome::Success => 0,
            Outcome::Retryable => 1,
            Outcome::Overloaded { .. } => 2,
            Outcome::InDoubt => 3,
            Outcome::NeverRetry => 4,
        };
        let failure = if config.is_failure(outcome) {
            FAILURE
        } else {
            0
        };
        let slow = if config.is_slow(elapsed) { SLOW } else { 0 };
        Call(class | failure | slow)
    }

    /// A health failure or a slow call: a call that may move a breaker.
    pub(super) const fn is_bad(self) -> bool {
        self.0 & (FAILURE | SLOW) != 0
    }

    pub(super) fn counts(self) -> HealthCounts {
        let mut c = HealthCounts {
            calls: 1,
            failures: u64::from(self.0 & FAILURE != 0),
            slow: u64::from(self.0 & SLOW != 0),
            ..HealthCounts::default()
        };
        match self.0 & CLASS_MASK {
            0 => c.successes = 1,
            1 => c.retryable = 1,
            2 => c.overloaded = 1,
            3 => c.in_doubt = 1,
            _ => c.never_retry = 1,
        }
        c
    }
}
