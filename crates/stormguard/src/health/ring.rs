//! The count-based window's storage: the last *N* calls in a ring, with running totals,
//! behind one mutex (see the [module documentation](super#cost) for why).

use super::counts::{Call, HealthCounts};
use super::latency;

/// A count-based window: the last `calls` calls in a ring, with running totals.
#[derive(Debug)]
pub(super) struct Ring {
    /// Each call and its latency bucket.
    calls: Vec<(Call, u8)>,
    /// Where the next call goes.
    next: usize,
    /// How many slots hold a call.
    len: usize,
    pub(super) totals: HealthCounts,
    pub(super) latency: Box<[u64; latency::BUCKETS]>,
}

impl Ring {
    /// An empty ring of `calls` slots.
    pub(super) fn new(calls: u32) -> Ring {
        Ring {
            calls: vec![(Call::EMPTY, 0); calls as usize],
            next: 0,
            len: 0,
            totals: HealthCounts::default(),
            latency: Box::new([0; latency::BUCKETS]),
        }
    }

    /// Adds a call (evicting the oldest once full) and returns the new totals.
    #[inline]
    pub(super) fn record(&mut self, call: Call, bucket: usize) -> HealthCounts {
        let Ring {
            calls,
            next,
            len,
            totals,
            latency,
        } = self;
        if *len == calls.len() {
            let (old, old_bucket) = calls[*next];
            totals.sub(&old.counts());
            latency[usize::from(old_bucket)] -= 1;
        } else {
            *len += 1;
        }
        // `bucket < latency::BUCKETS <= 256`.
        calls[*next] = (call, bucket as u8);
        *next = (*next + 1) % calls.len();
        totals.add(&call.counts());
        latency[bucket] += 1;
        *totals
    }

    /// Forgets every call.
    pub(super) fn reset(&mut self) {
        self.next = 0;
        self.len = 0;
        self.totals = HealthCounts::default();
        self.latency.fill(0);
    }
}
