//! Where a retrier's jitter comes from.
//!
//! Every process must jitter differently (processes restarted together would otherwise retry
//! together), yet tests and simulations must repeat exactly; and a call that never retries
//! should not pay for a generator. So a retrier holds a [`RandomSource`] that makes one
//! generator per call, seeded from the source's seed and the call's number, and the call
//! makes it only at its first retry ([`LazyRng`]).

use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

/// Where a retrier's jitter comes from: one generator per call, made only when the call
/// needs its first retry.
pub trait RandomSource: Send + Sync {
    /// The generator a call draws from.
    type Rng: RngCore;
    /// A generator for one call.
    fn rng(&self) -> Self::Rng;
}

/// Seeded per-call generators: call *k* of a retrier seeded with *s* always draws the same
/// delays, so tests and simulations repeat exactly.
///
/// [`SeededRandom::from_entropy`] seeds from the operating system instead: in production
/// every process must jitter differently, or processes restarted together would retry
/// together.
#[derive(Debug)]
pub struct SeededRandom {
    seed: u64,
    calls: AtomicU64,
}

impl SeededRandom {
    /// Generators derived from `seed`.
    pub fn new(seed: u64) -> Self {
        SeededRandom {
            seed,
            calls: AtomicU64::new(0),
        }
    }

    /// Generators derived from a seed drawn from the operating system.
    pub fn from_entropy() -> Self {
        SeededRandom::new(SmallRng::from_os_rng().next_u64())
    }
}

impl RandomSource for SeededRandom {
    type Rng = SmallRng;

    fn rng(&self) -> SmallRng {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        SmallRng::seed_from_u64(self.seed ^ call.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

/// Makes the call's generator on first use, so a call that never retries never makes one.
pub(super) struct LazyRng<'a, R: RandomSource> {
    source: &'a R,
    rng: Option<R::Rng>,
}

impl<'a, R: RandomSource> LazyRng<'a, R> {
    pub(super) fn new(source: &'a R) -> Self {
        LazyRng { source, rng: None }
    }

    fn get(&mut self) -> &mut R::Rng {
        self.rng.get_or_insert_with(|| self.source.rng())
    }
}

impl<R: RandomSource> RngCore for LazyRng<'_, R> {
    fn next_u32(&mut self) -> u32 {
        self.get().next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.get().next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.get().fill_bytes(dest)
    }
}
