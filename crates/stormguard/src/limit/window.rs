//! The current window's round-trip times, kept per releasing thread.
//!
//! # Why per thread
//!
//! Every release adds a sample, so adding one is on every request's path. A shared counter
//! that every releasing thread increments is a locked read-modify-write on one cache line
//! that bounces between cores: it was the costliest step of a release, beside the two
//! in-flight updates that admission cannot do without. Here each thread that releases owns a
//! [`Shard`] of running totals (through [`thread_local::ThreadLocal`], as the health
//! window's shards): it is their only writer, so a sample is two plain loads and stores. The
//! window's closer — one at a time, under the limiter's update lock — adds up the shards and
//! subtracts the totals it saw at the last close. Totals only grow (wrapping), so nothing is
//! ever reset under a writer's feet: a closer racing a sample in progress may see its count
//! and not yet its time, and the next window then gets the time.
//!
//! A thread's first sample allocates its shard, once per thread and limiter.

use std::sync::atomic::{AtomicU64, Ordering};

use thread_local::ThreadLocal;

/// One thread's running totals. Aligned so that two threads' shards never share a cache
/// line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// The totals of every shard at the last close.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Seen {
    count: u64,
    sum_ns: u64,
}

/// Round-trip samples of every releasing thread.
#[derive(Debug, Default)]
pub(super) struct Samples {
    shards: ThreadLocal<Shard>,
}

impl Samples {
    /// Adds one round trip of `rtt_ns` nanoseconds.
    #[inline]
    pub(super) fn add(&self, rtt_ns: u64) {
        let shard = self.shards.get_or_default();
        // The owning thread is the only writer: no read-modify-write needed.
        let count = shard.count.load(Ordering::Relaxed);
        shard.count.store(count.wrapping_add(1), Ordering::Relaxed);
        let sum = shard.sum_ns.load(Ordering::Relaxed);
        shard
            .sum_ns
            .store(sum.wrapping_add(rtt_ns), Ordering::Relaxed);
    }

    /// The samples since `seen`, as (count, sum of nanoseconds), if there are at least
    /// `at_least` (and one) of them; `seen` then moves on to now. With fewer, nothing
    /// changes: they stay in the window.
    pub(super) fn take(&self, seen: &mut Seen, at_least: u64) -> Option<(u64, u64)> {
        let (count, sum_ns) = self.shards.iter().fold((0u64, 0u64), |(c, s), shard| {
            (
                c.wrapping_add(shard.count.load(Ordering::Relaxed)),
                s.wrapping_add(shard.sum_ns.load(Ordering::Relaxed)),
            )
        });
        let samples = count.wrapping_sub(seen.count);
        if samples < at_least.max(1) {
            return None;
        }
        let sum = sum_ns.wrapping_sub(seen.sum_ns);
        *seen = Seen { count, sum_ns };
        Some((samples, sum))
    }
}
