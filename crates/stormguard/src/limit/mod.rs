//! Adaptive concurrency limits: how many requests a server should work on at once, learned
//! from how long its requests take.
//!
//! # Why limit concurrency, and why adaptively?
//!
//! A server past its capacity does not serve fewer requests well; it serves every request
//! badly. Requests queue, each waits longer than its caller will, the work done for callers
//! that left is wasted, and callers that retry add load exactly when there is the least room
//! for it: the metastable failure of Bronson et al. (HotOS 2021), sustained by a server that
//! keeps accepting work it cannot finish in time. Retry budgets stop this only when the callers
//! use them; a server has to protect itself from those that do not. Refusing early and cheaply
//! (a 503 costs microseconds) keeps the work that *is* admitted fast.
//!
//! By Little's law the right number of requests in flight is throughput × latency with no
//! queue, and both change: a deploy makes the handler slower, a dependency degrades, the
//! machine is shared. A static limit (tower's `ConcurrencyLimit`) is right for one of those
//! states. The algorithms here find it from the requests themselves, the way TCP finds a
//! path's window: they watch the round-trip time (admission to release) and the drops
//! (timeouts, deadline cancellations, overload answers from below) and move the limit:
//!
//! | algorithm | signal | source |
//! | --- | --- | --- |
//! | [`Aimd`] | drops only | TCP Reno; Netflix concurrency-limits `AIMDLimit` |
//! | [`Vegas`] | RTT over the no-load RTT (estimated queue) | TCP Vegas (Brakmo & Peterson 1995); Netflix `VegasLimit` |
//! | [`Gradient2`] | short-term RTT over its long-term average | Netflix `Gradient2Limit`; Envoy's adaptive concurrency filter (gradient controller) |
//!
//! Vegas and Gradient2 begin with a *slow start*, as TCP does: the limit starts low (Vegas: 1)
//! and doubles every window until the round trip grows by a quarter (HyStart's delay exit),
//! then is cut to the concurrency that was served without a queue and their own rule takes
//! over ([`Vegas`'s docs](Vegas#slow-start)). A large server is reached in a second, and a
//! small one is never handed Netflix's initial 20 requests before the first window.
//!
//! # The limiter
//!
//! A [`Limiter`] holds the current limit and the requests in flight in atomics:
//! [`Limiter::try_acquire`] admits a request while fewer than the limit are in flight (one
//! compare-and-swap) and hands back a [`Ticket`]; [`Limiter::release`] gives the slot back (one
//! atomic subtraction) and adds the request's RTT to the current window, in running totals of
//! the releasing thread's own (plain loads and stores, no shared write). No lock, and no
//! allocation after a thread's first release. The ticket keeps the admission instant as it
//! is, so the pair does one clock subtraction (the RTT) and one comparison with the window's
//! end, held as an instant in a sequence-locked cell that only the window's closer writes: an
//! `Instant` subtraction is a call into std of about 70 instructions, the largest step of a
//! pair once there were two. Once per window ([`LimiterConfig::with_window`], 100 ms and 10
//! samples by default, fewer at a lower limit; after Envoy's
//! `concurrency_update_interval` and Netflix's `WindowedLimit`), the release that closes it
//! feeds the window's [`WindowSample`] to the algorithm and publishes the new limit. Requests
//! may be split into partitions with guaranteed shares ([`LimiterConfig::with_partitions`], as
//! Netflix's partitioned limiter: a partition under its share is admitted even when the total
//! is at the limit; one over its share only while the total is under it). A queue in front of
//! the limiter hands a finished request's slot straight to a waiting one with
//! [`Limiter::pass_on`]: the slot never comes free, so no newcomer overtakes the waiters.
//!
//! Time is passed in (`now`), read by the caller from an injected [`Clock`]: tests drive a
//! limiter with a [`ManualClock`](crate::clock::ManualClock), the simulator with its virtual
//! clock, and a tower layer with tokio's clock, which it reads anyway.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use stormguard::classify::Outcome;
//! use stormguard::clock::ManualClock;
//! use stormguard::limit::{Limiter, LimiterConfig, Vegas};
//!
//! let manual = ManualClock::new();
//! let clock = manual.clock();
//! let limiter = Limiter::new(LimiterConfig::new(Vegas::new().with_limits(1, 4, 100)), &clock)?;
//! let tickets: Vec<_> = (0..4).map(|_| limiter.try_acquire(0, clock.now()).unwrap()).collect();
//! assert!(limiter.try_acquire(0, clock.now()).is_err(), "four in flight: at the limit");
//! manual.advance(Duration::from_millis(5));
//! for ticket in tickets {
//!     limiter.release(ticket, clock.now(), Outcome::Success);
//! }
//! assert_eq!(limiter.in_flight(), 0);
//! # Ok::<(), stormguard::health::InvalidConfig>(())
//! ```

mod aimd;
mod algorithm;
mod gradient;
mod slow_start;
#[cfg(test)]
mod tests;
mod vegas;
mod window;

pub use aimd::Aimd;
pub use algorithm::{LimitAlgorithm, WindowSample};
pub use gradient::Gradient2;
pub use vegas::Vegas;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::atomic::AtomicCell;

use crate::classify::Outcome;
use crate::clock::Clock;
use crate::health::{InvalidConfig, Problem};
use window::{Samples, Seen};

/// The most partitions a limiter may have.
pub const MAX_PARTITIONS: usize = 16;

/// How a [`Limiter`] is set up: the algorithm, the window its samples are gathered in, and
/// optional partitions.
///
/// # Default
///
/// [`Vegas`] with its defaults (a slow start from a limit of 1), windows of at least 100 ms
/// and 10 samples, no partitions.
///
/// ```
/// use std::time::Duration;
/// use stormguard::limit::{Gradient2, LimiterConfig};
///
/// let config = LimiterConfig::new(Gradient2::new())
///     .with_window(Duration::from_millis(50), 20)
///     .with_partitions(vec![0.8, 0.2]);
/// assert!(config.validate().is_ok());
/// let bad = LimiterConfig::default().with_partitions(vec![0.8, 0.3]);
/// assert_eq!(bad.validate().unwrap_err().field, "limit.partitions");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LimiterConfig {
    algorithm: LimitAlgorithm,
    window: Duration,
    min_samples: u32,
    partitions: Vec<f64>,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig::new(Vegas::new())
    }
}

impl LimiterConfig {
    /// `algorithm` with the default window and no partitions.
    pub fn new(algorithm: impl Into<LimitAlgorithm>) -> Self {
        LimiterConfig {
            algorithm: algorithm.into(),
            window: Duration::from_millis(100),
            min_samples: 10,
            partitions: Vec::new(),
        }
    }

    /// The algorithm runs once per window of at least `length` and `min_samples` samples (or
    /// as many samples as the limit, when the limit is lower: one round of it).
    pub fn with_window(mut self, length: Duration, min_samples: u32) -> Self {
        self.window = length;
        self.min_samples = min_samples;
        self
    }

    /// Splits the limit into partitions with these guaranteed shares (each in `0..=1`,
    /// summing to at most 1), addressed by index in [`Limiter::try_acquire`].
    pub fn with_partitions(mut self, shares: Vec<f64>) -> Self {
        self.partitions = shares;
        self
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &LimitAlgorithm {
        &self.algorithm
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        self.algorithm.validate()?;
        if self.window.is_zero() {
            return Err(InvalidConfig {
                field: "limit.window",
                problem: Problem::Zero,
            });
        }
        if self.min_samples == 0 {
            return Err(InvalidConfig {
                field: "limit.min_samples",
                problem: Problem::Zero,
            });
        }
        if self.partitions.len() > MAX_PARTITIONS {
            return Err(InvalidConfig {
                field: "limit.partitions",
                problem: Problem::TooLarge(MAX_PARTITIONS as u64),
            });
        }
        let mut sum = 0.0;
        for &share in &self.partitions {
            algorithm::check_ratio("limit.partitions", share, false)?;
            sum += share;
        }
        if sum > 1.0 + 1e-9 {
            return Err(InvalidConfig {
                field: "limit.partitions",
                problem: Problem::NotARatio(sum),
            });
        }
        Ok(())
    }
}

/// The limiter refused a request: the limit (or the request's partition's share of it) was
/// reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("concurrency limit reached: {in_flight} requests in flight, limit {limit}")]
pub struct LimitExceeded {
    /// The limit at the time.
    pub limit: u32,
    /// Requests in flight at the time.
    pub in_flight: u32,
}

/// An admitted request's slot: give it back with [`Limiter::release`] or
/// [`Limiter::forget`]. A ticket that is dropped instead keeps its slot taken.
#[derive(Debug)]
#[must_use = "a ticket holds a slot until it is released"]
pub struct Ticket {
    start: Instant,
    partition: u32,
}

impl Ticket {
    /// The partition the request was admitted in.
    pub fn partition(&self) -> usize {
        self.partition as usize
    }
}

#[derive(Debug)]
struct Partition {
    share: f64,
    in_flight: AtomicU32,
}

/// An adaptive concurrency limiter; one per server (or per protected resource), shared by
/// every request in an [`Arc`](std::sync::Arc). See [the module docs](self).
#[derive(Debug)]
pub struct Limiter {
    limit: AtomicU32,
    in_flight: AtomicU32,
    /// The most in flight at once during the current window.
    peak: AtomicU32,
    /// The RTTs of the current window (and before it).
    samples: Samples,
    /// The shortest RTT of the current window, in nanoseconds.
    min_rtt_ns: AtomicU64,
    drops: AtomicU32,
    /// When the current window may close.
    window_end: AtomicCell<Instant>,
    /// The last closed window, packed so that one load reads both halves of the same window
    /// ([`pack_window`]): its mean RTT and the limit in force during it; 0 before the first.
    last_window: AtomicU64,
    /// The algorithm's no-load RTT after the last closed window, in nanoseconds; 0: none.
    no_load_ns: AtomicU64,
    /// The algorithm and what the last closed window saw: the closer's, one at a time.
    update: Mutex<Update>,
    partitions: Box<[Partition]>,
    window: Duration,
    min_samples: u64,
}

impl Limiter {
    /// A limiter starting at the algorithm's initial limit, its windows timed from `clock`'s
    /// now; `Err` names the first invalid field.
    pub fn new(config: LimiterConfig, clock: &Clock) -> Result<Limiter, InvalidConfig> {
        config.validate()?;
        let start = clock.now();
        Ok(Limiter {
            limit: AtomicU32::new(config.algorithm.limit()),
            in_flight: AtomicU32::new(0),
            peak: AtomicU32::new(0),
            samples: Samples::default(),
            min_rtt_ns: AtomicU64::new(u64::MAX),
            drops: AtomicU32::new(0),
            window_end: AtomicCell::new(later(start, config.window)),
            last_window: AtomicU64::new(0),
            no_load_ns: AtomicU64::new(0),
            update: Mutex::new(Update {
                algorithm: config.algorithm,
                seen: Seen::default(),
            }),
            partitions: config
                .partitions
                .iter()
                .map(|&share| Partition {
                    share,
                    in_flight: AtomicU32::new(0),
                })
                .collect(),
            window: config.window,
            min_samples: u64::from(config.min_samples),
        })
    }

    /// The current limit.
    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests in flight in `partition` (0 without partitions).
    pub fn partition_in_flight(&self, partition: usize) -> u32 {
        self.partitions
            .get(partition)
            .map_or(0, |p| p.in_flight.load(Ordering::Relaxed))
    }

    /// The mean RTT of the last closed window: what an admitted request can expect to take.
    /// `None` before the first window closed.
    pub fn expected_rtt(&self) -> Option<Duration> {
        self.last_window().map(|(_, rtt)| rtt)
    }

    /// The last closed window's limit (the one in force during it) and mean RTT, read
    /// together: a window that closes between two reads would pair one window's limit with
    /// the next one's RTT. Below the current limit, its round trips say nothing of the queue
    /// the current limit keeps (a limit that just rose after a probe of the no-load RTT,
    /// say). `None` before the first window closed. The RTT saturates at 2^40 ns (18 minutes),
    /// the limit at 2^24 − 1.
    pub fn last_window(&self) -> Option<(u32, Duration)> {
        match self.last_window.load(Ordering::Relaxed) {
            0 => None,
            packed => {
                let limit = u32::try_from(packed & WINDOW_LIMIT_MASK).unwrap_or(u32::MAX);
                Some((limit, Duration::from_nanos(packed >> WINDOW_LIMIT_BITS)))
            }
        }
    }

    /// The round trip without a queue, as the algorithm estimates it after the last closed
    /// window ([`LimitAlgorithm::no_load_rtt`]): with [`Limiter::expected_rtt`], how much of
    /// an admitted request's time is queueing behind the limit.
    pub fn no_load_rtt(&self) -> Option<Duration> {
        match self.no_load_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// The algorithm's state, for inspection (a copy, taken under the update lock).
    pub fn algorithm(&self) -> LimitAlgorithm {
        match self.update.lock() {
            Ok(u) => u.algorithm.clone(),
            Err(poisoned) => poisoned.into_inner().algorithm.clone(),
        }
    }

    /// Admits a request in `partition` at `now`, or refuses it.
    ///
    /// Without partitions (or with an index that names none) a request is admitted while
    /// fewer than the limit are in flight. In a partition, it is also admitted at the limit
    /// while the partition holds less than its share of it.
    #[inline]
    pub fn try_acquire(&self, partition: usize, now: Instant) -> Result<Ticket, LimitExceeded> {
        let limit = self.limit.load(Ordering::Relaxed);
        let part = self.partitions.get(partition);
        let guaranteed = under_share(part, limit);
        let admitted = self
            .in_flight
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |n| {
                (n < limit || guaranteed).then_some(n + 1)
            });
        let n = match admitted {
            Ok(before) => before + 1,
            Err(in_flight) => return Err(LimitExceeded { limit, in_flight }),
        };
        if let Some(p) = part {
            p.in_flight.fetch_add(1, Ordering::Relaxed);
        }
        if n > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(n, Ordering::Relaxed);
        }
        Ok(Ticket {
            start: now,
            partition: partition as u32,
        })
    }

    /// Gives the slot back at `now` and records the request's RTT; an [`Outcome::InDoubt`]
    /// (a timeout, a deadline cancellation) or [`Outcome::Overloaded`] (the request was
    /// refused further down) counts as a drop.
    #[inline]
    pub fn release(&self, ticket: Ticket, now: Instant, outcome: Outcome) {
        self.give_back(ticket.partition);
        self.record(ticket.start, now, outcome);
    }

    /// Gives the slot of a finished request straight to a waiting one in `partition` at
    /// `now`, without the slot ever being free: a request arriving meanwhile cannot take it.
    /// A queue in front of the limiter hands its slots over this way, so that no newcomer
    /// overtakes its waiters.
    ///
    /// `ticket`'s round trip is recorded as [`Limiter::release`] records it, or not at all
    /// with `outcome` `None` (as [`Limiter::forget`]: the request did not run). The waiting
    /// request gets a ticket timed from `now`: its round trip, like every other, is its time
    /// in the server after admission, which is where the queue behind the limit shows. When
    /// it may not be admitted (the limit was lowered to the requests in flight or below, and
    /// its partition is not under its share), the slot is given back instead and the answer
    /// is `None`.
    ///
    /// ```
    /// use stormguard::classify::Outcome;
    /// use stormguard::clock::ManualClock;
    /// use stormguard::limit::{Aimd, Limiter, LimiterConfig};
    ///
    /// let clock = ManualClock::new().clock();
    /// let limiter = Limiter::new(LimiterConfig::new(Aimd::new().with_limits(1, 1, 1)), &clock)?;
    /// let running = limiter.try_acquire(0, clock.now()).unwrap();
    /// let next = limiter.pass_on(running, clock.now(), Some(Outcome::Success), 0).unwrap();
    /// assert!(limiter.try_acquire(0, clock.now()).is_err(), "the slot went to the waiter");
    /// limiter.release(next, clock.now(), Outcome::Success);
    /// assert_eq!(limiter.in_flight(), 0);
    /// # Ok::<(), stormguard::health::InvalidConfig>(())
    /// ```
    pub fn pass_on(
        &self,
        ticket: Ticket,
        now: Instant,
        outcome: Option<Outcome>,
        partition: usize,
    ) -> Option<Ticket> {
        if let Some(p) = self.partitions.get(ticket.partition as usize) {
            p.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        let limit = self.limit.load(Ordering::Relaxed);
        let part = self.partitions.get(partition);
        let others = self.in_flight.load(Ordering::Relaxed).saturating_sub(1);
        let handed = if others < limit || under_share(part, limit) {
            if let Some(p) = part {
                p.in_flight.fetch_add(1, Ordering::Relaxed);
            }
            Some(Ticket {
                start: now,
                partition: partition as u32,
            })
        } else {
            self.in_flight.fetch_sub(1, Ordering::Release);
            None
        };
        if let Some(outcome) = outcome {
            self.record(ticket.start, now, outcome);
        }
        handed
    }

    /// Records the round trip of a request admitted at `start` and finished at `now`.
    #[inline]
    fn record(&self, start: Instant, now: Instant, outcome: Outcome) {
        if matches!(outcome, Outcome::InDoubt | Outcome::Overloaded { .. }) {
            self.drops.fetch_add(1, Ordering::Relaxed);
        }
        let rtt = now.saturating_duration_since(start);
        let rtt_ns = rtt
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(rtt.subsec_nanos()));
        if rtt_ns < self.min_rtt_ns.load(Ordering::Relaxed) {
            self.min_rtt_ns.fetch_min(rtt_ns, Ordering::Relaxed);
        }
        self.samples.add(rtt_ns);
        if now >= self.window_end.load() {
            self.close_window(now);
        }
    }

    /// Gives the slot back without a sample: the request was cancelled by its caller, so its
    /// RTT says nothing about the server.
    #[inline]
    pub fn forget(&self, ticket: Ticket) {
        self.give_back(ticket.partition);
    }

    fn give_back(&self, partition: u32) {
        // SeqCst, not just Release: a queue in front of the limiter checks for waiters
        // after this, while a waiter joins the queue and then looks at `in_flight` again
        // (behind a SeqCst fence). In the single total order of those accesses at least one
        // of the two sees the other, so a freed slot cannot be missed by both. On x86 this is
        // the same locked instruction as Release.
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Some(p) = self.partitions.get(partition as usize) {
            p.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Closes the current window, once it has its samples (one releaser wins the race), and
    /// runs the algorithm on it.
    #[cold]
    fn close_window(&self, now: Instant) {
        let end = self.window_end.load();
        if now < end
            || self
                .window_end
                .compare_exchange(end, later(now, self.window))
                .is_err()
        {
            return;
        }
        // A previous closer still updating leaves this window open rather than wait: its
        // samples go to the next one.
        let mut update = match self.update.try_lock() {
            Ok(u) => u,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        // At a limit below the window's minimum of samples, one round of the limit is enough:
        // a limit of 1 in front of a 1 s handler would otherwise wait 10 s for a window.
        let at_least = self
            .min_samples
            .min(u64::from(self.limit.load(Ordering::Relaxed)));
        let Some((samples, sum_ns)) = self.samples.take(&mut update.seen, at_least) else {
            // Too few samples yet: the window stays open and the next release looks again.
            self.window_end.store(end);
            return;
        };
        let dropped = self.drops.swap(0, Ordering::Relaxed);
        let min_ns = self.min_rtt_ns.swap(u64::MAX, Ordering::Relaxed);
        let peak = self
            .peak
            .swap(self.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
        let mean_ns = (sum_ns / samples).max(1);
        let sample = WindowSample {
            rtt: Duration::from_nanos(mean_ns),
            min_rtt: Duration::from_nanos(min_ns.min(mean_ns).max(1)),
            samples: u32::try_from(samples).unwrap_or(u32::MAX),
            dropped,
            max_in_flight: peak,
        };
        let limit = update.algorithm.update(&sample);
        let during = self.limit.swap(limit, Ordering::Relaxed);
        self.last_window
            .store(pack_window(during, mean_ns), Ordering::Relaxed);
        let no_load = update.algorithm.no_load_rtt().map_or(0, |d| {
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
        });
        self.no_load_ns.store(no_load, Ordering::Relaxed);
    }
}

/// Bits of [`Limiter::last_window`]'s packed value that hold the window's limit.
const WINDOW_LIMIT_BITS: u32 = 24;
const WINDOW_LIMIT_MASK: u64 = (1 << WINDOW_LIMIT_BITS) - 1;

/// A closed window's limit (low 24 bits, saturated, at least 1) and mean RTT in nanoseconds
/// (high 40 bits, saturated, at least 1): never 0, which stands for no window yet.
fn pack_window(limit: u32, mean_ns: u64) -> u64 {
    let limit = u64::from(limit).clamp(1, WINDOW_LIMIT_MASK);
    let rtt = mean_ns.clamp(1, (1 << (64 - WINDOW_LIMIT_BITS)) - 1);
    (rtt << WINDOW_LIMIT_BITS) | limit
}

/// Whether `part` holds less than its share of `limit` (no partition: no share).
#[inline]
fn under_share(part: Option<&Partition>, limit: u32) -> bool {
    part.is_some_and(|p| {
        let share = (f64::from(limit) * p.share).ceil() as u32;
        p.in_flight.load(Ordering::Relaxed) < share
    })
}

/// `length` after `from`; a length past what an instant can hold is a window of about 136
/// years.
fn later(from: Instant, length: Duration) -> Instant {
    from.checked_add(length)
        .or_else(|| from.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(from)
}

/// What the window's closer works on.
#[derive(Debug)]
struct Update {
    algorithm: LimitAlgorithm,
    seen: Seen,
}
