//! The largest value each number of a policy may take, and why.
//!
//! A policy file is typed by people and pushed to every instance of a service, so a value no
//! one would choose on purpose is far more often a slip (a unit, a percent for a fraction, a
//! digit too many) than a wish. Each bound below is generous for real use and refuses the
//! slips that turn into outages: a four-billion-attempt retry loop, a budget whose reserve
//! never runs out, a breaker that stays open for a day.
//!
//! Bounds held by the core types themselves are not repeated here: a budget's numbers
//! ([`InvalidBudget`](crate::budget::InvalidBudget): `max_tokens` 1..=1000, ratios,
//! `ttl` 1..=60 s, reserves up to 1000), hedging's 2..=5 attempts (gRPC A6), a health
//! window's calls and buckets ([`HealthConfig`](crate::health::HealthConfig)), a throttle's
//! buckets.

use std::time::Duration;

use super::{EndpointPolicy, FieldPath, HedgeDelaySpec, PolicyError};
use crate::backoff::Growth;
use crate::health::WindowKind;

/// The most attempts (the first one included) a retrying endpoint may make.
///
/// gRPC A6 caps `maxAttempts` at 5 and the AWS SDKs default to 3. In an outage every attempt
/// multiplies the load on the failing downstream; past ten, retrying is a loop, not a policy.
pub const MAX_ATTEMPTS: u32 = 10;

/// The longest duration a policy holds: timeouts, the minimum call time, backoff base and
/// cap, hedge delays, a breaker's open time and windows, a throttle's window, the fixed hop
/// reserve.
///
/// A remote call, a wait between attempts or a breaker left open for more than an hour is a
/// unit slip (`"3600m"` for `"3600s"`) or a job that belongs in a queue, not in a request.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// The largest backoff multiplier and breaker open-time growth factor.
///
/// Both compound per attempt or per opening: at 10 the second wait is already ten times the
/// first and the cap is reached at once, so a larger factor is a cap written in the wrong
/// field.
pub const MAX_FACTOR: f64 = 10.0;

/// The most half-open probes a breaker lets through at once.
///
/// Probes test a downstream that just failed; a hundred concurrent probes is no longer a test.
pub const MAX_PROBES: u32 = 100;

/// The largest minimum throughput of a breaker over a time window (a count window bounds it
/// by its own size).
///
/// A threshold no downstream reaches within the window means the breaker never opens.
pub const MAX_MINIMUM_THROUGHPUT: u32 = 1_000_000;

/// The largest throttle `k` (the Google SRE book uses 2).
///
/// The throttle refuses locally once requests exceed `k` times the accepted ones; at 10 it
/// acts only when more than nine in ten requests fail, and beyond that it never acts.
pub const MAX_THROTTLE_K: f64 = 10.0;

/// The most time windows one endpoint may have.
///
/// Windows may not overlap, so a day holds only so many; one per hour of the day is already
/// a schedule that belongs in a policy center's rules, not in one endpoint's file.
pub const MAX_WINDOWS: usize = 24;

/// The longest endpoint name, in bytes: a route pattern such as `"POST /v1/payments/*"`.
pub const MAX_NAME_BYTES: usize = 1024;

/// The largest policy file [`PolicyFile::load`](super::PolicyFile::load) reads, in bytes.
///
/// A 10 MB file holds about a hundred thousand endpoints; a larger file is not a policy.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Checks every number of `policy` against the bounds above.
pub(super) fn check(policy: &EndpointPolicy, at: &FieldPath) -> Result<(), PolicyError> {
    let retry = policy.retry();
    if retry.max_attempts() > MAX_ATTEMPTS {
        return Err(at.field("retry").field("max_attempts").invalid(format!(
            "must be at most {MAX_ATTEMPTS}, got {}",
            retry.max_attempts()
        )));
    }
    let backoff = retry.backoff();
    if let Growth::Exponential { multiplier } = backoff.growth() {
        factor(&at.field("backoff").field("multiplier"), multiplier)?;
    }
    let timeouts = at.field("timeouts");
    let backoff_at = at.field("backoff");
    let hedge_at = at.field("hedge");
    let breaker_at = at.field("breaker");
    let mut durations = vec![
        (timeouts.field("connect"), policy.connect_timeout()),
        (timeouts.field("per_try"), retry.per_try_timeout()),
        (timeouts.field("overall"), policy.overall_timeout()),
        (at.field("retry").field("min_call"), Some(retry.min_call())),
        (backoff_at.field("base"), Some(backoff.base())),
        (backoff_at.field("cap"), Some(backoff.cap())),
        (
            at.field("deadline").field("reserve_fixed"),
            Some(policy.propagation().reserve.fixed_kept()),
        ),
    ];
    if let Some(hedge) = policy.hedge() {
        match hedge.delay {
            HedgeDelaySpec::Fixed(delay) => durations.push((hedge_at.field("delay"), Some(delay))),
            HedgeDelaySpec::Percentile { fallback, .. } => {
                durations.push((hedge_at.field("fallback"), Some(fallback)));
            }
        }
    }
    if let Some(breaker) = policy.breaker() {
        let window = breaker.window();
        if let WindowKind::Time { length, .. } = window.kind() {
            durations.push((breaker_at.field("time"), Some(length)));
            if breaker.minimum_throughput() > MAX_MINIMUM_THROUGHPUT {
                return Err(breaker_at.field("minimum_throughput").invalid(format!(
                    "must be at most {MAX_MINIMUM_THROUGHPUT}, got {}",
                    breaker.minimum_throughput()
                )));
            }
        }
        durations.push((breaker_at.field("slow_call"), window.slow_call_threshold()));
        durations.push((breaker_at.field("open"), Some(breaker.open_duration())));
        durations.push((
            breaker_at.field("max_open"),
            Some(breaker.max_open_duration()),
        ));
        factor(&breaker_at.field("growth"), breaker.growth())?;
        if breaker.permitted_probes() > MAX_PROBES {
            return Err(breaker_at.field("probes").invalid(format!(
                "must be at most {MAX_PROBES}, got {}",
                breaker.permitted_probes()
            )));
        }
    }
    if let Some(throttle) = policy.throttle() {
        durations.push((
            at.field("throttle").field("window"),
            Some(throttle.window()),
        ));
        if throttle.k() > MAX_THROTTLE_K {
            return Err(at.field("throttle").field("k").invalid(format!(
                "must be at most {MAX_THROTTLE_K}, got {}",
                throttle.k()
            )));
        }
    }
    for (field, value) in durations {
        if let Some(value) = value.filter(|v| *v > MAX_DURATION) {
            return Err(field.invalid(format!("{value:?} is longer than the 1 h maximum")));
        }
    }
    Ok(())
}

fn factor(at: &FieldPath, value: f64) -> Result<(), PolicyError> {
    if value > MAX_FACTOR {
        return Err(at.invalid(format!("must be at most {MAX_FACTOR}, got {value}")));
    }
    Ok(())
}
