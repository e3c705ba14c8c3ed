//! How long to wait before retry number *n*.
//!
//! Exponential backoff alone only buys time: when a thousand clients fail in the same
//! millisecond, their *n*-th retries still land in the same millisecond, just later (the seeds'
//! storm table: a peak of 1000 retries per 100 ms with fixed *and* with exponential delays).
//! Jitter is what breaks the synchrony; full jitter cut that peak to about 160. So a
//! [`Backoff`] is two independent choices:
//!
//! - **growth** of the ceiling *t* for retry *n* (*n* = 1 for the first retry, base *b*,
//!   cap *c*): [`Growth::Fixed`] *b*; [`Growth::Linear`] *b·n*; [`Growth::Exponential`]
//!   min(*c*, *b·m*^(*n*−1)); [`Growth::Envoy`] min(*c*, (2^*n* − 1)·*b*);
//! - **jitter** drawn inside that ceiling: [`Jitter::None`] *t*; [`Jitter::Full`]
//!   uniform[0, *t*); [`Jitter::Equal`] *t*/2 + uniform[0, *t*/2); [`Jitter::Decorrelated`]
//!   min(*c*, uniform[*b*, 3·*prev*)) with *prev* the previous delay, starting at *b* — it
//!   ignores the growth and needs no attempt count.
//!
//! Every computation saturates: retry 10 000 with a 1 ms base gives the cap, never a panic or a
//! wrapped value. Randomness comes from the caller (any [`rand::RngCore`]), so tests and the
//! simulator pass a seeded generator and get the same delays every run.
//!
//! Presets carry the name of their source: [`Backoff::grpc`], [`Backoff::envoy_default`],
//! [`Backoff::aws_standard`].

use std::time::Duration;

use rand::RngCore;

/// How the ceiling of the delay grows with the retry number.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Growth {
    /// Always the base.
    Fixed,
    /// base · n.
    Linear,
    /// base · multiplier^(n−1), capped.
    Exponential {
        /// Factor between consecutive ceilings; gRPC's `backoffMultiplier`.
        multiplier: f64,
    },
    /// Envoy's router: (2^n − 1) · base, capped.
    Envoy,
}

/// How the actual delay is drawn below the ceiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Jitter {
    /// The ceiling itself: synchronised clients stay synchronised.
    None,
    /// uniform[0, t): the lowest peaks; a retry may follow at once.
    Full,
    /// t/2 + uniform[0, t/2): keeps at least half the ceiling between retries.
    Equal,
    /// min(cap, uniform[base, 3·previous)): spreads without counting attempts.
    Decorrelated,
}

/// A backoff schedule: base, cap, growth and jitter.
///
/// Build one with the `const` constructors and `with_*` methods, then [`Backoff::validate`] it
/// (policies built from config do this for you). Delays are computed by [`Backoff::delay`].
///
/// # Default
///
/// [`Backoff::exponential`] starts with multiplier 2, cap 30 s and full jitter; the other
/// constructors start with cap = 30 s and no jitter.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use rand::{SeedableRng, rngs::SmallRng};
/// use stormguard::backoff::{Backoff, Jitter};
///
/// let backoff = Backoff::exponential(Duration::from_millis(100))
///     .with_cap(Duration::from_secs(2))
///     .with_jitter(Jitter::Equal);
/// backoff.validate()?;
/// let mut rng = SmallRng::seed_from_u64(7);
/// let first = backoff.delay(1, None, &mut rng);
/// assert!(first >= Duration::from_millis(50) && first < Duration::from_millis(100));
/// // Far past the cap nothing overflows:
/// assert!(backoff.delay(10_000, Some(first), &mut rng) < Duration::from_secs(2));
/// # Ok::<(), stormguard::backoff::InvalidBackoff>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    growth: Growth,
    jitter: Jitter,
}

const DEFAULT_CAP: Duration = Duration::from_secs(30);

/// Why a [`Backoff`] was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InvalidBackoff {
    /// The cap is below the base.
    #[error("backoff cap ({cap:?}) is below its base ({base:?})")]
    CapBelowBase {
        /// The base.
        base: Duration,
        /// The cap.
        cap: Duration,
    },
    /// The exponential multiplier is not a finite number above zero.
    #[error("backoff multiplier must be a finite number > 0, got {0}")]
    Multiplier(f64),
    /// Decorrelated jitter with a zero base would stay at zero forever.
    #[error("decorrelated jitter needs a base above zero")]
    ZeroBaseDecorrelated,
}

impl Backoff {
    /// The same delay before every retry.
    pub const fn fixed(delay: Duration) -> Self {
        Backoff {
            base: delay,
            cap: if delay.as_nanos() > DEFAULT_CAP.as_nanos() {
                delay
            } else {
                DEFAULT_CAP
            },
            growth: Growth::Fixed,
            jitter: Jitter::None,
        }
    }

    /// base · n before retry n.
    pub const fn linear(base: Duration) -> Self {
        Backoff {
            growth: Growth::Linear,
            ..Backoff::fixed(base)
        }
    }

    /// base · 2^(n−1) before retry n, with full jitter (change with the `with_*` methods).
    pub const fn exponential(base: Duration) -> Self {
        Backoff {
            growth: Growth::Exponential { multiplier: 2.0 },
            jitter: Jitter::Full,
            ..Backoff::fixed(base)
        }
    }

    /// Decorrelated jitter: min(cap, uniform[base, 3·previous)).
    pub const fn decorrelated(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            growth: Growth::Exponential { multiplier: 3.0 },
            jitter: Jitter::Decorrelated,
        }
    }

    /// gRPC A6 `retryPolicy`: uniform[0, min(initial · multiplier^(n−1), max)).
    pub fn grpc(
        initial_backoff: Duration,
        max_backoff: Duration,
        multiplier: f64,
    ) -> Result<Self, InvalidBackoff> {
        let backoff = Backoff::exponential(initial_backoff)
            .with_multiplier(multiplier)
            .with_cap(max_backoff);
        backoff.validate()?;
        Ok(backoff)
    }

    /// Envoy's router default: uniform[0, min(10 · 25 ms, (2^n − 1) · 25 ms)).
    pub const fn envoy_default() -> Self {
        Backoff::envoy(Duration::from_millis(25), Duration::from_millis(250))
    }

    /// Envoy's router with a chosen base interval and maximum interval.
    pub const fn envoy(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            cap: max,
            growth: Growth::Envoy,
            jitter: Jitter::Full,
        }
    }

    /// The AWS SDK standard retry mode: uniform[0, min(2^(n−1) s, 20 s)).
    pub const fn aws_standard() -> Self {
        Backoff::exponential(Duration::from_secs(1)).with_cap(Duration::from_secs(20))
    }

    /// Sets the cap.
    pub const fn with_cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// Sets the jitter.
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets the growth.
    pub const fn with_growth(mut self, growth: Growth) -> Self {
        self.growth = growth;
        self
    }

    /// Makes the growth exponential with this multiplier.
    pub const fn with_multiplier(self, multiplier: f64) -> Self {
        self.with_growth(Growth::Exponential { multiplier })
    }

    /// Checks the invariants: cap ≥ base, a finite multiplier above zero, and a non-zero base
    /// for decorrelated jitter.
    pub fn validate(&self) -> Result<(), InvalidBackoff> {
        if self.cap < self.base {
            return Err(InvalidBackoff::CapBelowBase {
                base: self.base,
                cap: self.cap,
            });
        }
        if let Growth::Exponential { multiplier } = self.growth {
            if !(multiplier.is_finite() && multiplier > 0.0) {
                return Err(InvalidBackoff::Multiplier(multiplier));
            }
        }
        if self.jitter == Jitter::Decorrelated && self.base.is_zero() {
            return Err(InvalidBackoff::ZeroBaseDecorrelated);
        }
        Ok(())
    }

    /// The base delay.
    pub const fn base(&self) -> Duration {
        self.base
    }

    /// The cap.
    pub const fn cap(&self) -> Duration {
        self.cap
    }

    /// The growth.
    pub const fn growth(&self) -> Growth {
        self.growth
    }

    /// The jitter.
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The ceiling *t* for retry `retry` (1 for the first retry) before jitter is applied.
    ///
    /// Retry 0 is treated as retry 1. Saturates at the cap for any retry number.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let n = retry.max(1);
        let grown = match self.growth {
            Growth::Fixed => self.base,
            Growth::Linear => self.base.saturating_mul(n),
            // Doubling, the common case, stays in integers: exact and cheaper.
            Growth::Exponential { multiplier: 2.0 } => doubled(self.base, n - 1),
            Growth::Exponential { multiplier } => scale(
                self.base,
                multiplier.powi(i32::try_from(n - 1).unwrap_or(i32::MAX)),
            ),
            Growth::Envoy => {
                let factor = 1u32.checked_shl(n).map_or(u32::MAX, |p| p - 1);
                self.base.saturating_mul(factor)
            }
        };
        grown.min(self.cap)
    }

    /// The delay before retry `retry` (1 for the first retry).
    ///
    /// `previous` is the delay returned for the retry before (only decorrelated jitter uses
    /// it; `None` means "start from the base"). `rng` supplies the randomness.
    pub fn delay<R: RngCore + ?Sized>(
        &self,
        retry: u32,
        previous: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        match self.jitter {
            Jitter::None => self.ceiling(retry),
            Jitter::Full => uniform_below(self.ceiling(retry), rng),
            Jitter::Equal => {
                let t = self.ceiling(retry);
                let half = t / 2;
                half + uniform_below(t - half, rng)
            }
            Jitter::Decorrelated => {
                let previous = previous.unwrap_or(self.base).max(self.base);
                let upper = previous.saturating_mul(3);
                let span = upper.saturating_sub(self.base);
                (self.base + uniform_below(span, rng)).min(self.cap)
            }
        }
    }
}

/// `d · 2^times`, exactly, saturating at `Duration::MAX`.
fn doubled(d: Duration, times: u32) -> Duration {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return Duration::ZERO;
    }
    if times >= nanos.leading_zeros() {
        return Duration::MAX;
    }
    let grown = nanos << times;
    match u64::try_from(grown / 1_000_000_000) {
        Ok(secs) => Duration::new(secs, (grown % 1_000_000_000) as u32),
        Err(_) => Duration::MAX,
    }
}

/// `d · factor`, saturating at `Duration::MAX` for huge, infinite or NaN products.
fn scale(d: Duration, factor: f64) -> Duration {
    let nanos = d.as_nanos() as f64 * factor;
    if nanos.is_nan() || nanos < 0.0 {
        Duration::ZERO
    } else if nanos >= Duration::MAX.as_nanos() as f64 {
        Duration::MAX
    } else {
        Duration::try_from_secs_f64(nanos / 1e9).unwrap_or(Duration::MAX)
    }
}

/// uniform[0, upper): zero when `upper` is zero. Uses the multiply-shift method on the
/// nanosecond count, which is exact and has no modulo bias worth measuring.
pub(crate) fn uniform_below<R: RngCore + ?Sized>(upper: Duration, rng: &mut R) -> Duration {
    let Ok(upper_nanos) = u64::try_from(upper.as_nanos()) else {
        // Longer than 584 years: draw in milliseconds instead.
        let millis = u64::try_from(upper.as_millis()).unwrap_or(u64::MAX);
        return Duration::from_millis(mul_shift(rng.next_u64(), millis));
    };
    Duration::from_nanos(mul_shift(rng.next_u64(), upper_nanos))
}

fn mul_shift(random: u64, upper: u64) -> u64 {
    // (random · upper) / 2^64 < upper, so the narrowing cannot truncate.
    ((u128::from(random) * u128::from(upper)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    const MS: Duration = Duration::from_millis(1);

    fn rng(seed: u64) -> SmallRng {
        SmallRng::seed_from_u64(seed)
    }

    #[test]
    fn growth_matches_the_seeds_table() {
        // base 100 ms, 4 retries: fixed 100/100/100/100, linear 100/200/300/400,
        // exponential 100/200/400/800.
        let base = Duration::from_millis(100);
        let ceilings = |b: Backoff| (1..=4).map(|n| b.ceiling(n)).collect::<Vec<_>>();
        assert_eq!(ceilings(Backoff::fixed(base)), vec![base; 4]);
        assert_eq!(
            ceilings(Backoff::linear(base)),
            vec![base, base * 2, base * 3, base * 4]
        );
        assert_eq!(
            ceilings(Backoff::exponential(base)),
            vec![base, base * 2, base * 4, base * 8]
        );
    }

    #[test]
    fn doubling_matches_the_general_multiplier_path() {
        let doubling = Backoff::exponential(3 * MS).with_cap(Duration::MAX);
        let general = doubling.with_multiplier(2.000_000_1);
        for n in 1..40 {
            let (exact, approx) = (doubling.ceiling(n), general.ceiling(n));
            let diff = exact.abs_diff(approx);
            assert!(
                diff <= exact / 100_000,
                "retry {n}: {exact:?} vs {approx:?}"
            );
        }
        assert_eq!(doubling.ceiling(33), 3 * MS * (1 << 16) * (1 << 16));
        assert_eq!(
            doubling.ceiling(200),
            Duration::MAX,
            "saturates, never wraps"
        );
    }

    #[test]
    fn envoy_ceiling_is_two_to_the_n_minus_one() {
        let b = Backoff::envoy_default();
        let got: Vec<_> = (1..=5).map(|n| b.ceiling(n)).collect();
        assert_eq!(got, vec![25 * MS, 75 * MS, 175 * MS, 250 * MS, 250 * MS]);
    }

    #[test]
    fn aws_standard_grows_to_twenty_seconds() {
        let b = Backoff::aws_standard();
        assert_eq!(b.ceiling(1), Duration::from_secs(1));
        assert_eq!(b.ceiling(5), Duration::from_secs(16));
        assert_eq!(b.ceiling(6), Duration::from_secs(20));
        assert_eq!(b.jitter(), Jitter::Full);
    }

    #[test]
    fn grpc_preset_uses_its_multiplier() {
        let b =
            Backoff::grpc(Duration::from_millis(100), Duration::from_secs(1), 1.5).expect("valid");
        assert_eq!(b.ceiling(1), 100 * MS);
        assert_eq!(b.ceiling(2), 150 * MS);
        assert_eq!(b.ceiling(3), 225 * MS);
        assert_eq!(b.ceiling(20), Duration::from_secs(1));
    }

    #[test]
    fn huge_retry_numbers_give_the_cap() {
        let cap = Duration::from_secs(5);
        for b in [
            Backoff::exponential(MS).with_cap(cap),
            Backoff::linear(MS).with_cap(cap),
            Backoff::envoy(MS, cap),
            Backoff::exponential(MS)
                .with_cap(cap)
                .with_multiplier(1e300),
        ] {
            for n in [10_000, 1 << 20, u32::MAX] {
                assert_eq!(b.ceiling(n), cap, "{b:?} retry {n}");
                assert!(b.delay(n, None, &mut rng(1)) <= cap);
            }
        }
        let none = Backoff::exponential(MS)
            .with_cap(cap)
            .with_jitter(Jitter::None);
        assert_eq!(none.delay(10_000, None, &mut rng(1)), cap);
    }

    #[test]
    fn validation_names_the_broken_rule() {
        assert_eq!(
            Backoff::exponential(Duration::from_secs(2))
                .with_cap(Duration::from_secs(1))
                .validate(),
            Err(InvalidBackoff::CapBelowBase {
                base: Duration::from_secs(2),
                cap: Duration::from_secs(1)
            })
        );
        assert!(matches!(
            Backoff::exponential(MS).with_multiplier(f64::NAN).validate(),
            Err(InvalidBackoff::Multiplier(m)) if m.is_nan()
        ));
        assert_eq!(
            Backoff::exponential(MS).with_multiplier(0.0).validate(),
            Err(InvalidBackoff::Multiplier(0.0))
        );
        assert_eq!(
            Backoff::decorrelated(Duration::ZERO, MS).validate(),
            Err(InvalidBackoff::ZeroBaseDecorrelated)
        );
        assert!(Backoff::envoy_default().validate().is_ok());
    }

    #[test]
    fn full_jitter_spreads_over_the_whole_range() {
        let b = Backoff::exponential(Duration::from_secs(1)).with_cap(Duration::from_secs(30));
        let mut r = rng(42);
        let draws: Vec<_> = (0..10_000).map(|_| b.delay(1, None, &mut r)).collect();
        let below_quarter = draws.iter().filter(|d| **d < 250 * MS).count();
        // About a quarter of uniform[0, 1 s) falls below 250 ms.
        assert!((2_300..2_700).contains(&below_quarter), "{below_quarter}");
    }

    fn jitter() -> impl Strategy<Value = Jitter> {
        prop_oneof![
            Just(Jitter::None),
            Just(Jitter::Full),
            Just(Jitter::Equal),
            Just(Jitter::Decorrelated)
        ]
    }

    fn growth() -> impl Strategy<Value = Growth> {
        prop_oneof![
            Just(Growth::Fixed),
            Just(Growth::Linear),
            (0.5f64..10.0).prop_map(|multiplier| Growth::Exponential { multiplier }),
            Just(Growth::Envoy),
        ]
    }

    proptest! {
        #[test]
        fn every_delay_is_inside_its_kinds_bounds(
            base_ms in 1u64..10_000,
            extra_ms in 0u64..100_000,
            growth in growth(),
            jitter in jitter(),
            retry in 0u32..20_000,
            prev_ms in proptest::option::of(0u64..1_000_000),
            seed in any::<u64>(),
        ) {
            let base = Duration::from_millis(base_ms);
            let cap = base + Duration::from_millis(extra_ms);
            let b = Backoff::fixed(base).with_cap(cap).with_growth(growth).with_jitter(jitter);
            let previous = prev_ms.map(Duration::from_millis);
            let d = b.delay(retry, previous, &mut rng(seed));
            let t = b.ceiling(retry);
            prop_assert!(t <= cap);
            match jitter {
                Jitter::None => prop_assert_eq!(d, t),
                Jitter::Full => prop_assert!(d < t || (t.is_zero() && d.is_zero())),
                Jitter::Equal => {
                    prop_assert!(d >= t / 2, "equal jitter {d:?} below half of {t:?}");
                    prop_assert!(d <= t);
                }
                Jitter::Decorrelated => {
                    prop_assert!(d <= cap, "decorrelated {d:?} above cap {cap:?}");
                    prop_assert!(d >= base.min(cap));
                    let prev = previous.unwrap_or(base).max(base);
                    prop_assert!(d < prev * 3 || d == base);
                }
            }
        }

        #[test]
        fn seeded_delays_repeat(seed in any::<u64>(), retry in 1u32..50) {
            let b = Backoff::exponential(MS).with_cap(Duration::from_secs(5));
            prop_assert_eq!(b.delay(retry, None, &mut rng(seed)), b.delay(retry, None, &mut rng(seed)));
        }
    }
}
