//! When a rule holds and when it has cleared: thresholds with hysteresis, combined with
//! all/any.
//!
//! A single threshold is a flapping switch: an error ratio hovering at 10 % crosses 10 % a
//! dozen times a minute, and a rule that fires and reverts on each crossing publishes a
//! dozen versions. Each threshold therefore has two values: the rule *enters* above
//! `above` (or below `below`) and only *clears* below `exit_below` (above `exit_above`),
//! further out. Between the two the rule keeps whatever state it is in.
//!
//! Clearing is the dual of holding with the exit thresholds: `all` clears when any part
//! clears (the conjunction is plainly false again), `any` when every part clears. A series
//! the collector did not deliver neither holds nor clears: missing data changes nothing.

use super::observe::{Observations, Series};

/// Which way a threshold points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Holds when the value is above the enter threshold; clears below the exit threshold.
    Above,
    /// Holds when the value is below the enter threshold; clears above the exit threshold.
    Below,
}

/// One series against its two thresholds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    /// The series read.
    pub series: Series,
    /// Which way it points.
    pub direction: Direction,
    /// The value past which the condition holds (strictly).
    pub enter: f64,
    /// The value past which, the other way, it clears (strictly); equal to `enter` when no
    /// hysteresis is wanted, never on the holding side of it.
    pub exit: f64,
}

/// A rule's condition: thresholds combined with all/any, nested.
#[derive(Clone, Debug, PartialEq)]
pub enum Condition {
    /// One series against its thresholds.
    Series(Threshold),
    /// Every part holds.
    All(Vec<Condition>),
    /// At least one part holds.
    Any(Vec<Condition>),
}

impl Threshold {
    fn holds(&self, value: f64) -> bool {
        match self.direction {
            Direction::Above => value > self.enter,
            Direction::Below => value < self.enter,
        }
    }

    fn clears(&self, value: f64) -> bool {
        match self.direction {
            Direction::Above => value < self.exit,
            Direction::Below => value > self.exit,
        }
    }
}

impl Condition {
    /// Whether the condition holds (by the enter thresholds) for a rule on `endpoint`.
    pub fn holds(&self, seen: &Observations, endpoint: &str) -> bool {
        match self {
            Condition::Series(t) => seen
                .for_rule(endpoint, t.series)
                .is_some_and(|v| t.holds(v)),
            Condition::All(parts) => parts.iter().all(|c| c.holds(seen, endpoint)),
            Condition::Any(parts) => parts.iter().any(|c| c.holds(seen, endpoint)),
        }
    }

    /// Whether the condition has cleared (by the exit thresholds) for a rule on `endpoint`.
    pub fn clears(&self, seen: &Observations, endpoint: &str) -> bool {
        match self {
            Condition::Series(t) => seen
                .for_rule(endpoint, t.series)
                .is_some_and(|v| t.clears(v)),
            Condition::All(parts) => parts.iter().any(|c| c.clears(seen, endpoint)),
            Condition::Any(parts) => parts.iter().all(|c| c.clears(seen, endpoint)),
        }
    }

    /// The value of every series the condition reads, in order (a series read twice once):
    /// what an audit record shows.
    pub fn values(&self, seen: &Observations, endpoint: &str) -> Vec<(Series, Option<f64>)> {
        let mut out = Vec::new();
        self.collect(seen, endpoint, &mut out);
        out
    }

    fn collect(&self, seen: &Observations, endpoint: &str, out: &mut Vec<(Series, Option<f64>)>) {
        match self {
            Condition::Series(t) => {
                if !out.iter().any(|(s, _)| *s == t.series) {
                    out.push((t.series, seen.for_rule(endpoint, t.series)));
                }
            }
            Condition::All(parts) | Condition::Any(parts) => {
                for part in parts {
                    part.collect(seen, endpoint, out);
                }
            }
        }
    }
}
