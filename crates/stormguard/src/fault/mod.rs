//! Fault injection: latency, error statuses and connection resets on purpose.
//!
//! # Why inject faults?
//!
//! Retries, budgets, deadlines and hedging only matter when something goes wrong, and the code
//! paths that handle "something went wrong" are the ones a happy-path test never runs. Envoy's
//! fault filter and Polly's chaos strategies make a healthy downstream misbehave on purpose —
//! slow for some calls, failing for others — so the resilience policies can be tested (and
//! demonstrated) against a failure you chose, at a rate you chose, reproducibly.
//!
//! A [`FaultInjector`] decides per call whether to inject:
//!
//! - a **delay** ([`Latency`]: fixed, uniform, bimodal or exponential) before the call, with
//!   probability `latency rate`;
//! - an **abort** ([`Abort`]: an HTTP status, optionally with `Retry-After`, or a connection
//!   reset) instead of the call, with probability `abort rate`.
//!
//! The two draws are independent (as in Envoy): a call may be delayed *and then* aborted.
//!
//! # Determinism
//!
//! Call *k* of an injector seeded with *s* draws from a small generator seeded with
//! `s ^ k · φ` (φ the 64-bit golden ratio), the scheme the retrier uses for its jitter. So a
//! sequence of calls sees the same faults on every run, and concurrent callers need no lock:
//! the only shared write is the call counter.
//!
//! # Switching at run time
//!
//! [`enable`](FaultInjector::enable), [`disable`](FaultInjector::disable) and the rate
//! setters are single atomic stores, so a test (or an operator endpoint in a demo) can turn
//! faults on and off while traffic flows. A disabled injector costs one relaxed load per call:
//! no counter, no generator, no lock.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), stormguard::fault::InvalidFault> {
//! use std::time::Duration;
//! use stormguard::fault::{Abort, FaultConfig, FaultInjector, Latency};
//!
//! let injector = FaultInjector::new(
//!     FaultConfig::new(42)
//!         .with_latency(1.0, Latency::Fixed(Duration::from_millis(200)))
//!         .with_abort(0.0, Abort::Reset),
//! )?;
//! let start = tokio::time::Instant::now();
//! let answer: Result<u32, Abort> = injector.wrap(async { Ok(7) }).await;
//! assert_eq!(answer, Ok(7));
//! assert_eq!(start.elapsed(), Duration::from_millis(200));
//!
//! injector.set_abort_rate(1.0)?;
//! assert_eq!(injector.wrap(async { Ok::<u32, Abort>(7) }).await, Err(Abort::Reset));
//! injector.disable();
//! assert_eq!(injector.wrap(async { Ok::<u32, Abort>(7) }).await, Ok(7));
//! # Ok(()) }
//! ```

mod abort;
mod latency;

pub use abort::Abort;
pub use latency::Latency;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Rates are kept in parts per million: exact, and one integer comparison per draw.
const PPM: u32 = 1_000_000;

/// Why a fault configuration was refused.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidFault {
    /// An injection rate must be a number in `0.0..=1.0`.
    #[error("{fault} rate must be a number in 0.0..=1.0, got {rate}")]
    Rate {
        /// Which rate: `"latency"` or `"abort"`.
        fault: &'static str,
        /// The value refused.
        rate: f64,
    },
    /// A bimodal slow share must be a number in `0.0..=1.0`.
    #[error("bimodal slow_share must be a number in 0.0..=1.0, got {0}")]
    SlowShare(f64),
    /// A uniform range must have `min <= max`.
    #[error("uniform latency needs min <= max, got min {min:?} and max {max:?}")]
    UniformRange {
        /// The lower bound given.
        min: Duration,
        /// The upper bound given.
        max: Duration,
    },
    /// An injected status must be an error status, 400..=599.
    #[error("an injected status must be in 400..=599, got {0}")]
    Status(u16),
}

/// What to inject and how often, before validation.
///
/// # Default
///
/// [`FaultConfig::new`] injects nothing: latency rate 0 with a zero delay, abort rate 0 with
/// [`Abort::Status`] 503, enabled. Set a distribution with a rate of 0 to switch it on later
/// with [`FaultInjector::set_latency_rate`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultConfig {
    seed: u64,
    enabled: bool,
    latency_rate: f64,
    latency: Latency,
    abort_rate: f64,
    abort: Abort,
}

impl FaultConfig {
    /// No faults yet; draws seeded with `seed`.
    pub const fn new(seed: u64) -> Self {
        FaultConfig {
            seed,
            enabled: true,
            latency_rate: 0.0,
            latency: Latency::Fixed(Duration::ZERO),
            abort_rate: 0.0,
            abort: Abort::Status {
                status: 503,
                retry_after: None,
            },
        }
    }

    /// Delays a share `rate` (0.0..=1.0) of calls by a draw from `latency`.
    pub const fn with_latency(mut self, rate: f64, latency: Latency) -> Self {
        self.latency_rate = rate;
        self.latency = latency;
        self
    }

    /// Replaces a share `rate` (0.0..=1.0) of calls by `abort`.
    pub const fn with_abort(mut self, rate: f64, abort: Abort) -> Self {
        self.abort_rate = rate;
        self.abort = abort;
        self
    }

    /// Starts enabled (the default) or disabled.
    pub const fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Checks every field; see [`InvalidFault`].
    ///
    /// # Errors
    ///
    /// The first rule broken: a rate outside `0.0..=1.0` (NaN included), an invalid
    /// [`Latency`], or an [`Abort::Status`] outside 400..=599.
    pub fn validate(&self) -> Result<(), InvalidFault> {
        rate_ppm("latency", self.latency_rate)?;
        rate_ppm("abort", self.abort_rate)?;
        self.latency.validate()?;
        if let Abort::Status { status, .. } = self.abort {
            if !(400..=599).contains(&status) {
                return Err(InvalidFault::Status(status));
            }
        }
        Ok(())
    }
}

/// A rate as parts per million, or why it is refused.
fn rate_ppm(fault: &'static str, rate: f64) -> Result<u32, InvalidFault> {
    if !(0.0..=1.0).contains(&rate) {
        return Err(InvalidFault::Rate { fault, rate });
    }
    // In range: rate · 1e6 is in 0.0..=1e6, so the cast is exact after rounding.
    #[allow(clippy::cast_possible_truncation, reason = "value is within 0..=1e6")]
    let ppm = (rate * f64::from(PPM)).round() as u32;
    Ok(ppm.min(PPM))
}

/// What to inject into one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Injection {
    /// Wait this long before the call (zero: no delay).
    pub delay: Duration,
    /// Fail with this instead of calling, after the delay.
    pub abort: Option<Abort>,
}

impl Injection {
    /// Nothing to inject.
    pub const NONE: Injection = Injection {
        delay: Duration::ZERO,
        abort: None,
    };

    /// Whether there is nothing to inject.
    pub fn is_none(&self) -> bool {
        self.delay.is_zero() && self.abort.is_none()
    }
}

/// How many calls an injector has seen and faulted while enabled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Calls that drew while the injector was enabled with a non-zero rate.
    pub calls: u64,
    /// Calls delayed (by a non-zero draw).
    pub delayed: u64,
    /// Calls aborted.
    pub aborted: u64,
}

/// Injects latency and failures into calls, at rates that can change at run time.
///
/// Shared by reference or in an [`Arc`](std::sync::Arc); every method takes `&self`. See the
/// [module documentation](self) for determinism and the cost when disabled.
#[derive(Debug)]
pub struct FaultInjector {
    enabled: AtomicBool,
    latency_ppm: AtomicU32,
    abort_ppm: AtomicU32,
    latency: Latency,
    abort: Abort,
    seed: u64,
    calls: AtomicU64,
    delayed: AtomicU64,
    aborted: AtomicU64,
}

impl FaultInjector {
    /// An injector for a validated `config`.
    ///
    /// # Errors
    ///
    /// [`InvalidFault`] when [`FaultConfig::validate`] refuses `config`.
    pub fn new(config: FaultConfig) -> Result<Self, InvalidFault> {
        config.validate()?;
        Ok(FaultInjector {
            enabled: AtomicBool::new(config.enabled),
            latency_ppm: AtomicU32::new(rate_ppm("latency", config.latency_rate)?),
            abort_ppm: AtomicU32::new(rate_ppm("abort", config.abort_rate)?),
            latency: config.latency,
            abort: config.abort,
            seed: config.seed,
            calls: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
        })
    }

    /// Starts injecting (again).
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
    }

    /// Stops injecting; calls pass straight through.
    pub fn disable(&self) {
        self.enabled.store(false, Ordering::Relaxed);
    }

    /// Whether faults are being injected.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Changes the share of calls delayed.
    ///
    /// # Errors
    ///
    /// [`InvalidFault::Rate`] unless `rate` is in `0.0..=1.0`; the rate is then unchanged.
    pub fn set_latency_rate(&self, rate: f64) -> Result<(), InvalidFault> {
        let ppm = rate_ppm("latency", rate)?;
        self.latency_ppm.store(ppm, Ordering::Relaxed);
        Ok(())
    }

    /// Changes the share of calls aborted.
    ///
    /// # Errors
    ///
    /// [`InvalidFault::Rate`] unless `rate` is in `0.0..=1.0`; the rate is then unchanged.
    pub fn set_abort_rate(&self, rate: f64) -> Result<(), InvalidFault> {
        let ppm = rate_ppm("abort", rate)?;
        self.abort_ppm.store(ppm, Ordering::Relaxed);
        Ok(())
    }

    /// The share of calls delayed, to the nearest millionth.
    pub fn latency_rate(&self) -> f64 {
        f64::from(self.latency_ppm.load(Ordering::Relaxed)) / f64::from(PPM)
    }

    /// The share of calls aborted, to the nearest millionth.
    pub fn abort_rate(&self) -> f64 {
        f64::from(self.abort_ppm.load(Ordering::Relaxed)) / f64::from(PPM)
    }

    /// The delay distribution.
    pub fn latency(&self) -> &Latency {
        &self.latency
    }

    /// The failure injected on abort.
    pub fn abort(&self) -> Abort {
        self.abort
    }

    /// Calls seen and faulted so far.
    pub fn stats(&self) -> FaultStats {
        FaultStats {
            calls: self.calls.load(Ordering::Relaxed),
            delayed: self.delayed.load(Ordering::Relaxed),
            aborted: self.aborted.load(Ordering::Relaxed),
        }
    }

    /// Decides what to inject into the next call. Runtime-free: the tower layer and the
    /// simulator act on the [`Injection`] themselves; [`wrap`](FaultInjector::wrap) does it
    /// for a plain future.
    #[inline]
    pub fn draw(&self) -> Injection {
        if !self.enabled.load(Ordering::Relaxed) {
            return Injection::NONE;
        }
        let latency_ppm = self.latency_ppm.load(Ordering::Relaxed);
        let abort_ppm = self.abort_ppm.load(Ordering::Relaxed);
        if latency_ppm == 0 && abort_ppm == 0 {
            return Injection::NONE;
        }
        self.draw_slow(latency_ppm, abort_ppm)
    }

    #[cold]
    fn draw_slow(&self, latency_ppm: u32, abort_ppm: u32) -> Injection {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let mut rng = SmallRng::seed_from_u64(self.seed ^ call.wrapping_mul(GOLDEN));
        let delay = if chance(&mut rng, latency_ppm) {
            self.latency.sample(&mut rng)
        } else {
            Duration::ZERO
        };
        let abort = chance(&mut rng, abort_ppm).then_some(self.abort);
        if !delay.is_zero() {
            self.delayed.fetch_add(1, Ordering::Relaxed);
        }
        if abort.is_some() {
            self.aborted.fetch_add(1, Ordering::Relaxed);
        }
        Injection { delay, abort }
    }

    /// Runs `call` with this injector's faults: waits the drawn delay (on tokio's timer),
    /// then either fails with the drawn [`Abort`] — `call` is then dropped without being
    /// polled, so the downstream never sees it — or awaits `call`.
    ///
    /// The operation's error type says how an abort looks to it: `E: From<Abort>`.
    #[cfg(feature = "tokio")]
    pub async fn wrap<T, E, F>(&self, call: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Abort>,
    {
        let injection = self.draw();
        if !injection.delay.is_zero() {
            tokio::time::sleep(injection.delay).await;
        }
        match injection.abort {
            Some(abort) => Err(abort.into()),
            None => call.await,
        }
    }
}

/// The 64-bit golden ratio, to spread consecutive call numbers over the seed space.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// `true` with probability `ppm / 1e6`.
fn chance(rng: &mut SmallRng, ppm: u32) -> bool {
    match ppm {
        0 => false,
        PPM.. => true,
        _ => rng.random_range(0..PPM) < ppm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_each_rule() {
        let bad_rate = FaultConfig::new(0).with_abort(1.5, Abort::Reset);
        assert_eq!(
            bad_rate.validate(),
            Err(InvalidFault::Rate {
                fault: "abort",
                rate: 1.5
            })
        );
        let nan = FaultConfig::new(0).with_latency(f64::NAN, Latency::Fixed(Duration::ZERO));
        assert!(matches!(
            nan.validate(),
            Err(InvalidFault::Rate {
                fault: "latency",
                ..
            })
        ));
        let ok_status = Abort::Status {
            status: 200,
            retry_after: None,
        };
        assert_eq!(
            FaultConfig::new(0).with_abort(0.1, ok_status).validate(),
            Err(InvalidFault::Status(200))
        );
        assert!(FaultConfig::new(0).validate().is_ok());
    }

    #[test]
    fn disabled_or_zero_rate_draws_nothing_and_counts_nothing() {
        let injector = FaultInjector::new(
            FaultConfig::new(1)
                .with_abort(1.0, Abort::Reset)
                .with_enabled(false),
        )
        .expect("valid");
        assert_eq!(injector.draw(), Injection::NONE);
        injector.enable();
        assert_eq!(injector.draw().abort, Some(Abort::Reset));
        injector.set_abort_rate(0.0).expect("valid");
        assert!(injector.draw().is_none());
        assert_eq!(injector.stats().calls, 1);
    }

    #[test]
    fn rates_round_to_the_nearest_millionth() {
        assert_eq!(rate_ppm("abort", 0.123_456_7), Ok(123_457));
        assert_eq!(rate_ppm("abort", 1.0), Ok(PPM));
        assert!(rate_ppm("abort", -0.0).is_ok());
    }
}
