//! The short queue in front of the limit: CoDel-style waiting times and adaptive LIFO.
//!
//! From Facebook's "Fail at Scale" (Maurer, ACM Queue 2015), after Nichols & Jacobson's CoDel:
//! a queue that has been empty at some point in the last `interval` is absorbing a burst, and
//! a request may wait up to `interval` in it; a queue that has not is a *standing* queue, the
//! server is overloaded, and a request may wait only `target` before it is shed. While the
//! queue stands, the newest waiter is served first (adaptive LIFO): the oldest have the least
//! time left and their callers are the likeliest to have given up.
//!
//! Both waits are also capped by what the limiter knows of its round trips. An admitted
//! request should wait about one no-load round trip at most, queue in front of the limit and
//! queue behind it together (Vegas's RTT tolerance of 2 says the same of the queue behind
//! it): with the limiter's expected round trip (the last window's mean) and its no-load round
//! trip, the queue in front gets what is left, `2 × no_load − expected`, in either mode. A
//! limit that already keeps one service time of queue behind it leaves none: its server is
//! busy without waiters, and a waiter would double the latency the limit protects. Without a
//! no-load estimate (AIMD, Gradient2) the cap is one expected round trip, and a burst may
//! always wait `target`. With a 2 ms handler a standing queue then holds requests for about
//! one round trip at most instead of CoDel's fixed 5 ms (100 ms while bursting).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// The queue's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct QueueConfig {
    pub(super) capacity: usize,
    pub(super) target: Duration,
    pub(super) interval: Duration,
}

impl QueueConfig {
    /// How long a request joining the queue may wait: CoDel's `target` while the queue
    /// stands, its `interval` while it absorbs a burst, capped by the limiter's round trips
    /// (see [the module docs](self)): `expected` is what an admitted request currently takes,
    /// `no_load` what it takes without a queue.
    fn patience(
        &self,
        standing: bool,
        expected: Option<Duration>,
        no_load: Option<Duration>,
    ) -> Duration {
        let codel = if standing { self.target } else { self.interval };
        match (expected, no_load) {
            (Some(expected), Some(no_load)) => {
                codel.min(no_load.saturating_mul(2).saturating_sub(expected))
            }
            (Some(round_trip), None) if standing => codel.min(round_trip),
            (Some(round_trip), None) => codel.min(round_trip.max(self.target)),
            (None, _) => codel,
        }
    }
}

#[derive(Debug)]
struct State {
    waiters: VecDeque<oneshot::Sender<()>>,
    last_empty: Instant,
}

/// Requests waiting for a slot.
#[derive(Debug)]
pub(super) struct WaitQueue {
    config: QueueConfig,
    state: Mutex<State>,
    /// The waiters' count as of the last change: a release with nobody waiting takes no lock.
    len_hint: AtomicUsize,
}

/// A place in the queue: wait on `wake` for at most `patience`.
pub(super) struct Place {
    pub(super) wake: oneshot::Receiver<()>,
    pub(super) patience: Duration,
}

impl WaitQueue {
    pub(super) fn new(config: QueueConfig, now: Instant) -> Self {
        WaitQueue {
            config,
            state: Mutex::new(State {
                waiters: VecDeque::with_capacity(config.capacity),
                last_empty: now,
            }),
            len_hint: AtomicUsize::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Joins the queue at `now`, or `None` when it is full (or has no room at all).
    /// `expected` and `no_load` are the limiter's round trips (none known yet: no cap).
    pub(super) fn join(
        &self,
        now: Instant,
        expected: Option<Duration>,
        no_load: Option<Duration>,
    ) -> Option<Place> {
        if self.config.capacity == 0 {
            return None;
        }
        let mut state = self.state();
        state.waiters.retain(|w| !w.is_closed());
        if state.waiters.is_empty() {
            state.last_empty = now;
        }
        if state.waiters.len() >= self.config.capacity {
            return None;
        }
        let standing = now.saturating_duration_since(state.last_empty) > self.config.interval;
        let (tx, wake) = oneshot::channel();
        state.waiters.push_back(tx);
        self.len_hint.store(state.waiters.len(), Ordering::Relaxed);
        Some(Place {
            wake,
            patience: self.config.patience(standing, expected, no_load),
        })
    }

    /// A slot was given back at `now`: wakes one waiter, the newest while the queue stands.
    pub(super) fn wake_one(&self, now: Instant) {
        if self.len_hint.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut state = self.state();
        let standing = now.saturating_duration_since(state.last_empty) > self.config.interval;
        loop {
            let next = if standing {
                state.waiters.pop_back()
            } else {
                state.waiters.pop_front()
            };
            let Some(waiter) = next else {
                state.last_empty = now;
                self.len_hint.store(0, Ordering::Relaxed);
                return;
            };
            if waiter.send(()).is_ok() {
                if state.waiters.is_empty() {
                    state.last_empty = now;
                }
                self.len_hint.store(state.waiters.len(), Ordering::Relaxed);
                return;
            }
        }
    }

    /// Waiters (some may have given up).
    pub(super) fn len(&self) -> usize {
        self.len_hint.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn config() -> QueueConfig {
        QueueConfig {
            capacity: 8,
            target: MS(5),
            interval: MS(100),
        }
    }

    #[test]
    fn without_a_known_round_trip_the_waits_are_codels() {
        assert_eq!(config().patience(false, None, None), MS(100));
        assert_eq!(config().patience(true, None, None), MS(5));
    }

    #[test]
    fn a_short_round_trip_caps_both_waits_but_a_burst_keeps_the_target() {
        assert_eq!(config().patience(false, Some(MS(2)), None), MS(5));
        assert_eq!(config().patience(true, Some(MS(2)), None), MS(2));
        assert_eq!(config().patience(false, Some(MS(20)), None), MS(20));
        assert_eq!(config().patience(true, Some(MS(20)), None), MS(5));
    }

    #[test]
    fn a_long_round_trip_leaves_codels_waits() {
        assert_eq!(config().patience(false, Some(MS(500)), None), MS(100));
        assert_eq!(config().patience(true, Some(MS(500)), None), MS(5));
    }

    /// A 2 ms handler: with no queue behind the limit (the expected round trip is the no-load
    /// one) a waiter may wait one round trip, burst or not; with half a round trip of queue
    /// behind it, half; with a whole one (one worker behind a limit of 2), none.
    #[test]
    fn the_queue_gets_what_the_queue_behind_the_limit_leaves_of_one_no_load_round_trip() {
        let no_load = Some(MS(2));
        for standing in [false, true] {
            assert_eq!(config().patience(standing, Some(MS(2)), no_load), MS(2));
            assert_eq!(config().patience(standing, Some(MS(3)), no_load), MS(1));
            assert_eq!(config().patience(standing, Some(MS(4)), no_load), MS(0));
            assert_eq!(config().patience(standing, Some(MS(9)), no_load), MS(0));
        }
        // A slow handler: CoDel's waits are shorter than the budget.
        assert_eq!(config().patience(true, Some(MS(50)), Some(MS(50))), MS(5));
        assert_eq!(
            config().patience(false, Some(MS(500)), Some(MS(500))),
            MS(100)
        );
    }
}
