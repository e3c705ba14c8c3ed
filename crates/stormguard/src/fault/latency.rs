//! Latency distributions for injected delays.

use std::time::Duration;

use rand::{Rng, RngCore};

use super::InvalidFault;

/// How long an injected delay lasts.
///
/// Real latency is rarely one number: most calls are fast and a few are very slow (a GC pause,
/// a cold cache, a retransmit). Hedging exists for that tail, so the distributions here are
/// the shapes worth testing it against.
///
/// | distribution | draw |
/// | --- | --- |
/// | [`Fixed`](Latency::Fixed) | always the same delay |
/// | [`Uniform`](Latency::Uniform) | uniform in `[min, max)` (`min` when they are equal) |
/// | [`Bimodal`](Latency::Bimodal) | `slow` with probability `slow_share`, else `fast` (say 95 % at 10 ms, 5 % at 500 ms) |
/// | [`Exponential`](Latency::Exponential) | exponential with the given mean: `−mean·ln(1 − u)`; a draw never exceeds about 37 × mean, because `u` has 53 bits |
///
/// Every draw saturates at [`Duration::MAX`] instead of overflowing.
///
/// ```
/// use std::time::Duration;
/// use rand::{SeedableRng, rngs::SmallRng};
/// use stormguard::fault::Latency;
///
/// let ms = Duration::from_millis;
/// let tail = Latency::Bimodal { fast: ms(10), slow: ms(500), slow_share: 0.05 };
/// tail.validate()?;
/// let mut rng = SmallRng::seed_from_u64(7);
/// let slow = (0..10_000).filter(|_| tail.sample(&mut rng) == ms(500)).count();
/// assert!((400..600).contains(&slow), "{slow}");
/// # Ok::<(), stormguard::fault::InvalidFault>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Latency {
    /// Always this delay.
    Fixed(Duration),
    /// Uniform in `[min, max)`.
    Uniform {
        /// The shortest delay.
        min: Duration,
        /// The delay no draw reaches (every draw is below it unless `min == max`).
        max: Duration,
    },
    /// `slow` with probability `slow_share` (0.0..=1.0), otherwise `fast`.
    Bimodal {
        /// The usual delay.
        fast: Duration,
        /// The tail delay.
        slow: Duration,
        /// The share of draws that are slow.
        slow_share: f64,
    },
    /// Exponentially distributed with this mean.
    Exponential {
        /// The mean delay.
        mean: Duration,
    },
}

impl Latency {
    /// Checks the distribution's parameters: a uniform range must not be reversed and a
    /// bimodal share must be a number in `0.0..=1.0`.
    ///
    /// # Errors
    ///
    /// [`InvalidFault::UniformRange`] or [`InvalidFault::SlowShare`].
    pub fn validate(&self) -> Result<(), InvalidFault> {
        match *self {
            Latency::Uniform { min, max } if min > max => {
                Err(InvalidFault::UniformRange { min, max })
            }
            Latency::Bimodal { slow_share, .. } if !(0.0..=1.0).contains(&slow_share) => {
                Err(InvalidFault::SlowShare(slow_share))
            }
            _ => Ok(()),
        }
    }

    /// Draws one delay. Never panics, even for parameters [`validate`](Latency::validate)
    /// refuses: a reversed range draws `min`, and a share outside `0.0..=1.0` (or NaN) is
    /// clamped into it.
    pub fn sample<R: RngCore + ?Sized>(&self, rng: &mut R) -> Duration {
        match *self {
            Latency::Fixed(d) => d,
            Latency::Uniform { min, max } => {
                let span = max.saturating_sub(min);
                min.saturating_add(scale(span, unit(rng)).min(span))
            }
            Latency::Bimodal {
                fast,
                slow,
                slow_share,
            } => {
                if unit(rng) < clamp_share(slow_share) {
                    slow
                } else {
                    fast
                }
            }
            Latency::Exponential { mean } => scale(mean, -(1.0 - unit(rng)).ln()),
        }
    }
}

/// A uniform draw in `[0, 1)` with 53 bits of precision.
fn unit<R: RngCore + ?Sized>(rng: &mut R) -> f64 {
    rng.random::<f64>()
}

/// `share` clamped into `0.0..=1.0`; NaN becomes 0.
fn clamp_share(share: f64) -> f64 {
    if share.is_nan() {
        0.0
    } else {
        share.clamp(0.0, 1.0)
    }
}

/// `d × factor` for a finite, non-negative factor, saturating at [`Duration::MAX`].
fn scale(d: Duration, factor: f64) -> Duration {
    let secs = d.as_secs_f64() * factor;
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn uniform_stays_in_range_and_reversed_ranges_are_refused() {
        let latency = Latency::Uniform {
            min: 10 * MS,
            max: 20 * MS,
        };
        let mut rng = SmallRng::seed_from_u64(1);
        for _ in 0..1000 {
            let d = latency.sample(&mut rng);
            assert!(d >= 10 * MS && d < 20 * MS, "{d:?}");
        }
        let reversed = Latency::Uniform {
            min: 20 * MS,
            max: 10 * MS,
        };
        assert!(reversed.validate().is_err());
        assert_eq!(reversed.sample(&mut rng), 20 * MS);
    }

    #[test]
    fn exponential_mean_is_close_and_huge_means_saturate() {
        let latency = Latency::Exponential { mean: 100 * MS };
        let mut rng = SmallRng::seed_from_u64(2);
        let n = 20_000u32;
        let total: Duration = (0..n).map(|_| latency.sample(&mut rng)).sum();
        let mean = total / n;
        assert!(mean > 95 * MS && mean < 105 * MS, "{mean:?}");
        let huge = Latency::Exponential {
            mean: Duration::MAX,
        };
        for _ in 0..100 {
            let _ = huge.sample(&mut rng);
        }
    }
}
