//! The breaker's state, and how it is kept: behind a mutex, with a lock-free mirror of the
//! phase that a closed breaker's hot path reads with one atomic load.

use rand::rngs::SmallRng;

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
