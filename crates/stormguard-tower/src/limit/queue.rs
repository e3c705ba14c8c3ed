//! The short queue in front of the limit: CoDel-style waiting times and adaptive LIFO.
//!
//! From Facebook's "Fail at Scale" (Maurer, ACM Queue 2015), after Nichols & Jacobson's CoDel:
//! a queue that has been empty at some point in the last `interval` is absorbing a burst, and
//! a request may wait up to `interval` in it; a queue that has not is a *standing* queue, the
//! server is overloaded, and a request may wait only `target` before it is shed. While the
//! queue stands, the newest waiter is served first (adaptive LIFO): the oldest have the least
//! time left and their callers are the likeliest to have given up.

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
    pub(super) fn join(&self, now: Instant) -> Option<Place> {
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
            patience: if standing {
                self.config.target
            } else {
                self.config.interval
            },
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
