//! The breaker and its state, and how the state is kept: behind a mutex, with a lock-free
//! mirror of the phase that a closed breaker's hot path reads with one atomic load. The state
//! machine that moves it is in `circuit.rs`; the permits that hold a reference to the breaker
//! are in `permit.rs`, and both build on the definitions here.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use rand::rngs::SmallRng;

use super::config::BreakerConfig;
use crate::health::HealthWindow;

/// The breaker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls are admitted and recorded.
    Closed,
    /// Calls are rejected until the open duration has passed.
    Open,
    /// A bounded number of probes are admitted.
    HalfOpen,
    /// Held open by [`CircuitBreaker::isolate`](super::CircuitBreaker::isolate).
    Isolated,
}

impl BreakerState {
    /// The state's one name in metrics labels, logs and status pages: `closed`, `open`,
    /// `half_open`, `isolated`.
    ///
    /// ```
    /// use stormguard::breaker::BreakerState;
    /// assert_eq!(BreakerState::HalfOpen.label(), "half_open");
    /// ```
    pub const fn label(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Isolated => "isolated",
        }
    }
}

/// Where the state machine is, with what each phase needs to decide.
#[derive(Clone, Copy, Debug)]
pub(super) enum Phase {
    Closed,
    Open { until_ms: u64 },
    HalfOpen { admitted: u32, succeeded: u32 },
    Isolated,
}

/// The lock-free mirror of the breaker's phase: the phase in the low bits, the epoch above.
pub(super) const PHASE_BITS: u32 = 2;
pub(super) const PHASE_MASK: u64 = (1 << PHASE_BITS) - 1;
pub(super) const CLOSED: u64 = 0;
pub(super) const OPEN: u64 = 1;
pub(super) const HALF_OPEN: u64 = 2;
pub(super) const ISOLATED: u64 = 3;
/// No evaluation of the closed state is current (see `CircuitBreaker::record`).
pub(super) const NO_TOKEN: u64 = u64::MAX;

impl Phase {
    pub(super) fn state(self) -> BreakerState {
        match self {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
            Phase::Isolated => BreakerState::Isolated,
        }
    }

    /// The phase's code in the lock-free mirror.
    pub(super) const fn code(self) -> u64 {
        match self {
            Phase::Closed => CLOSED,
            Phase::Open { .. } => OPEN,
            Phase::HalfOpen { .. } => HALF_OPEN,
            Phase::Isolated => ISOLATED,
        }
    }
}

/// The state behind the breaker's mutex.
#[derive(Debug)]
pub(super) struct Core {
    pub(super) phase: Phase,
    /// Bumped on every state change, so a permit from an earlier half-open period cannot
    /// count as a probe of the current one.
    pub(super) epoch: u64,
    /// Opens since the breaker last closed (drives growth).
    pub(super) consecutive_opens: u32,
    pub(super) rng: SmallRng,
}

/// A circuit breaker over a (possibly shared) [`HealthWindow`].
///
/// `Send + Sync`; share it in an [`Arc`] between the callers of one downstream.
///
/// ```
/// use std::time::Duration;
/// use stormguard::breaker::{BreakerConfig, BreakerState, CircuitBreaker};
/// use stormguard::classify::Outcome;
/// use stormguard::clock::ManualClock;
/// use stormguard::health::HealthConfig;
///
/// let clock = ManualClock::new();
/// let config = BreakerConfig::new(HealthConfig::count(4))
///     .with_minimum_throughput(4)
///     .with_open_duration(Duration::from_secs(5))
///     .with_permitted_probes(1);
/// let breaker = CircuitBreaker::new(config, clock.clock()).unwrap();
///
/// for outcome in [Outcome::Success, Outcome::Retryable, Outcome::Success, Outcome::InDoubt] {
///     let permit = breaker.try_acquire().unwrap();
///     permit.record(outcome, Duration::from_millis(10));
/// }
/// // 2 failures in 4 calls: 50 % >= 50 %.
/// assert_eq!(breaker.state(), BreakerState::Open);
/// assert_eq!(breaker.try_acquire().unwrap_err().retry_after, Duration::from_secs(5));
///
/// clock.advance(Duration::from_secs(5));
/// let probe = breaker.try_acquire().unwrap();
/// assert!(probe.is_probe());
/// probe.record(Outcome::Success, Duration::from_millis(10));
/// assert_eq!(breaker.state(), BreakerState::Closed);
/// ```
#[derive(Debug)]
pub struct CircuitBreaker<O = ()> {
    pub(super) config: BreakerConfig,
    pub(super) window: Arc<HealthWindow>,
    /// `phase code | epoch << PHASE_BITS`, written under `core`'s lock, read without it.
    pub(super) state: AtomicU64,
    /// The window version at which the closed state was last evaluated and found unable to
    /// open on a healthy call, or [`NO_TOKEN`].
    pub(super) eval_token: AtomicU64,
    pub(super) core: Mutex<Core>,
    pub(super) observer: O,
}
