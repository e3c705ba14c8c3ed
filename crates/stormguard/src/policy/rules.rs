//! The rules a policy must keep, beyond each field's own type: the documented bounds
//! (`limits`), each section's core validation named by the file's field names, and the
//! rules between fields (`min_call` below `overall`, …). Both ways into an
//! [`EndpointPolicy`] — a file and code — pass through [`check`].

use std::time::Duration;

use super::limits;
use super::{EndpointPolicy, FieldPath, HedgeDelaySpec, PolicyError};
use crate::health::InvalidConfig;

/// gRPC A6 caps hedged attempts (and retries) at 5.
const MAX_HEDGE_ATTEMPTS: u32 = 5;

/// Checks a policy's fields and the rules between them; `at` names the endpoint in errors.
pub(super) fn check(policy: &EndpointPolicy, at: &FieldPath) -> Result<(), PolicyError> {
    limits::check(policy, at)?;
    let timeouts = at.field("timeouts");
    let retry = &policy.retry;
    for (name, value) in [
        ("connect", policy.connect_timeout),
        ("per_try", retry.per_try_timeout()),
        ("overall", policy.overall_timeout),
    ] {
        if value == Some(Duration::ZERO) {
            return Err(timeouts.field(name).invalid("must be above zero"));
        }
    }
    if let (Some(per_try), Some(overall)) = (retry.per_try_timeout(), policy.overall_timeout) {
        if per_try > overall {
            return Err(timeouts.field("per_try").invalid(format!(
                "{per_try:?} is longer than the overall timeout {overall:?}"
            )));
        }
    }
    if let Some(overall) = policy.overall_timeout {
        let min_call = retry.min_call();
        if min_call > Duration::ZERO && min_call >= overall {
            return Err(at.field("retry").field("min_call").invalid(format!(
                "{min_call:?} is not below the overall timeout {overall:?}: no retry could ever start"
            )));
        }
    }
    if retry.max_attempts() == 0 {
        return Err(at
            .field("retry")
            .field("max_attempts")
            .invalid("must be at least 1 (it counts the first attempt)"));
    }
    retry
        .backoff()
        .validate()
        .map_err(|e| at.field("backoff").invalid(e))?;
    if let Some(hedge) = &policy.hedge {
        let hedge_at = at.field("hedge");
        if retry.max_attempts() > 1 {
            return Err(at.field("retry").field("max_attempts").invalid(
                "an endpoint either retries or hedges: with `hedge`, max_attempts must be 1",
            ));
        }
        if !(2..=MAX_HEDGE_ATTEMPTS).contains(&hedge.max_attempts) {
            return Err(hedge_at.field("max_attempts").invalid(format!(
                "must be in 2..={MAX_HEDGE_ATTEMPTS} (gRPC A6 caps hedging at 5), got {}",
                hedge.max_attempts
            )));
        }
        if let HedgeDelaySpec::Percentile { percentile, .. } = hedge.delay {
            if !(percentile.is_finite() && percentile > 0.0 && percentile < 1.0) {
                return Err(hedge_at.field("percentile").invalid(format!(
                    "must be a number strictly between 0 and 1, got {percentile}"
                )));
            }
        }
    }
    if let Some(budget) = &policy.budget {
        budget.validate(&at.field("budget"))?;
    }
    if let Some(breaker) = &policy.breaker {
        breaker
            .validate()
            .map_err(|e| config_error(&at.field("breaker"), e))?;
    } else if policy.breaker_isolated {
        return Err(at
            .field("breaker")
            .field("isolated")
            .invalid("there is no breaker to hold open: give the endpoint a `breaker`"));
    }
    if let Some(throttle) = &policy.throttle {
        throttle
            .validate()
            .map_err(|e| config_error(&at.field("throttle"), e))?;
    }
    if policy.propagation.reserve.keeps_everything() {
        return Err(at
            .field("deadline")
            .field("reserve")
            .invalid("keeps all the remaining time: no call would ever be sent"));
    }
    super::window::check(policy, at)
}

/// A core configuration error, named by the policy file's field names.
fn config_error(section: &FieldPath, error: InvalidConfig) -> PolicyError {
    let name = error.field.rsplit('.').next().unwrap_or(error.field);
    let file_name = match name {
        "open_duration" => "open",
        "max_open_duration" => "max_open",
        "permitted_probes" => "probes",
        "calls" => "count",
        "length" => "time",
        other => other,
    };
    section.field(file_name).invalid(error.problem)
}
