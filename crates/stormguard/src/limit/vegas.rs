//! Vegas: estimate the queue from how far the RTT has grown above the no-load RTT.

use std::time::Duration;

use super::algorithm::{WindowSample, check_limits, check_ratio, clamp_limit};
use super::slow_start::{SlowStart, Step};
use crate::health::{InvalidConfig, Problem};

/// The largest RTT tolerance: beyond it the bound means nothing (a request may wait a
/// hundred of its own service times) and a typo is more likely than intent.
const MAX_TOLERANCE: f64 = 100.0;

/// TCP Vegas applied to requests (Brakmo & Peterson 1995; Netflix concurrency-limits'
/// `VegasLimit`, its default).
///
/// With `rtt_noload` the shortest RTT seen (the service time with no queue), `rtt` a
/// window's mean and `allowed` the concurrency the window was allowed (the limit's whole
/// part), the requests queued in front of the work are estimated as
/// `queue = round(allowed × (1 − rtt_noload / rtt))`. With `log = log10(allowed)`, at least
/// 1/3:
///
/// - a window with a drop: `limit − log`;
/// - `rtt > tolerance × rtt_noload` (requests wait longer than the tolerance allows, however
///   few they are): `limit × tolerance × rtt_noload / rtt`, the limit at which the queue
///   would fit the tolerance, but at most halving the limit in one window (one fast outlier —
///   a cache hit, an early error — that lowers the no-load RTT must not take the limit to its
///   minimum at once);
/// - `queue ≤ log` (no queue to speak of): `limit + 6·log` (grow fast), but at most
///   `limit + allowed` (see [below](#growing-at-most-twofold));
/// - `queue < 3·log` (alpha): `limit + log`;
/// - `queue > 6·log` (beta): `limit − log`;
/// - otherwise the limit stays.
///
/// A window in which fewer than half of the limit were in flight leaves the limit as it is
/// (the traffic did not test it).
///
/// # Why the allowed concurrency, rounded
///
/// Netflix's `VegasLimit` estimates the queue from the fractional limit and rounds it up. A
/// window's mean RTT is always above the shortest one (the work varies; the wake-ups between
/// a slot and the work vary), so the rounded-up queue is at least one request even where
/// none can wait, and below a limit of 2.15 a queue of one is inside the band that leaves the
/// limit alone (`log` floors at 1/3). A single worker whose limit fell to 1 then stays there,
/// idle through every hand-over from one request to the next: 12 % of its time with 2.2 ms
/// of work and 0.3 ms of wake-ups, where a limit of 2 keeps one request waiting and the
/// worker busy. Estimated from the concurrency the window had and rounded to the nearest
/// request, a limit of 1 shows no queue and grows, and a limit of 2 in front of one worker
/// shows the one request waiting and stays (the test
/// `vegas_keeps_one_request_waiting_for_one_worker_whose_work_varies`).
///
/// # Growing at most twofold
///
/// Netflix's rule adds `6·log` with no queue, 2 at the smallest limits (`log` floors at
/// 1/3): one worker at a limit of 1 jumps to 3, where a request waits two service times and
/// the tolerance halves the limit back to 1, and the limit swings between the two instead
/// of settling at 2, the one request waiting that keeps one worker busy. Adding at most the
/// allowed concurrency doubles a small limit at most, as slow start does; from a limit of 6
/// on (`6·log10(6) < 6`) nothing changes.
///
/// # Slow start
///
/// Before those rules, the limit begins at `initial` (1 by default) and doubles every window
/// until a window's mean RTT is more than a quarter above the shortest window mean seen so far
/// (or a request drops); it is then cut to `limit × that shortest mean / rtt`, the concurrency
/// the server got through without a queue, and the rules above take over. Each doubling is of
/// that same concurrency (the limit itself while the RTT holds), so the limit gets no further
/// than about twice the server's capacity, for one window (TCP's slow start
/// with HyStart's delay exit; see [`Gradient2`](super::Gradient2) for the same phase). A
/// server of any size is reached in `log2` of its concurrency windows (a second for a
/// thousand with 100 ms windows), and the no-load RTT is learnt at a limit too low to queue
/// behind. No probe of the no-load RTT runs meanwhile. [`Vegas::with_slow_start`] turns it
/// off: the limit then starts at `initial` under the rules above.
///
/// # Why a tolerance
///
/// Vegas's thresholds count queued *requests*, scaled by `log10(allowed)` so that a large
/// server keeps a queue worth a fraction of its concurrency. On a small server they allow a
/// queue of several service times: one worker behind a limit of 3 to 5 is stable for Vegas
/// alone (its thresholds floor at `log = 1/3`), and an admitted request waits two to four
/// times its own work. The tolerance bounds the wait in *time* instead, as Netflix's
/// Gradient2 (`rttTolerance`) and Envoy's gradient controller (`sample_aggregate_percentile`
/// against `min_rtt` with a buffer) do: a window whose mean RTT is more than `tolerance`
/// times the no-load RTT lowers the limit to where it would not be. With the default 2, a
/// request admitted by a saturated server waits at most about one service time on average,
/// whatever the server's size; large servers never reach it (their Vegas queue is a small
/// share of their concurrency).
///
/// # Probing the no-load RTT
///
/// The no-load RTT is the shortest RTT seen, so it follows a handler that gets faster at
/// once; one that gets slower (a deploy, a slower dependency) is mistaken for a queue and the
/// limit shrinks below what the server can do. So the no-load RTT is re-measured every
/// `probe_every` windows. Netflix's `VegasLimit` resets it to the next sample's RTT, which
/// under a standing queue *includes* the queue: the estimate then sees no queue and the limit
/// ratchets up with every probe. Here, as in Envoy's adaptive concurrency filter
/// (`min_rtt_calc_interval`, `min_concurrency`), the probe pins the limit to `probe_limit`
/// (or half the limit, when that is lower: a small server behind a limit of 3 keeps a queue)
/// for two windows, one to drain the queue and one to measure, then takes that window's
/// shortest RTT and restores the limit.
///
/// `stormguard simulate converge` shows the limit across a handler that gets twice slower
/// (the scenario's tests in `stormguard-sim` assert it converges within a second).
///
/// # Default
///
/// A slow start from a limit of 1 (Netflix's initial limit is 20, without one), maximum 1000,
/// minimum 1, smoothing 1 (no smoothing); a probe every 50 windows (5 s with the default
/// window; Envoy: 60 s) pinned to 3 (Envoy's `min_concurrency`); an RTT tolerance of 2 (Netflix's Gradient2 uses 1.5 for its long-term
/// ratio; 2 lets a saturated single worker keep one request waiting, so it never idles).
#[derive(Clone, Debug, PartialEq)]
pub struct Vegas {
    min: u32,
    initial: u32,
    max: u32,
    smoothing: f64,
    tolerance: f64,
    probe_every: u32,
    probe_limit: u32,
    limit: f64,
    rtt_noload: Option<Duration>,
    since_probe: u32,
    /// While probing: the limit to restore, and whether the draining window is over.
    probing: Option<(f64, bool)>,
    slow_start: SlowStart,
}

impl Default for Vegas {
    fn default() -> Self {
        Vegas::new()
    }
}

impl Vegas {
    /// The defaults (see [the type's docs](Vegas#default)).
    pub const fn new() -> Self {
        Vegas {
            min: 1,
            initial: 1,
            max: 1000,
            smoothing: 1.0,
            tolerance: 2.0,
            probe_every: 50,
            probe_limit: 3,
            limit: 1.0,
            rtt_noload: None,
            since_probe: 0,
            probing: None,
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

    /// Whether the limit grows from `initial` in a [slow start](Vegas#slow-start) (the
    /// default) or starts there under Vegas's own rules.
    pub const fn with_slow_start(mut self, enabled: bool) -> Self {
        self.slow_start = SlowStart::new(enabled);
        self
    }

    /// Lowers the limit whenever a window's mean RTT is more than `tolerance` (at least 1)
    /// times the no-load RTT (see [why a tolerance](Vegas#why-a-tolerance)).
    pub const fn with_tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Re-measures the no-load RTT every `windows` windows, with the limit pinned to
    /// `limit` (at least 1) while it does (see [probing](Vegas#probing-the-no-load-rtt)).
    pub const fn with_probe(mut self, windows: u32, limit: u32) -> Self {
        self.probe_every = windows;
        self.probe_limit = limit;
        self
    }

    /// Checks every field; the error names the first bad one (`limit.vegas.…`).
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        check_limits(
            ["limit.vegas.min", "limit.vegas.initial", "limit.vegas.max"],
            self.min,
            self.initial,
            self.max,
        )?;
        check_ratio("limit.vegas.smoothing", self.smoothing, true)?;
        if !(self.tolerance >= 1.0 && self.tolerance.is_finite()) {
            return Err(InvalidConfig {
                field: "limit.vegas.tolerance",
                problem: Problem::BelowOne(self.tolerance),
            });
        }
        if self.tolerance > MAX_TOLERANCE {
            return Err(InvalidConfig {
                field: "limit.vegas.tolerance",
                problem: Problem::TooLarge(MAX_TOLERANCE as u64),
            });
        }
        if self.probe_every == 0 {
            return Err(InvalidConfig {
                field: "limit.vegas.probe_every",
                problem: Problem::Zero,
            });
        }
        if self.probe_limit == 0 {
            return Err(InvalidConfig {
                field: "limit.vegas.probe_limit",
                problem: Problem::Zero,
            });
        }
        Ok(())
    }

    /// The limit now.
    pub fn limit(&self) -> u32 {
        self.limit as u32
    }

    /// The no-load RTT the queue is estimated against, once a window has been seen.
    pub fn rtt_noload(&self) -> Option<Duration> {
        self.rtt_noload
    }

    /// Whether the limit is still in its [slow start](Vegas#slow-start).
    pub fn in_slow_start(&self) -> bool {
        self.slow_start.active()
    }

    pub(super) fn update(&mut self, w: &WindowSample) -> u32 {
        if w.samples == 0 || w.rtt.is_zero() {
            return self.limit();
        }
        let window_min = w.min_rtt.max(Duration::from_nanos(1));
        match self.probing {
            Some((saved, false)) => {
                self.probing = Some((saved, true));
                return self.limit();
            }
            Some((saved, true)) => {
                self.probing = None;
                self.rtt_noload = Some(window_min);
                self.limit = saved;
                return self.limit();
            }
            None => {}
        }
        match self.slow_start.update(self.limit, w) {
            Step::Within(limit) | Step::Leave(limit) => {
                self.rtt_noload = Some(self.rtt_noload.map_or(window_min, |n| n.min(window_min)));
                self.limit = clamp_limit(limit, self.min, self.max);
                return self.limit();
            }
            Step::Over => {}
        }
        self.since_probe += 1;
        if self.since_probe >= self.probe_every && self.rtt_noload.is_some() {
            self.since_probe = 0;
            self.probing = Some((self.limit, false));
            // Half the limit when that is lower: one worker behind a limit of 2 or 3 keeps a
            // queue at a probe limit of 3, and the probe would learn the queue.
            let pinned = f64::from(self.probe_limit).min((self.limit / 2.0).max(1.0));
            self.limit = self.limit.min(pinned);
            return self.limit();
        }
        let noload = self.rtt_noload.map_or(window_min, |n| n.min(window_min));
        self.rtt_noload = Some(noload);
        let limit = self.limit;
        // The concurrency the window was allowed (admission takes the limit's whole part):
        // the queue is estimated from it and the thresholds scale with it.
        let allowed = limit.floor().max(1.0);
        let log = allowed.log10().max(1.0 / 3.0);
        let stretch = w.rtt.as_secs_f64() / noload.as_secs_f64();
        let target = if w.dropped > 0 {
            limit - log
        } else if f64::from(w.max_in_flight) * 2.0 < limit {
            return self.limit();
        } else if stretch > self.tolerance {
            (limit * self.tolerance / stretch).max(limit / 2.0)
        } else {
            let queue = (allowed * (1.0 - 1.0 / stretch)).round();
            if queue <= log {
                limit + (6.0 * log).min(allowed)
            } else if queue < 3.0 * log {
                limit + log
            } else if queue > 6.0 * log {
                limit - log
            } else {
                return self.limit();
            }
        };
        let target = clamp_limit(target, self.min, self.max);
        self.limit = (1.0 - self.smoothing) * limit + self.smoothing * target;
        self.limit()
    }
}
