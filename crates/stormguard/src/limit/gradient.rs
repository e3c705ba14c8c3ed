//! Gradient2: compare the short-term RTT with a long-term average of it.

use super::algorithm::{WindowSample, check_limits, check_ratio, clamp_limit};
use super::slow_start::{SlowStart, Step};
use crate::health::{InvalidConfig, Problem};

/// Netflix concurrency-limits' `Gradient2Limit`, the same idea as Envoy's adaptive concurrency
/// filter (its "gradient controller"): the limit follows the ratio of a long-term RTT to the
/// short-term one.
///
/// Per window, with `short` the window's mean RTT and `long` an exponential average over
/// `long_window` windows (a plain mean over the first ten):
///
/// ```text
/// gradient = clamp(tolerance × long / short, 0.5, 1.0)
/// new      = limit × gradient + queue_size
/// limit    = (1 − smoothing) × limit + smoothing × new        (within min..=max)
/// ```
///
/// While latency holds, the gradient is 1 and the limit grows by `queue_size` (scaled by the
/// smoothing) per window; once the short RTT exceeds `tolerance` times the long one, it
/// shrinks, by half at most per window. When the long average is more than twice the short
/// RTT (latency back to normal after a long overload), the long average is pulled down by 5 %
/// per window so that it does not keep the limit high. A window in which fewer than half of
/// the limit were in flight leaves the limit as it is. Drops are not used: the RTT says it all.
///
/// Envoy computes `gradient = (min_rtt + buffer) / sample_rtt` against a minimum RTT it
/// re-measures every minute by pinning the concurrency to 3; Gradient2's long average needs no
/// such pause, which is why it is the one implemented here.
///
/// # Slow start
///
/// As [`Vegas`](super::Vegas#slow-start): the limit begins at `initial` and doubles every
/// window until a window's mean RTT is more than a quarter above the shortest window mean seen
/// so far, then is cut to `limit × that shortest mean / rtt` and the gradient rule takes over.
/// The long-term average is fed meanwhile, from windows without a queue: the baseline the
/// gradient then starts from. With Netflix's floor of 20 the slow start begins at 20; give a
/// small server `with_limits(1, 1, max)`. [`Gradient2::with_slow_start`] turns it off.
///
/// # Default
///
/// Netflix's: initial limit 20, minimum 20, maximum 200, smoothing 0.2, RTT tolerance 1.5,
/// queue size 4; the long window is 60 windows (Netflix: 600 samples). A slow start (Netflix
/// has none).
#[derive(Clone, Debug, PartialEq)]
pub struct Gradient2 {
    min: u32,
    initial: u32,
    max: u32,
    smoothing: f64,
    tolerance: f64,
    queue_size: u32,
    long_window: u32,
    limit: f64,
    long_rtt: f64,
    windows: u32,
    slow_start: SlowStart,
}

impl Default for Gradient2 {
    fn default() -> Self {
        Gradient2::new()
    }
}

/// Windows averaged plainly before the exponential average takes over.
const WARMUP: u32 = 10;

impl Gradient2 {
    /// The defaults (see [the type's docs](Gradient2#default)).
    pub const fn new() -> Self {
        Gradient2 {
            min: 20,
            initial: 20,
            max: 200,
            smoothing: 0.2,
            tolerance: 1.5,
            queue_size: 4,
            long_window: 60,
            limit: 20.0,
            long_rtt: 0.0,
            windows: 0,
            slow_start: SlowStart::new(true),
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

    /// Moves the limit only this share (in `0..=1`, not 0) of the way to each new value
    /// (slow start's doubling and its cut are not smoothed).
    pub const fn with_smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = smoothing;
        self
    }

    /// Whether the limit grows from `initial` in a [slow start](Gradient2#slow-start) (the
    /// default) or starts there under the gradient rule.
    pub const fn with_slow_start(mut self, enabled: bool) -> Self {
        self.slow_start = SlowStart::new(enabled);
        self
    }

    /// How much longer than the long-term RTT the short-term RTT may get (`>= 1`) before
    /// the limit shrinks.
    pub const fn with_tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The headroom added per window: how many requests may queue.
    pub const fn with_queue_size(mut self, queue_size: u32) -> Self {
        self.queue_size = queue_size;
        self
    }

    /// The long-term average spans about this many windows.
    pub const fn with_long_window(mut self, windows: u32) -> Self {
        self.long_window = windows;
        self
    }

    /// Checks every field; the error names the first bad one (`limit.gradient2.…`).
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        check_limits(
            [
                "limit.gradient2.min",
                "limit.gradient2.initial",
                "limit.gradient2.max",
            ],
            self.min,
            self.initial,
            self.max,
        )?;
        check_ratio("limit.gradient2.smoothing", self.smoothing, true)?;
        if !(self.tolerance.is_finite() && self.tolerance >= 1.0) {
            return Err(InvalidConfig {
                field: "limit.gradient2.tolerance",
                problem: Problem::BelowOne(self.tolerance),
            });
        }
        if self.long_window == 0 {
            return Err(InvalidConfig {
                field: "limit.gradient2.long_window",
                problem: Problem::Zero,
            });
        }
        Ok(())
    }

    /// The limit now.
    pub fn limit(&self) -> u32 {
        self.limit as u32
    }

    /// Whether the limit is still in its [slow start](Gradient2#slow-start).
    pub fn in_slow_start(&self) -> bool {
        self.slow_start.active()
    }

    pub(super) fn update(&mut self, w: &WindowSample) -> u32 {
        if w.samples == 0 || w.rtt.is_zero() {
            return self.limit();
        }
        let short = w.rtt.as_secs_f64();
        self.windows = self.windows.saturating_add(1);
        if self.windows <= WARMUP {
            self.long_rtt += (short - self.long_rtt) / f64::from(self.windows);
        } else {
            let factor = 2.0 / (f64::from(self.long_window) + 1.0);
            self.long_rtt += (short - self.long_rtt) * factor;
        }
        if self.long_rtt / short > 2.0 {
            self.long_rtt *= 0.95;
        }
        match self.slow_start.update(self.limit, w) {
            Step::Within(limit) | Step::Leave(limit) => {
                self.limit = clamp_limit(limit, self.min, self.max);
                return self.limit();
            }
            Step::Over => {}
        }
        if f64::from(w.max_in_flight) * 2.0 < self.limit {
            return self.limit();
        }
        let gradient = (self.tolerance * self.long_rtt / short).clamp(0.5, 1.0);
        let new = self.limit * gradient + f64::from(self.queue_size);
        let new = (1.0 - self.smoothing) * self.limit + self.smoothing * new;
        self.limit = clamp_limit(new, self.min, self.max);
        self.limit()
    }
}
