//! What a hedger is allowed to do: attempts, the delay between them, idempotency.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::health::HealthWindow;

/// gRPC A6's client-side cap on `maxAttempts`: a policy asking for more gets this many.
pub const MAX_ATTEMPTS: u32 = 5;

/// How long to wait for an answer before sending the next hedge.
///
/// A fixed delay is gRPC A6's `hedgingDelay`. The usual advice (Dean and Barroso, "The Tail
/// at Scale") is to hedge after the 95th-percentile latency, so that only the slowest
/// 5 % of calls pay for a second attempt; a [`Dynamic`](HedgeDelay::Dynamic) delay reads
/// such a percentile from a live source — say a health window's latency percentile:
///
/// ```
/// use std::time::Duration;
/// use stormguard::hedge::HedgeDelay;
///
/// // Stand-in for a shared window's p95 (None while it has too few samples).
/// let p95 = || Some(Duration::from_millis(40));
/// let delay = HedgeDelay::dynamic(Duration::from_millis(50), p95);
/// assert_eq!(delay.resolve(), Duration::from_millis(40));
/// let cold = HedgeDelay::dynamic(Duration::from_millis(50), || None);
/// assert_eq!(cold.resolve(), Duration::from_millis(50));
/// ```
#[derive(Clone)]
pub enum HedgeDelay {
    /// Always this delay (A6 `hedgingDelay`; zero sends every attempt at once).
    Fixed(Duration),
    /// Asked once per hedged call; `fallback` when the provider has no answer.
    Dynamic {
        /// The live source of the delay.
        provider: Arc<dyn Fn() -> Option<Duration> + Send + Sync>,
        /// The delay used while the provider answers `None`.
        fallback: Duration,
    },
}

impl HedgeDelay {
    /// A delay read from `provider` for every hedged call, `fallback` when it has no answer.
    pub fn dynamic(
        fallback: Duration,
        provider: impl Fn() -> Option<Duration> + Send + Sync + 'static,
    ) -> Self {
        HedgeDelay::Dynamic {
            provider: Arc::new(provider),
            fallback,
        }
    }

    /// The `q` latency percentile of a shared health window (say 0.95), `fallback` while the
    /// window is empty: the window the breaker and the retrier read, so hedging follows the
    /// same view of the downstream.
    ///
    /// A window fed by a hedger only learns the latency of the attempts that finished; slow
    /// losers are cancelled before they finish, which biases it low under heavy hedging. Feed
    /// it from the first attempt of each call (or from all calls, hedged or not) to avoid that.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use stormguard::classify::Outcome;
    /// use stormguard::clock::Clock;
    /// use stormguard::health::{HealthConfig, HealthWindow};
    /// use stormguard::hedge::HedgeDelay;
    ///
    /// let window = Arc::new(HealthWindow::new(HealthConfig::default(), Clock::system())?);
    /// let delay = HedgeDelay::percentile(window.clone(), 0.95, Duration::from_millis(50));
    /// assert_eq!(delay.resolve(), Duration::from_millis(50), "empty window: the fallback");
    /// for _ in 0..100 {
    ///     window.record(Outcome::Success, Duration::from_millis(8));
    /// }
    /// assert_eq!(Some(delay.resolve()), window.latency_percentile(0.95));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn percentile(window: Arc<HealthWindow>, q: f64, fallback: Duration) -> Self {
        HedgeDelay::dynamic(fallback, move || window.latency_percentile(q))
    }

    /// The delay to use now.
    pub fn resolve(&self) -> Duration {
        match self {
            HedgeDelay::Fixed(d) => *d,
            HedgeDelay::Dynamic { provider, fallback } => provider().unwrap_or(*fallback),
        }
    }
}

impl fmt::Debug for HedgeDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HedgeDelay::Fixed(d) => f.debug_tuple("Fixed").field(d).finish(),
            HedgeDelay::Dynamic { fallback, .. } => f
                .debug_struct("Dynamic")
                .field("fallback", fallback)
                .finish_non_exhaustive(),
        }
    }
}

/// Why a [`HedgePolicy`] was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidHedge {
    /// gRPC A6 requires `maxAttempts` of two or more (it counts the original request).
    #[error("max_attempts must be at least 2 (it counts the original request), got {0}")]
    MaxAttempts(u32),
}

/// The static part of a hedging policy (gRPC A6 `hedgingPolicy`), shared by every call.
///
/// # Default
///
/// [`HedgePolicy::new`] treats operations as *not* idempotent (a call is hedged only when
/// it says it is idempotent or carries an idempotency key) and needs no minimum time before
/// the deadline to send a hedge.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use stormguard::hedge::{HedgeDelay, HedgePolicy, InvalidHedge};
///
/// let policy = HedgePolicy::new(7, HedgeDelay::Fixed(Duration::from_millis(20)));
/// policy.validate()?;
/// assert_eq!(policy.max_attempts(), 5, "A6 caps maxAttempts at 5");
/// assert_eq!(HedgePolicy::new(1, HedgeDelay::Fixed(Duration::ZERO)).validate().unwrap_err(),
///            InvalidHedge::MaxAttempts(1));
/// # Ok::<(), InvalidHedge>(())
/// ```
#[derive(Clone, Debug)]
pub struct HedgePolicy {
    max_attempts: u32,
    delay: HedgeDelay,
    min_call: Duration,
    idempotent: bool,
}

impl HedgePolicy {
    /// Up to `max_attempts` attempts in all (the original included; more than
    /// [`MAX_ATTEMPTS`] counts as [`MAX_ATTEMPTS`], as in A6), one every `delay`.
    pub fn new(max_attempts: u32, delay: HedgeDelay) -> Self {
        HedgePolicy {
            max_attempts,
            delay,
            min_call: Duration::ZERO,
            idempotent: false,
        }
    }

    /// No hedge is sent when the deadline leaves less than `min_call`.
    pub fn with_min_call(mut self, min_call: Duration) -> Self {
        self.min_call = min_call;
        self
    }

    /// Declares the operations under this policy idempotent, so calls are hedged without an
    /// idempotency key.
    pub fn with_idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = idempotent;
        self
    }

    /// Checks every field; see [`InvalidHedge`].
    ///
    /// # Errors
    ///
    /// [`InvalidHedge::MaxAttempts`] for fewer than 2 attempts.
    pub fn validate(&self) -> Result<(), InvalidHedge> {
        if self.max_attempts < 2 {
            return Err(InvalidHedge::MaxAttempts(self.max_attempts));
        }
        Ok(())
    }

    /// Attempts in all, the original included, capped at [`MAX_ATTEMPTS`].
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts.min(MAX_ATTEMPTS)
    }

    /// The delay between attempts.
    pub fn delay(&self) -> &HedgeDelay {
        &self.delay
    }

    /// The least time before the deadline for which a hedge is still sent.
    pub fn min_call(&self) -> Duration {
        self.min_call
    }

    /// Whether operations under this policy are idempotent by default.
    pub fn idempotent(&self) -> bool {
        self.idempotent
    }
}
