//! The one interface of the limit algorithms, and what they are fed: one window of samples.

use std::time::Duration;

use super::{Aimd, Gradient2, Vegas};
use crate::health::InvalidConfig;

/// What the requests that finished during one window looked like: the input of every
/// [`LimitAlgorithm`].
///
/// The [`Limiter`](super::Limiter) aggregates per-request samples into windows (Netflix's
/// `WindowedLimit`, Envoy's `concurrency_update_interval`), so an algorithm runs a few times a
/// second whatever the request rate, off the request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSample {
    /// Mean round-trip time (admission to release) of the samples in the window.
    pub rtt: Duration,
    /// The shortest round-trip time seen in the window.
    pub min_rtt: Duration,
    /// Samples in the window (dropped ones included).
    pub samples: u32,
    /// Samples that ended dropped: timed out, cancelled by their deadline, or overloaded.
    pub dropped: u32,
    /// The most requests in flight at once during the window: an algorithm does not raise a
    /// limit the traffic never came near (the application-limited check of Netflix's limits).
    pub max_in_flight: u32,
}

/// An adaptive concurrency limit algorithm: one of Netflix concurrency-limits' three, each
/// validated at construction.
///
/// ```
/// use std::time::Duration;
/// use stormguard::limit::{Aimd, LimitAlgorithm, WindowSample};
///
/// let mut aimd = LimitAlgorithm::from(Aimd::new().with_limits(5, 10, 100));
/// let full = WindowSample {
///     rtt: Duration::from_millis(5),
///     min_rtt: Duration::from_millis(4),
///     samples: 50,
///     dropped: 0,
///     max_in_flight: 10,
/// };
/// assert_eq!(aimd.update(&full), 11);
/// assert_eq!(aimd.update(&WindowSample { dropped: 1, ..full }), 9);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum LimitAlgorithm {
    /// Additive increase, multiplicative decrease on drops.
    Aimd(Aimd),
    /// TCP Vegas: the queue estimated from the RTT's growth over the no-load RTT.
    Vegas(Vegas),
    /// Netflix's Gradient2: the ratio of a long-term to the short-term RTT.
    Gradient2(Gradient2),
}

impl From<Aimd> for LimitAlgorithm {
    fn from(a: Aimd) -> Self {
        LimitAlgorithm::Aimd(a)
    }
}

impl From<Vegas> for LimitAlgorithm {
    fn from(v: Vegas) -> Self {
        LimitAlgorithm::Vegas(v)
    }
}

impl From<Gradient2> for LimitAlgorithm {
    fn from(g: Gradient2) -> Self {
        LimitAlgorithm::Gradient2(g)
    }
}

impl LimitAlgorithm {
    /// The limit now.
    pub fn limit(&self) -> u32 {
        match self {
            LimitAlgorithm::Aimd(a) => a.limit(),
            LimitAlgorithm::Vegas(v) => v.limit(),
            LimitAlgorithm::Gradient2(g) => g.limit(),
        }
    }

    /// Feeds one window; returns the new limit.
    pub fn update(&mut self, window: &WindowSample) -> u32 {
        match self {
            LimitAlgorithm::Aimd(a) => a.update(window),
            LimitAlgorithm::Vegas(v) => v.update(window),
            LimitAlgorithm::Gradient2(g) => g.update(window),
        }
    }

    /// The round-trip time without a queue, as far as the algorithm estimates one: Vegas's
    /// no-load RTT; `None` for AIMD (it watches drops only) and Gradient2 (its long-term
    /// average follows a standing queue, so it is no such estimate).
    pub fn no_load_rtt(&self) -> Option<Duration> {
        match self {
            LimitAlgorithm::Vegas(v) => v.rtt_noload(),
            LimitAlgorithm::Aimd(_) | LimitAlgorithm::Gradient2(_) => None,
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        match self {
            LimitAlgorithm::Aimd(a) => a.validate(),
            LimitAlgorithm::Vegas(v) => v.validate(),
            LimitAlgorithm::Gradient2(g) => g.validate(),
        }
    }

    /// A short label for metrics and tables: `aimd`, `vegas`, `gradient2`.
    pub const fn label(&self) -> &'static str {
        match self {
            LimitAlgorithm::Aimd(_) => "aimd",
            LimitAlgorithm::Vegas(_) => "vegas",
            LimitAlgorithm::Gradient2(_) => "gradient2",
        }
    }
}

/// Checks `min <= initial <= max` and `min >= 1`, naming the field under `section`.
pub(super) fn check_limits(
    fields: [&'static str; 3],
    min: u32,
    initial: u32,
    max: u32,
) -> Result<(), InvalidConfig> {
    use crate::health::Problem;
    let [min_f, initial_f, max_f] = fields;
    if min == 0 {
        return Err(InvalidConfig {
            field: min_f,
            problem: Problem::Zero,
        });
    }
    if initial < min {
        return Err(InvalidConfig {
            field: initial_f,
            problem: Problem::LessThan(min_f),
        });
    }
    if max < initial {
        return Err(InvalidConfig {
            field: max_f,
            problem: Problem::LessThan(initial_f),
        });
    }
    Ok(())
}

/// Checks a ratio in `0..=1` (exclusive of 0 when `nonzero`).
pub(super) fn check_ratio(
    field: &'static str,
    value: f64,
    nonzero: bool,
) -> Result<(), InvalidConfig> {
    use crate::health::Problem;
    if !(value.is_finite() && (0.0..=1.0).contains(&value)) || (nonzero && value == 0.0) {
        return Err(InvalidConfig {
            field,
            problem: Problem::NotARatio(value),
        });
    }
    Ok(())
}

/// `value` rounded to a limit within `min..=max`.
pub(super) fn clamp_limit(value: f64, min: u32, max: u32) -> f64 {
    value.clamp(f64::from(min), f64::from(max))
}
