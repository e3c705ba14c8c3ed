//! AIMD: grow the limit by one while it is used, cut it by a ratio when requests drop.

use std::time::Duration;

use super::algorithm::{WindowSample, check_limits, check_ratio, clamp_limit};
use crate::health::{InvalidConfig, Problem};

/// Additive increase, multiplicative decrease (Netflix concurrency-limits' `AIMDLimit`, TCP
/// Reno's congestion window): each window with a drop (or a mean RTT above `timeout`)
/// multiplies the limit by `backoff_ratio`; each window without one, in which the traffic
/// used at least half of the limit, adds one.
///
/// AIMD reacts only to drops, so it needs something to drop requests: a deadline, a client
/// timeout, an overloaded answer from below. It never sees a queue growing; prefer
/// [`Vegas`](super::Vegas) or [`Gradient2`](super::Gradient2) where latency matters.
///
/// # Default
///
/// Netflix's: initial limit 20, minimum 20, maximum 200, backoff ratio 0.9, timeout 5 s.
#[derive(Clone, Debug, PartialEq)]
pub struct Aimd {
    min: u32,
    initial: u32,
    max: u32,
    backoff_ratio: f64,
    timeout: Duration,
    limit: f64,
}

impl Default for Aimd {
    fn default() -> Self {
        Aimd::new()
    }
}

impl Aimd {
    /// The defaults (see [the type's docs](Aimd#default)).
    pub const fn new() -> Self {
        Aimd {
            min: 20,
            initial: 20,
            max: 200,
            backoff_ratio: 0.9,
            timeout: Duration::from_secs(5),
            limit: 20.0,
        }
    }

    /// The limit starts at `initial` and stays within `min..=max`.
    pub const fn with_limits(mut self, min: u32, initial: u32, max: u32) -> Self {
        self.min = min;
        self.initial = initial;
        self.max = max;
        self.limit = initial as f64;
        self
    }

    /// A window with a drop multiplies the limit by `ratio` (in `0.5..1`).
    pub const fn with_backoff_ratio(mut self, ratio: f64) -> Self {
        self.backoff_ratio = ratio;
        self
    }

    /// A window whose mean RTT exceeds `timeout` counts as a drop.
    pub const fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Checks every field; the error names the first bad one (`limit.aimd.…`).
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        check_limits(
            ["limit.aimd.min", "limit.aimd.initial", "limit.aimd.max"],
            self.min,
            self.initial,
            self.max,
        )?;
        check_ratio("limit.aimd.backoff_ratio", self.backoff_ratio, true)?;
        if self.backoff_ratio < 0.5 || self.backoff_ratio >= 1.0 {
            return Err(InvalidConfig {
                field: "limit.aimd.backoff_ratio",
                problem: Problem::NotARatio(self.backoff_ratio),
            });
        }
        if self.timeout.is_zero() {
            return Err(InvalidConfig {
                field: "limit.aimd.timeout",
                problem: Problem::Zero,
            });
        }
        Ok(())
    }

    /// The limit now.
    pub fn limit(&self) -> u32 {
        self.limit as u32
    }

    pub(super) fn update(&mut self, w: &WindowSample) -> u32 {
        if w.dropped > 0 || w.rtt > self.timeout {
            self.limit = (self.limit * self.backoff_ratio).floor();
        } else if f64::from(w.max_in_flight) * 2.0 >= self.limit {
            self.limit += 1.0;
        }
        self.limit = clamp_limit(self.limit, self.min, self.max);
        self.limit()
    }
}
