//! Adaptive client-side throttling: reject requests locally, before they are sent, in
//! proportion to how many the backend has been refusing.
//!
//! # Why throttle on the client?
//!
//! A backend that is over capacity still pays for every request it refuses: reading it,
//! deciding, answering "no". At 10x overload those refusals alone can use up the capacity
//! that was meant for real work. Google's SRE book ("Handling Overload", *Client-side
//! throttling*) lets each client keep two counts over the last two minutes:
//!
//! - **requests**: every request the application tried to send, including those this
//!   throttle rejected itself;
//! - **accepts**: the requests the backend accepted;
//!
//! and reject each new request locally with probability
//!
//! ```text
//! p = max(0, (requests − K·accepts) / (requests + 1))
//! ```
//!
//! While the backend accepts everything, `requests ≈ accepts` and `p = 0`. When it can only
//! accept `C` per second of the `R` offered, `p` settles where the backend sees about `K·C`
//! requests per second: `K` times what it can serve, so the excess it refuses is bounded and
//! it still hears enough traffic to notice when it recovers. `K = 2` (the book's default)
//! wastes up to one refusal per accepted request; `K = 1.1` is more aggressive, and slower to
//! notice a recovery.
//!
//! # What counts as accepted
//!
//! [`AdaptiveThrottle::record`] counts [`Outcome::Success`] and [`Outcome::NeverRetry`] (a
//! 404 is an answer: the backend handled the request) as accepted, and every other outcome —
//! overloaded, unavailable, in doubt (a timeout) — as not. Use
//! [`AdaptiveThrottle::record_accepted`] for another rule. A request that is never recorded
//! (the caller was cancelled) counts as a request that was not accepted.
//!
//! # Window and randomness
//!
//! The counts live in time buckets on a [`Clock`] (2 minutes in 24 buckets of 5 s by
//! default), so tests drive the throttle with a [`ManualClock`](crate::clock::ManualClock)
//! and paused tokio time. The rejection draws come from a seeded generator
//! ([`AdaptiveThrottle::with_seed`]): the same sequence of calls makes the same decisions.
//!
//! # Cost
//!
//! A decision adds up the live buckets (24 by default) and makes one atomic increment, and one
//! more atomic step for the draw when `p > 0`. The counters are shared by every caller of the
//! throttle; the throttle is meant to sit in front of one overloaded backend, not on the
//! per-call fast path of a healthy one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::{RngCore, SeedableRng};

use crate::classify::Outcome;
use crate::clock::{Clock, CoarseMillis};
use crate::health::{InvalidConfig, Problem};

/// The largest number of buckets in a throttle's window.
pub const MAX_THROTTLE_BUCKETS: u32 = 10_000;

/// How an [`AdaptiveThrottle`] decides.
///
/// # Default
///
/// [`ThrottleConfig::sre_default`]: `K = 2` over 2 minutes in 24 buckets.
///
/// ```
/// use std::time::Duration;
/// use stormguard::throttle::ThrottleConfig;
///
/// let config = ThrottleConfig::new(1.5).with_window(Duration::from_secs(60), 12);
/// assert!(config.validate().is_ok());
/// assert_eq!(ThrottleConfig::new(0.5).validate().unwrap_err().field, "throttle.k");
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThrottleConfig {
    k: f64,
    window: Duration,
    buckets: u32,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig::sre_default()
    }
}

impl ThrottleConfig {
    /// The SRE book's setting: `K = 2` over the last 2 minutes (24 buckets of 5 s).
    pub const fn sre_default() -> Self {
        ThrottleConfig::new(2.0)
    }

    /// The SRE book's aggressive setting: `K = 1.1`.
    pub const fn aggressive() -> Self {
        ThrottleConfig::new(1.1)
    }

    /// Multiplier `k` over the default 2-minute window.
    pub const fn new(k: f64) -> Self {
        ThrottleConfig {
            k,
            window: Duration::from_secs(120),
            buckets: 24,
        }
    }

    /// Sets `K`.
    pub const fn with_k(mut self, k: f64) -> Self {
        self.k = k;
        self
    }

    /// Counts over the last `length`, in `buckets` buckets.
    pub const fn with_window(mut self, length: Duration, buckets: u32) -> Self {
        self.window = length;
        self.buckets = buckets;
        self
    }

    /// `K`: how many requests per accepted one the backend may be sent.
    pub const fn k(&self) -> f64 {
        self.k
    }

    /// The window's length.
    pub const fn window(&self) -> Duration {
        self.window
    }

    /// The window's number of buckets.
    pub const fn buckets(&self) -> u32 {
        self.buckets
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if !(self.k.is_finite() && self.k >= 1.0) {
            return Err(InvalidConfig {
                field: "throttle.k",
                problem: Problem::BelowOne(self.k),
            });
        }
        let length_ms = self.window.as_millis();
        if length_ms == 0 {
            return Err(InvalidConfig {
                field: "throttle.window",
                problem: Problem::Zero,
            });
        }
        if self.buckets == 0 {
            return Err(InvalidConfig {
                field: "throttle.buckets",
                problem: Problem::Zero,
            });
        }
        let max = u128::from(MAX_THROTTLE_BUCKETS).min(length_ms);
        if u128::from(self.buckets) > max {
            return Err(InvalidConfig {
                field: "throttle.buckets",
                problem: Problem::TooLarge(max as u64),
            });
        }
        Ok(())
    }
}

/// The throttle rejected the request locally; it was not sent.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error(
    "throttled locally: the backend has been refusing requests (rejection probability {probability:.3})"
)]
pub struct Throttled {
    /// The rejection probability at the time of the decision.
    pub probability: f64,
}

/// The throttle's counts over its window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThrottleCounts {
    /// Requests the application tried to send, those rejected locally included.
    pub requests: u64,
    /// Requests the backend accepted.
    pub accepts: u64,
}

impl ThrottleCounts {
    /// `max(0, (requests − k·accepts) / (requests + 1))`.
    pub fn rejection_probability(&self, k: f64) -> f64 {
        let requests = self.requests as f64;
        ((requests - k * self.accepts as f64) / (requests + 1.0)).max(0.0)
    }
}

const EMPTY: u64 = u64::MAX;

#[derive(Debug)]
struct Bucket {
    epoch: AtomicU64,
    requests: AtomicU64,
    accepts: AtomicU64,
}

/// An adaptive client-side throttle (Google SRE, "Handling Overload"); one per backend,
/// shared by its callers in an [`Arc`](std::sync::Arc).
///
/// ```
/// use std::time::Duration;
/// use stormguard::classify::Outcome;
/// use stormguard::clock::ManualClock;
/// use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};
///
/// let clock = ManualClock::new();
/// let throttle = AdaptiveThrottle::new(ThrottleConfig::sre_default(), clock.clock())
///     .unwrap()
///     .with_seed(7);
/// // The backend refuses everything for a while...
/// for _ in 0..1_000 {
///     if throttle.try_acquire().is_ok() {
///         throttle.record(Outcome::Overloaded { retry_after: None });
///     }
/// }
/// // ...so most requests are now rejected before they are sent.
/// assert!(throttle.rejection_probability() > 0.99);
/// assert!(throttle.try_acquire().is_err());
/// ```
#[derive(Debug)]
pub struct AdaptiveThrottle {
    config: ThrottleConfig,
    millis: CoarseMillis,
    bucket_ms: u64,
    buckets: Box<[Bucket]>,
    /// The draw sequence: a splitmix64 counter.
    draws: AtomicU64,
}

impl AdaptiveThrottle {
    /// A throttle on `clock` with an OS-seeded draw sequence; `Err` names the first invalid
    /// field.
    pub fn new(config: ThrottleConfig, clock: Clock) -> Result<Self, InvalidConfig> {
        config.validate()?;
        let length_ms = u64::try_from(config.window.as_millis()).unwrap_or(u64::MAX);
        let bucket_ms = (length_ms / u64::from(config.buckets)).max(1);
        let buckets = (0..config.buckets)
            .map(|_| Bucket {
                epoch: AtomicU64::new(EMPTY),
                requests: AtomicU64::new(0),
                accepts: AtomicU64::new(0),
            })
            .collect();
        Ok(AdaptiveThrottle {
            config,
            millis: CoarseMillis::new(clock),
            bucket_ms,
            buckets,
            draws: AtomicU64::new(rand::rngs::SmallRng::from_os_rng().next_u64()),
        })
    }

    /// Seeds the rejection draws, for reproducible decisions.
    pub fn with_seed(self, seed: u64) -> Self {
        self.draws.store(seed, Ordering::Relaxed);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ThrottleConfig {
        &self.config
    }

    /// Counts one request and decides whether to send it: `Err` means reject it locally.
    /// Record the outcome of a request that was sent with [`record`](Self::record).
    pub fn try_acquire(&self) -> Result<(), Throttled> {
        let now = self.millis.now();
        let probability = self.counts_at(now).rejection_probability(self.config.k);
        self.bucket(now).requests.fetch_add(1, Ordering::Relaxed);
        if probability > 0.0 && self.draw() < probability {
            Err(Throttled { probability })
        } else {
            Ok(())
        }
    }

    /// Records the outcome of a request that was sent: accepted when the backend handled it
    /// (see [what counts as accepted](self#what-counts-as-accepted)).
    pub fn record(&self, outcome: Outcome) {
        self.record_accepted(matches!(outcome, Outcome::Success | Outcome::NeverRetry));
    }

    /// Records whether the backend accepted a request that was sent.
    pub fn record_accepted(&self, accepted: bool) {
        if accepted {
            let now = self.millis.now();
            self.bucket(now).accepts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts over the window now.
    pub fn counts(&self) -> ThrottleCounts {
        self.counts_at(self.millis.now())
    }

    /// The probability that the next request is rejected.
    pub fn rejection_probability(&self) -> f64 {
        self.counts().rejection_probability(self.config.k)
    }

    fn counts_at(&self, now: u64) -> ThrottleCounts {
        let epoch = now / self.bucket_ms;
        let n = self.buckets.len() as u64;
        let mut counts = ThrottleCounts::default();
        for b in self.buckets.iter() {
            let e = b.epoch.load(Ordering::Acquire);
            if e != EMPTY && e <= epoch && epoch - e < n {
                counts.requests += b.requests.load(Ordering::Relaxed);
                counts.accepts += b.accepts.load(Ordering::Relaxed);
            }
        }
        counts
    }

    /// The bucket for `now`, cleared first if it last held an older bucket. Two threads
    /// moving a bucket forward at once may lose an increment made in between; a throttle
    /// decides on the last two minutes of traffic and does not need that one.
    fn bucket(&self, now: u64) -> &Bucket {
        let epoch = now / self.bucket_ms;
        let n = self.buckets.len() as u64;
        let b = &self.buckets[(epoch % n) as usize];
        let e = b.epoch.load(Ordering::Acquire);
        if (e == EMPTY || e < epoch)
            && b.epoch
                .compare_exchange(e, epoch, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            b.requests.store(0, Ordering::Relaxed);
            b.accepts.store(0, Ordering::Relaxed);
        }
        b
    }

    /// A uniform draw in `[0, 1)`.
    fn draw(&self) -> f64 {
        let x = self
            .draws
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        // splitmix64's output function.
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn every_bad_field_is_named() {
        let cases = [
            (ThrottleConfig::new(f64::NAN), "throttle.k"),
            (ThrottleConfig::new(0.99), "throttle.k"),
            (ThrottleConfig::new(f64::INFINITY), "throttle.k"),
            (
                ThrottleConfig::new(2.0).with_window(Duration::ZERO, 1),
                "throttle.window",
            ),
            (
                ThrottleConfig::new(2.0).with_window(Duration::from_secs(1), 0),
                "throttle.buckets",
            ),
            (
                ThrottleConfig::new(2.0).with_window(Duration::from_millis(5), 6),
                "throttle.buckets",
            ),
        ];
        for (config, field) in cases {
            let err =
                AdaptiveThrottle::new(config, ManualClock::new().clock()).expect_err("must fail");
            assert_eq!(err.field, field, "{config:?}");
            assert!(err.to_string().contains(field));
        }
        assert!(ThrottleConfig::aggressive().validate().is_ok());
        assert_eq!(ThrottleConfig::default().k(), 2.0);
    }

    #[test]
    fn formula_matches_the_book() {
        let c = ThrottleCounts {
            requests: 100,
            accepts: 10,
        };
        assert!((c.rejection_probability(2.0) - 80.0 / 101.0).abs() < 1e-12);
        let healthy = ThrottleCounts {
            requests: 100,
            accepts: 100,
        };
        assert_eq!(healthy.rejection_probability(1.1), 0.0);
        assert_eq!(ThrottleCounts::default().rejection_probability(2.0), 0.0);
    }

    #[test]
    fn a_healthy_backend_is_never_throttled() {
        let clock = ManualClock::new();
        let t = AdaptiveThrottle::new(ThrottleConfig::aggressive(), clock.clock())
            .expect("valid")
            .with_seed(1);
        for _ in 0..10_000 {
            t.try_acquire().expect("not throttled");
            t.record(Outcome::Success);
            clock.advance(Duration::from_millis(3));
        }
        assert_eq!(t.rejection_probability(), 0.0);
    }

    #[test]
    fn counts_leave_with_their_bucket() {
        let clock = ManualClock::new();
        let t = AdaptiveThrottle::new(ThrottleConfig::sre_default(), clock.clock())
            .expect("valid")
            .with_seed(1);
        let _ = t.try_acquire();
        t.record(Outcome::Overloaded { retry_after: None });
        assert_eq!(
            t.counts(),
            ThrottleCounts {
                requests: 1,
                accepts: 0
            }
        );
        clock.advance(Duration::from_secs(119));
        assert_eq!(t.counts().requests, 1);
        clock.advance(Duration::from_secs(1));
        assert_eq!(t.counts(), ThrottleCounts::default());
    }

    #[test]
    fn the_same_seed_makes_the_same_decisions() {
        let run = |seed| {
            let clock = ManualClock::new();
            let t = AdaptiveThrottle::new(ThrottleConfig::sre_default(), clock.clock())
                .expect("valid")
                .with_seed(seed);
            (0..500)
                .map(|_| {
                    let sent = t.try_acquire().is_ok();
                    if sent {
                        t.record(Outcome::Retryable);
                    }
                    sent
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }
}
