//! An endpoint policy made runnable: its budget, breaker, throttle and health window built,
//! and kept across a policy swap when their own configuration did not change.
//!
//! # What survives a swap
//!
//! A policy change must not reset what the stack has learned about a downstream: a breaker
//! that is open because the downstream is failing must stay open when someone raises a
//! timeout, and a token bucket drained by an outage must not refill because a backoff changed
//! (Resilience4j's `replace()` loses breaker state; this does not). So when an endpoint of the
//! same name is rebuilt, each state object is carried over when its own configuration is
//! unchanged, and rebuilt (fresh) when it changed:
//!
//! | state | carried over when unchanged |
//! | --- | --- |
//! | retry budget (tokens, ratio window, active retries) | `budget` |
//! | circuit breaker (state and window) | `breaker` |
//! | adaptive throttle (its request and accept counts) | `throttle` |
//! | latency window of a percentile hedge | `hedge` percentile, when there is no breaker |
//!
//! A breaker is held open while the policy in force says `breaker.isolated` (an operator or
//! a rule of the policy center knows the downstream is down), and closed again, with an empty
//! window, by the first policy in force that no longer does: [`Endpoint::hold_breaker`], once
//! the new policies are in use (never while they are only being checked).
//!
//! A changed retry policy, timeouts, hedging or propagation takes effect for the next call;
//! a call in flight finishes on the policy it started with.
//!
//! A time window's edge is a swap like any other: the endpoint is rebuilt from the policy in
//! force after the edge, and each state object is carried over by the same rule (a window that
//! changes only timeouts keeps the breaker, budget and window; one that changes the budget
//! starts a fresh one at its start, and another at its end).

use std::sync::Arc;

use stormguard::breaker::{BreakerState, CircuitBreaker};
use stormguard::budget::{RetryBudget, Unlimited};
use stormguard::clock::Clock;
use stormguard::deadline::WallClock;
use stormguard::health::{HealthConfig, HealthWindow};
use stormguard::hedge::{HedgeDelay, HedgePolicy, Hedger};
use stormguard::policy::{EndpointPolicy, HedgeDelaySpec, PolicyError};
use stormguard::retry::{Retrier, SeededRandom};
use stormguard::throttle::AdaptiveThrottle;

use crate::observe::{BreakerEvents, EndpointKeys, Observer};

/// The window a percentile hedge reads when the endpoint has no breaker of its own.
const HEDGE_WINDOW: HealthConfig = HealthConfig::count(1000);

/// The breaker type of an endpoint: its state changes go to the stack's observer.
pub(crate) type Breaker<O> = CircuitBreaker<BreakerEvents<O>>;

/// The retrier of an endpoint: its budget, and its breaker as the gate of every attempt.
pub(crate) type EndpointRetrier<O> =
    Retrier<Arc<dyn RetryBudget>, (), SeededRandom, Option<Arc<Breaker<O>>>>;

/// One endpoint, ready to serve calls.
pub(crate) struct Endpoint<O> {
    pub(crate) name: Arc<str>,
    pub(crate) policy: EndpointPolicy,
    pub(crate) budget: Arc<dyn RetryBudget>,
    pub(crate) breaker: Option<Arc<Breaker<O>>>,
    pub(crate) throttle: Option<Arc<AdaptiveThrottle>>,
    pub(crate) window: Option<Arc<HealthWindow>>,
    pub(crate) retrier: EndpointRetrier<O>,
    pub(crate) hedger: Option<Hedger<Arc<dyn RetryBudget>>>,
    /// The keys of the metrics every call to this endpoint records.
    pub(crate) metric_keys: EndpointKeys,
}

impl<O: Observer> Endpoint<O> {
    /// Holds the breaker open while the policy says `breaker.isolated`, and closes it when
    /// it is held open and the policy no longer says so. Called once the table holding this
    /// endpoint is in use.
    pub(crate) fn hold_breaker(&self) {
        let Some(breaker) = &self.breaker else {
            return;
        };
        let held = breaker.state() == BreakerState::Isolated;
        if self.policy.breaker_isolated() && !held {
            breaker.isolate();
        } else if !self.policy.breaker_isolated() && held {
            breaker.reset();
        }
    }
}

/// What every endpoint of one stack is built with.
pub(crate) struct Builder<O> {
    pub(crate) clock: Clock,
    /// The wall clock that time windows are read on.
    pub(crate) wall: WallClock,
    pub(crate) observer: Arc<O>,
    pub(crate) seed: Option<u64>,
    /// The budget of endpoints whose policy names none (a layer's shared budget).
    pub(crate) fallback_budget: Option<Arc<dyn RetryBudget>>,
}

impl<O: Observer> Builder<O> {
    /// Builds `policy` (validated again: nothing unchecked reaches a running stack) as the
    /// endpoint `name`, reusing the state of `previous` where its configuration is unchanged.
    pub(crate) fn build(
        &self,
        name: &str,
        policy: EndpointPolicy,
        previous: Option<&Endpoint<O>>,
        index: u64,
    ) -> Result<Endpoint<O>, PolicyError> {
        policy.validate()?;
        let budget = match (previous, policy.budget()) {
            (Some(old), spec) if old.policy.budget() == spec => Arc::clone(&old.budget),
            (_, Some(spec)) => spec.build(self.clock.clone())?,
            (_, None) => match &self.fallback_budget {
                Some(shared) => Arc::clone(shared),
                None => Arc::new(Unlimited),
            },
        };
        let name: Arc<str> = Arc::from(name);
        let breaker = match (previous, policy.breaker()) {
            (_, None) => None,
            (Some(old), Some(config)) if old.policy.breaker() == Some(config) => {
                old.breaker.clone()
            }
            (_, Some(config)) => {
                let breaker = CircuitBreaker::new(*config, self.clock.clone())
                    .map_err(|e| invalid("breaker", e))?
                    .with_observer(BreakerEvents::shared(
                        Arc::clone(&name),
                        Arc::clone(&self.observer),
                    ));
                let breaker = match self.seed {
                    Some(seed) => breaker.with_seed(seed.wrapping_add(index)),
                    None => breaker,
                };
                Some(Arc::new(breaker))
            }
        };
        let throttle = match (previous, policy.throttle()) {
            (_, None) => None,
            (Some(old), Some(config)) if old.policy.throttle() == Some(config) => {
                old.throttle.clone()
            }
            (_, Some(config)) => {
                let throttle = AdaptiveThrottle::new(*config, self.clock.clone())
                    .map_err(|e| invalid("throttle", e))?;
                let throttle = match self.seed {
                    Some(seed) => throttle.with_seed(seed.wrapping_add(index)),
                    None => throttle,
                };
                Some(Arc::new(throttle))
            }
        };
        let window = match (&breaker, policy.hedge().map(|h| h.delay)) {
            (Some(breaker), _) => Some(Arc::clone(breaker.window())),
            (None, Some(HedgeDelaySpec::Percentile { .. })) => match previous
                .filter(|old| old.breaker.is_none())
                .and_then(|old| old.window.clone())
            {
                Some(window) => Some(window),
                None => Some(Arc::new(
                    HealthWindow::new(HEDGE_WINDOW, self.clock.clone())
                        .map_err(|e| invalid("hedge", e))?,
                )),
            },
            (None, _) => None,
        };
        let random = match self.seed {
            Some(seed) => SeededRandom::new(seed.wrapping_add(index)),
            None => SeededRandom::from_entropy(),
        };
        let retrier = Retrier::new(*policy.retry())
            .map_err(|e| invalid("retry", e))?
            .with_budget(Arc::clone(&budget))
            .with_random(random)
            .with_gate(breaker.clone());
        let hedger = match policy.hedge() {
            None => None,
            Some(spec) => {
                let delay = match (spec.delay, &window) {
                    (HedgeDelaySpec::Fixed(delay), _) => HedgeDelay::Fixed(delay),
                    (
                        HedgeDelaySpec::Percentile {
                            percentile,
                            fallback,
                        },
                        Some(window),
                    ) => HedgeDelay::percentile(Arc::clone(window), percentile, fallback),
                    (HedgeDelaySpec::Percentile { fallback, .. }, None) => {
                        HedgeDelay::Fixed(fallback)
                    }
                };
                let hedge = HedgePolicy::new(spec.max_attempts, delay)
                    .with_min_call(policy.retry().min_call())
                    .with_idempotent(policy.retry().idempotent());
                let hedger = Hedger::new(hedge).map_err(|e| invalid("hedge", e))?;
                Some(hedger.with_budget(Arc::clone(&budget)))
            }
        };
        Ok(Endpoint {
            metric_keys: EndpointKeys::new(&name),
            name,
            policy,
            budget,
            breaker,
            throttle,
            window,
            retrier,
            hedger,
        })
    }
}

fn invalid(field: &str, error: impl std::fmt::Display) -> PolicyError {
    PolicyError::Invalid {
        field: field.to_owned(),
        rule: error.to_string(),
        at: None,
    }
}
