//! What the limit layer counts, read with [`AdaptiveLimitLayer::stats`](super::AdaptiveLimitLayer::stats),
//! and the same events as metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Why the layer shed a request, before its handler ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShedReason {
    /// Its remaining deadline was shorter than the time admitted requests take.
    Deadline,
    /// No slot under the limit, and the queue was full (or disabled).
    QueueFull,
    /// It waited in the queue longer than the queue allows (CoDel target or interval).
    QueueTimeout,
}

impl ShedReason {
    /// The metric label: `deadline`, `queue_full`, `queue_timeout`.
    pub const fn label(self) -> &'static str {
        match self {
            ShedReason::Deadline => "deadline",
            ShedReason::QueueFull => "queue_full",
            ShedReason::QueueTimeout => "queue_timeout",
        }
    }
}

/// Counters of the limit layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitStats {
    /// Requests admitted (at once or after waiting).
    pub admitted: u64,
    /// Requests admitted after waiting in the queue.
    pub queued: u64,
    /// Requests shed because their deadline was too close.
    pub shed_deadline: u64,
    /// Requests shed because the queue was full.
    pub shed_queue_full: u64,
    /// Requests shed after waiting too long in the queue.
    pub shed_queue_timeout: u64,
}

impl LimitStats {
    /// Every request shed, whatever the reason.
    pub fn shed(&self) -> u64 {
        self.shed_deadline + self.shed_queue_full + self.shed_queue_timeout
    }
}

#[derive(Debug, Default)]
pub(super) struct LimitCounters {
    admitted: AtomicU64,
    queued: AtomicU64,
    shed: [AtomicU64; 3],
}

impl LimitCounters {
    pub(super) fn admitted(&self, waited: Option<Duration>) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
        if waited.is_some() {
            self.queued.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        if let Some(waited) = waited {
            metrics::histogram!(crate::metric_names::LIMIT_QUEUE_DELAY)
                .record(waited.as_secs_f64());
        }
    }

    pub(super) fn shed(&self, reason: ShedReason) {
        let i = match reason {
            ShedReason::Deadline => 0,
            ShedReason::QueueFull => 1,
            ShedReason::QueueTimeout => 2,
        };
        if let Some(c) = self.shed.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        metrics::counter!(crate::metric_names::LIMIT_SHED, "reason" => reason.label()).increment(1);
    }

    pub(super) fn snapshot(&self) -> LimitStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LimitStats {
            admitted: get(&self.admitted),
            queued: get(&self.queued),
            shed_deadline: get(&self.shed[0]),
            shed_queue_full: get(&self.shed[1]),
            shed_queue_timeout: get(&self.shed[2]),
        }
    }
}
