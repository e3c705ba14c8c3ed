//! Slow start: begin with a low limit, double it per window while no queue forms, and leave
//! at the first sign of one, cut to what the server served without queueing.
//!
//! # Why
//!
//! A limit that starts high (Netflix's 20) in front of a small server lets a queue form
//! before the algorithm has seen a single window, and an RTT-based algorithm then learns its
//! baseline from round trips that already include the queue. One that starts low and grows
//! additively (Vegas's `+6·log10(limit)` per window) takes seconds to reach a large server's
//! concurrency. TCP solved the same pair of problems with slow start: the congestion window
//! begins small and doubles every round trip until the first loss. Its delay-based exit,
//! HyStart (Ha & Rhee 2008; HyStart++, RFC 9406), leaves when the round trip rises by more
//! than an eighth instead of waiting for a loss, which is what a server wants: the queue is
//! the harm, not a symptom of it.
//!
//! # The rule, once per window, while in slow start
//!
//! With `base` the shortest window mean RTT seen so far in slow start (the round trip
//! without a queue: the first window runs at the low initial limit):
//!
//! - a window with a drop: leave; the algorithm's own rule handles the window;
//! - a window in which fewer than half of the limit were in flight: the limit stays (the
//!   traffic did not test it), and its RTT still counts towards `base`;
//! - a mean RTT more than [`QUEUE_SIGN`] above `base`: leave, with the limit cut to
//!   `limit × base / rtt`, the concurrency the server got through without a queue (Little's
//!   law: at a throughput of `limit / rtt`, `base` per request keeps that many busy). A
//!   saturated server of capacity `C` behind a limit `L > C` has `rtt = L / C × base`, so
//!   the cut lands on `C`: the doubling that found the queue is undone, not kept;
//! - otherwise the limit doubles (up to the maximum): twice `limit × base / rtt`, what was
//!   served without a queue, which is the limit itself while the round trip holds. A window
//!   whose queue stays within the quarter is not doubled past twice the server's capacity:
//!   the limit never gets beyond about twice the capacity, for one window (TCP's slow start
//!   overshoots by the same factor, once).
//!
//! The algorithm's own rule runs from the window after on. Slow start is entered once, when
//! the algorithm is made.
//!
//! It compares window *means* where HyStart compares per-round minima: a window's minimum
//! is set by a request admitted before the limit last grew, which never queued, so it rises
//! one window late and the limit would have doubled twice. A mean is noisier than a minimum,
//! hence the threshold of a quarter rather than HyStart's eighth.

use super::algorithm::WindowSample;

/// How far above the baseline a window's mean RTT must rise to count as a queue: a quarter.
pub(super) const QUEUE_SIGN: f64 = 0.25;

/// Where an algorithm is in its slow start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct SlowStart {
    /// Still growing exponentially.
    active: bool,
    /// The shortest window mean RTT seen in slow start, in seconds; 0 before the first.
    base: f64,
}

/// What slow start made of a window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Step {
    /// Slow start is over: the algorithm's own rule applies.
    Over,
    /// Still in slow start: the new limit (doubled, or unchanged in a window that did not
    /// test it).
    Within(f64),
    /// Left slow start at this window: the limit cut to what was served without a queue.
    Leave(f64),
}

impl SlowStart {
    /// In slow start when `enabled`.
    pub(super) const fn new(enabled: bool) -> Self {
        SlowStart {
            active: enabled,
            base: 0.0,
        }
    }

    /// Whether the limit still grows exponentially.
    pub(super) const fn active(&self) -> bool {
        self.active
    }

    /// Takes one window at `limit`; the caller clamps what it gets to its bounds.
    pub(super) fn update(&mut self, limit: f64, w: &WindowSample) -> Step {
        if !self.active {
            return Step::Over;
        }
        if w.dropped > 0 {
            self.active = false;
            return Step::Over;
        }
        let rtt = w.rtt.as_secs_f64();
        if self.base == 0.0 || rtt < self.base {
            self.base = rtt;
        }
        if f64::from(w.max_in_flight) * 2.0 < limit {
            return Step::Within(limit);
        }
        // What the server got through without a queue (Little's law): the limit itself
        // while the round trip holds.
        let served = (limit * self.base / rtt).min(limit);
        if rtt > self.base * (1.0 + QUEUE_SIGN) {
            self.active = false;
            return Step::Leave(served);
        }
        Step::Within(served * 2.0)
    }
}
