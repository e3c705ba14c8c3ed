//! The state machine: admitting calls, recording their outcomes, and moving between closed,
//! open, half-open and isolated.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

use super::config::BreakerConfig;
use super::error::{BreakerOpen, Rejection};
use super::events::{BreakerObserver, Cause, StateChange};
use super::permit::{OwnedPermit, Permit, Ticket};
use super::state::{
    BreakerState, CLOSED, CircuitBreaker, Core, HALF_OPEN, NO_TOKEN, OPEN, PHASE_BITS, PHASE_MASK,
    Phase,
};
use crate::classify::Outcome;
use crate::clock::Clock;
use crate::health::{HealthCounts, HealthWindow, InvalidConfig, Recorded};

impl CircuitBreaker {
    /// A breaker with its own window built from `config`, on `clock`, with an OS-seeded
    /// jitter source.
    pub fn new(config: BreakerConfig, clock: Clock) -> Result<Self, InvalidConfig> {
        let window = Arc::new(HealthWindow::new(config.window, clock)?);
        Self::with_window(config, window)
    }

    /// A breaker reading a window shared with other policies. The window's own configuration
    /// is used; `config`'s window part is ignored.
    pub fn with_window(
        config: BreakerConfig,
        window: Arc<HealthWindow>,
    ) -> Result<Self, InvalidConfig> {
        config.validate_breaker(window.config())?;
        let config = config.with_window(*window.config());
        Ok(Self::from_parts(config, window))
    }

    /// [`BreakerConfig::resilience4j_default`] on [`Clock::default`].
    pub fn resilience4j_default() -> Self {
        Self::preset(BreakerConfig::resilience4j_default())
    }

    /// [`BreakerConfig::polly_default`] on [`Clock::default`].
    pub fn polly_default() -> Self {
        Self::preset(BreakerConfig::polly_default())
    }

    /// [`BreakerConfig::seeds_default`] on [`Clock::default`].
    pub fn seeds_default() -> Self {
        Self::preset(BreakerConfig::seeds_default())
    }

    fn preset(config: BreakerConfig) -> Self {
        // The presets are valid (a test checks each), so the window is built unchecked.
        let window = Arc::new(HealthWindow::build(config.window, Clock::default()));
        Self::from_parts(config, window)
    }

    fn from_parts(config: BreakerConfig, window: Arc<HealthWindow>) -> Self {
        CircuitBreaker {
            config,
            window,
            state: AtomicU64::new(CLOSED),
            eval_token: AtomicU64::new(NO_TOKEN),
            core: Mutex::new(Core {
                phase: Phase::Closed,
                epoch: 0,
                consecutive_opens: 0,
                rng: SmallRng::from_os_rng(),
            }),
            observer: (),
        }
    }
}

impl<O: BreakerObserver> CircuitBreaker<O> {
    /// Reports events to `observer` instead.
    pub fn with_observer<P: BreakerObserver>(self, observer: P) -> CircuitBreaker<P> {
        CircuitBreaker {
            config: self.config,
            window: self.window,
            state: self.state,
            eval_token: self.eval_token,
            core: self.core,
            observer,
        }
    }

    /// Seeds the jitter source, for reproducible open durations.
    pub fn with_seed(self, seed: u64) -> Self {
        self.lock().rng = SmallRng::seed_from_u64(seed);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// The window this breaker reads (share it with other policies).
    pub fn window(&self) -> &Arc<HealthWindow> {
        &self.window
    }

    /// The current state (one atomic load). An open breaker whose open duration has passed
    /// still reports [`BreakerState::Open`] until the next [`try_acquire`](Self::try_acquire).
    pub fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) & PHASE_MASK {
            CLOSED => BreakerState::Closed,
            OPEN => BreakerState::Open,
            HALF_OPEN => BreakerState::HalfOpen,
            _ => BreakerState::Isolated,
        }
    }

    /// Admits a call, or rejects it. Record the call's outcome on the returned [`Permit`].
    ///
    /// A closed breaker admits with one atomic load and no lock.
    #[inline]
    pub fn try_acquire(&self) -> Result<Permit<'_, O>, BreakerOpen> {
        let ticket = self.acquire()?;
        Ok(Permit {
            breaker: self,
            ticket,
            done: false,
        })
    }

    /// [`try_acquire`](Self::try_acquire) for a breaker in an [`Arc`]: the permit owns a
    /// reference to the breaker, so it can travel in a `'static` future (a tower service's
    /// response future, a spawned task).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use stormguard::breaker::{BreakerConfig, CircuitBreaker};
    /// use stormguard::classify::Outcome;
    /// use stormguard::clock::Clock;
    ///
    /// let breaker = Arc::new(CircuitBreaker::new(BreakerConfig::seeds_default(), Clock::system()).unwrap());
    /// let permit = breaker.try_acquire_owned().unwrap();
    /// std::thread::spawn(move || permit.record(Outcome::Success, Duration::from_millis(3)))
    ///     .join()
    ///     .unwrap();
    /// assert_eq!(breaker.window().snapshot().successes, 1);
    /// ```
    #[inline]
    pub fn try_acquire_owned(self: &Arc<Self>) -> Result<OwnedPermit<O>, BreakerOpen> {
        let ticket = self.acquire()?;
        Ok(OwnedPermit {
            breaker: Arc::clone(self),
            ticket,
            done: false,
        })
    }

    #[inline]
    fn acquire(&self) -> Result<Ticket, BreakerOpen> {
        let state = self.state.load(Ordering::Acquire);
        if state & PHASE_MASK == CLOSED {
            return Ok(Ticket {
                probe: false,
                epoch: state >> PHASE_BITS,
            });
        }
        self.acquire_slow()
    }

    #[cold]
    fn acquire_slow(&self) -> Result<Ticket, BreakerOpen> {
        let mut core = self.lock();
        let hint = self.config.open_duration;
        let (result, event) = match core.phase {
            Phase::Closed => (Ok(false), None),
            Phase::Open { until_ms } => {
                let now = self.window.now_millis();
                if now >= until_ms {
                    let event = self.transition(
                        &mut core,
                        Phase::HalfOpen {
                            admitted: 1,
                            succeeded: 0,
                        },
                        Cause::OpenElapsed,
                        None,
                        None,
                    );
                    (Ok(true), Some(event))
                } else {
                    let rejected = BreakerOpen {
                        retry_after: Duration::from_millis(until_ms - now),
                        reason: Rejection::Open,
                    };
                    (Err(rejected), None)
                }
            }
            Phase::HalfOpen {
                admitted,
                succeeded,
            } => {
                if admitted < self.config.permitted_probes {
                    core.phase = Phase::HalfOpen {
                        admitted: admitted + 1,
                        succeeded,
                    };
                    (Ok(true), None)
                } else {
                    let rejected = BreakerOpen {
                        retry_after: hint,
                        reason: Rejection::ProbesBusy,
                    };
                    (Err(rejected), None)
                }
            }
            Phase::Isolated => (
                Err(BreakerOpen {
                    retry_after: hint,
                    reason: Rejection::Isolated,
                }),
                None,
            ),
        };
        let epoch = core.epoch;
        drop(core);
        if let Some(event) = event {
            self.observer.state_changed(&event);
        }
        match result {
            Ok(probe) => Ok(Ticket { probe, epoch }),
            Err(rejected) => {
                self.observer.call_rejected(&rejected);
                Err(rejected)
            }
        }
    }

    /// Holds the breaker open until [`reset`](Self::reset).
    pub fn isolate(&self) {
        let mut core = self.lock();
        let event = self.transition(&mut core, Phase::Isolated, Cause::Isolated, None, None);
        drop(core);
        self.observer.state_changed(&event);
    }

    /// Closes the breaker, clears the window and the growth.
    pub fn reset(&self) {
        let mut core = self.lock();
        core.consecutive_opens = 0;
        self.window.reset();
        let event = self.transition(&mut core, Phase::Closed, Cause::Reset, None, None);
        drop(core);
        self.observer.state_changed(&event);
    }

    /// Records a call admitted with `ticket`.
    ///
    /// The fast path: a healthy call (neither a failure nor slow) on a closed breaker over a
    /// time-based window cannot open the breaker unless the totals changed in some other way
    /// since they were last looked at — a failed or slow call, a new bucket, a reset, each of
    /// which changes the window's version — or the last look found the window so close to
    /// its thresholds that one more call could tip it (which ignores the minimum throughput,
    /// so it errs towards looking). Healthy calls only lower both ratios, so when neither
    /// holds the totals are not read at all. A count-based window returns its totals with
    /// every record (it computes them under its lock anyway), and the breaker's lock is taken
    /// only when they open it.
    #[inline]
    pub(super) fn record(&self, ticket: Ticket, outcome: Outcome, elapsed: Duration) {
        let recorded = self.window.record_call(outcome, elapsed);
        if !ticket.probe {
            if self.state.load(Ordering::Acquire) & PHASE_MASK != CLOSED {
                // A call admitted in an earlier state: it is in the window, but it does not
                // move the state machine.
                return;
            }
            match recorded {
                Recorded::Version { version, bad } => {
                    if !bad && self.eval_token.load(Ordering::Acquire) == version {
                        return;
                    }
                }
                // A count-based window hands back its totals: decide without the lock
                // unless they open the breaker.
                Recorded::Totals(counts) => {
                    if !self.config.should_open(&counts) {
                        return;
                    }
                }
            }
        }
        self.record_slow(ticket, outcome, elapsed, recorded);
    }

    #[cold]
    fn record_slow(&self, ticket: Ticket, outcome: Outcome, elapsed: Duration, rec: Recorded) {
        let bad = self.config.window.is_failure(outcome) || self.config.window.is_slow(elapsed);
        let mut core = self.lock();
        let event = match core.phase {
            Phase::Closed if !ticket.probe => {
                let (counts, version) = match rec {
                    Recorded::Totals(counts) => (counts, None),
                    Recorded::Version { .. } => {
                        // Read the version before the totals: a change after this read makes
                        // the token stale.
                        let version = self.window.version();
                        (self.window.snapshot(), Some(version))
                    }
                };
                if self.config.should_open(&counts) {
                    let cause = if self
                        .config
                        .comparison
                        .crosses(counts.failure_ratio(), self.config.failure_ratio)
                    {
                        Cause::FailureRatio
                    } else {
                        Cause::SlowCallRatio
                    };
                    Some(self.open(&mut core, cause, Some(counts)))
                } else {
                    let token = match version {
                        Some(v) if !self.one_more_call_could_open(&counts) => v,
                        _ => NO_TOKEN,
                    };
                    self.eval_token.store(token, Ordering::Release);
                    None
                }
            }
            Phase::HalfOpen {
                admitted,
                succeeded,
            } if ticket.probe && ticket.epoch == core.epoch => {
                if bad {
                    Some(self.open(&mut core, Cause::ProbeFailed, None))
                } else if succeeded + 1 >= self.config.permitted_probes {
                    core.consecutive_opens = 0;
                    self.window.reset();
                    Some(self.transition(
                        &mut core,
                        Phase::Closed,
                        Cause::ProbesSucceeded,
                        None,
                        None,
                    ))
                } else {
                    core.phase = Phase::HalfOpen {
                        admitted,
                        succeeded: succeeded + 1,
                    };
                    None
                }
            }
            // A call admitted in an earlier state: it is in the window, but it does not move
            // the state machine.
            _ => None,
        };
        drop(core);
        if let Some(event) = event {
            self.observer.state_changed(&event);
        }
    }

    /// Whether the ratios with one more call added (a healthy one: the best case for the
    /// breaker) still cross a threshold. Healthy calls only lower the ratios, so when this is
    /// false no run of healthy calls can open the breaker.
    fn one_more_call_could_open(&self, counts: &HealthCounts) -> bool {
        let calls = counts.calls as f64 + 1.0;
        let c = &self.config;
        c.comparison
            .crosses(counts.failures as f64 / calls, c.failure_ratio)
            || c.comparison
                .crosses(counts.slow as f64 / calls, c.slow_call_ratio)
    }

    pub(super) fn abandon(&self, ticket: Ticket) {
        if !ticket.probe {
            return;
        }
        let mut core = self.lock();
        if let Phase::HalfOpen {
            admitted,
            succeeded,
        } = core.phase
        {
            if core.epoch == ticket.epoch {
                core.phase = Phase::HalfOpen {
                    admitted: admitted.saturating_sub(1),
                    succeeded,
                };
            }
        }
    }

    fn open(&self, core: &mut Core, cause: Cause, counts: Option<HealthCounts>) -> StateChange {
        core.consecutive_opens = core.consecutive_opens.saturating_add(1);
        let open_for = self.open_duration(core);
        let now = self.window.now_millis();
        let until_ms = now.saturating_add(u64::try_from(open_for.as_millis()).unwrap_or(u64::MAX));
        self.transition(
            core,
            Phase::Open { until_ms },
            cause,
            Some(open_for),
            counts,
        )
    }

    /// `open_duration · growth^(n−1)`, capped, jittered, capped again; whole milliseconds,
    /// at least 1 ms.
    fn open_duration(&self, core: &mut Core) -> Duration {
        let c = &self.config;
        let cap = c.max_open_duration.as_secs_f64() * 1000.0;
        let exponent = i32::try_from(core.consecutive_opens.saturating_sub(1)).unwrap_or(i32::MAX);
        let base = (c.open_duration.as_secs_f64() * 1000.0 * c.growth.powi(exponent)).min(cap);
        let jittered = if c.jitter > 0.0 {
            let u = (core.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            base * (1.0 - c.jitter + 2.0 * c.jitter * u)
        } else {
            base
        };
        Duration::from_millis(jittered.min(cap).max(1.0) as u64)
    }

    fn transition(
        &self,
        core: &mut Core,
        to: Phase,
        cause: Cause,
        open_for: Option<Duration>,
        counts: Option<HealthCounts>,
    ) -> StateChange {
        let from = core.phase.state();
        core.phase = to;
        core.epoch = core.epoch.wrapping_add(1) & (u64::MAX >> PHASE_BITS);
        self.eval_token.store(NO_TOKEN, Ordering::Release);
        self.state
            .store(to.code() | (core.epoch << PHASE_BITS), Ordering::Release);
        StateChange {
            from,
            to: to.state(),
            cause,
            open_for,
            counts,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        // No code panics while holding the lock, so a poisoned lock still holds a valid state.
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
