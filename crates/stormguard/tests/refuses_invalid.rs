//! Every running type of the core is made only from a configuration that passes its
//! `validate`: each constructor refuses a bad one with the typed error that names it. The
//! retrier and the hedger used to run any policy they were given; they are the first two
//! cases.

use std::time::Duration;

use stormguard::backoff::{Backoff, InvalidBackoff};
use stormguard::breaker::{BreakerConfig, CircuitBreaker};
use stormguard::budget::{ConcurrencyBudget, InvalidBudget, RatioBudget, TokenBucket};
use stormguard::clock::Clock;
use stormguard::fault::{FaultConfig, FaultInjector, InvalidFault, Latency};
use stormguard::health::{HealthConfig, HealthWindow};
use stormguard::hedge::{HedgeDelay, HedgePolicy, Hedger, InvalidHedge};
use stormguard::limit::{Aimd, Limiter, LimiterConfig};
use stormguard::policy::EndpointPolicy;
use stormguard::retry::{InvalidPolicy, Retrier, RetryPolicy};
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};

const MS: Duration = Duration::from_millis(1);

#[test]
fn a_retrier_refuses_a_policy_that_breaks_a_rule() {
    assert_eq!(
        Retrier::new(RetryPolicy::new(0)).err(),
        Some(InvalidPolicy::MaxAttempts)
    );
    assert_eq!(
        Retrier::new(RetryPolicy::new(3).with_per_try_timeout(Duration::ZERO)).err(),
        Some(InvalidPolicy::ZeroPerTryTimeout)
    );
    assert!(matches!(
        Retrier::new(RetryPolicy::new(3).with_backoff(Backoff::fixed(10 * MS).with_cap(MS))).err(),
        Some(InvalidPolicy::Backoff(InvalidBackoff::CapBelowBase { .. }))
    ));
    assert!(Retrier::new(RetryPolicy::new(3)).is_ok());
}

#[test]
fn a_hedger_refuses_a_policy_that_breaks_a_rule() {
    assert_eq!(
        Hedger::new(HedgePolicy::new(1, HedgeDelay::Fixed(10 * MS))).err(),
        Some(InvalidHedge::MaxAttempts(1))
    );
    assert!(Hedger::new(HedgePolicy::new(2, HedgeDelay::Fixed(10 * MS))).is_ok());
}

#[test]
fn every_other_running_type_refuses_its_bad_configuration_by_field() {
    let breaker = CircuitBreaker::new(
        BreakerConfig::new(HealthConfig::count(10)).with_failure_ratio(1.5),
        Clock::system(),
    );
    assert_eq!(
        breaker.err().map(|e| e.field),
        Some("breaker.failure_ratio")
    );
    let window = HealthWindow::new(HealthConfig::count(0), Clock::system());
    assert!(window.err().is_some_and(|e| e.field.ends_with("calls")));
    let throttle = AdaptiveThrottle::new(ThrottleConfig::new(0.5), Clock::system());
    assert_eq!(throttle.err().map(|e| e.field), Some("throttle.k"));
    let limiter = Limiter::new(
        LimiterConfig::new(Aimd::new().with_limits(10, 5, 20)),
        &Clock::system(),
    );
    assert!(limiter.is_err());
    assert!(matches!(
        FaultInjector::new(FaultConfig::new(0).with_latency(
            1.0,
            Latency::Uniform {
                min: 20 * MS,
                max: 10 * MS
            }
        ))
        .err(),
        Some(InvalidFault::UniformRange { .. })
    ));
    assert_eq!(
        TokenBucket::grpc(0, 0.1).err(),
        Some(InvalidBudget::MaxTokens(0))
    );
    assert!(matches!(
        RatioBudget::new(2.0, Duration::from_secs(10), 0, Clock::system()).err(),
        Some(InvalidBudget::RetryRatio(_))
    ));
    assert!(matches!(
        ConcurrencyBudget::new(500.0, 3).err(),
        Some(InvalidBudget::BudgetPercent(_))
    ));
    // A whole endpoint's policy: checked in place, the field named.
    let policy = EndpointPolicy::new(RetryPolicy::new(0));
    let error = policy.validate().expect_err("zero attempts");
    assert!(error.to_string().contains("retry.max_attempts"), "{error}");
}
