//! Counters, gauges and histograms through the `metrics` facade (feature `metrics`).
//!
//! The metrics of every call (attempts, responses, requests, retries and their delays) are
//! recorded with the endpoint's keys built once ([`metric_keys`](super::metric_keys) says
//! why); the rare ones (refusals, breaker changes, hedges, fallbacks) build their key when
//! they happen, with the `metrics` macros.

use std::borrow::Cow;

use metrics::{
    Key, Label, Level, Metadata, SharedString, Unit, counter, describe_counter, describe_gauge,
    describe_histogram, gauge,
};
use stormguard::breaker::{BreakerState, StateChange};

use super::metric_keys::{EndpointKeys, LabelledKeys};
use super::{AttemptEnd, AttemptStart, CallEnd, CallInfo, FallbackReason, HedgeEvent};
use crate::metric_names::{
    ATTEMPT_DURATION, ATTEMPTS, BREAKER_STATE, BREAKER_TRANSITIONS, BUDGET_REFUSALS, CPU_ALLOWANCE,
    DEADLINE_DROPS, DEADLINE_HEADER_ERRORS, FALLBACKS, HEDGES, REFUSALS, REQUESTS, RESPONSES,
    RETRIES, RETRY_DELAY,
};

/// Registers units and help texts for this crate's metrics with the installed recorder, and
/// sets [`CPU_ALLOWANCE`] to the cores this process may use. Call it once after installing
/// the recorder (an exporter then prints `# HELP` lines); the other metrics are recorded
/// whether or not it is called, but without the allowance the policy center cannot tell
/// what fraction of its CPU an instance uses.
pub fn describe_metrics() {
    describe_gauge!(
        CPU_ALLOWANCE,
        Unit::Count,
        "CPU cores this process may use (available parallelism, cgroup quota included)."
    );
    #[allow(clippy::cast_precision_loss)]
    gauge!(CPU_ALLOWANCE).set(cpu_allowance() as f64);
    describe_counter!(
        REQUESTS,
        Unit::Count,
        "Logical requests through the client stack, by endpoint and how they ended (outcome)."
    );
    describe_counter!(ATTEMPTS, Unit::Count, "Attempts sent, the first included.");
    describe_counter!(
        RESPONSES,
        Unit::Count,
        "Attempts that ended, by the HTTP status answered (code), or none when no response came."
    );
    describe_counter!(RETRIES, Unit::Count, "Retries sent, by reason.");
    describe_counter!(
        REFUSALS,
        Unit::Count,
        "Calls or retries not sent, by who refused (budget, circuit_open, throttled, deadline_too_close)."
    );
    describe_counter!(
        BUDGET_REFUSALS,
        Unit::Count,
        "Retries and hedges the retry budget refused."
    );
    describe_gauge!(
        BREAKER_STATE,
        Unit::Count,
        "Circuit breaker state: 0 closed, 1 open, 2 half-open, 3 isolated."
    );
    describe_counter!(
        BREAKER_TRANSITIONS,
        Unit::Count,
        "Circuit breaker state changes, by the state entered."
    );
    describe_counter!(
        HEDGES,
        Unit::Count,
        "Hedged attempts sent, won and cancelled."
    );
    describe_counter!(
        FALLBACKS,
        Unit::Count,
        "Calls answered from the fallback, by reason."
    );
    describe_counter!(
        DEADLINE_DROPS,
        Unit::Count,
        "Requests not run (server) or not sent (client) because their deadline could not be met."
    );
    describe_counter!(
        DEADLINE_HEADER_ERRORS,
        Unit::Count,
        "Malformed incoming deadline headers, by header."
    );
    describe_histogram!(ATTEMPT_DURATION, Unit::Seconds, "Duration of each attempt.");
    describe_histogram!(RETRY_DELAY, Unit::Seconds, "Wait before each retry.");
}

/// The cores this process may use: `available_parallelism`, which reads the cgroup quota
/// (one when it cannot be read).
fn cpu_allowance() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

fn endpoint(call: &CallInfo<'_>) -> String {
    call.endpoint.to_owned()
}

/// The metadata of this module's records, the same as its `metrics` macros give.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The call's endpoint keys, when the client stack made its context for that endpoint.
fn kept<'a>(call: &CallInfo<'a>) -> Option<&'a EndpointKeys> {
    call.metric_keys.filter(|keys| keys.serve(call.endpoint))
}

/// The key of the metric `name` labelled with the call's endpoint: the kept one, else built
/// for this record (as the macros do).
fn plain<'a>(call: &CallInfo<'_>, kept: Option<&'a Key>, name: &'static str) -> Cow<'a, Key> {
    kept.map_or_else(
        || {
            Cow::Owned(Key::from_parts(
                name,
                vec![Label::new("endpoint", endpoint(call))],
            ))
        },
        Cow::Borrowed,
    )
}

/// The key of the metric `name` labelled with the call's endpoint and `label` = `value()`
/// (told apart from the metric's other values by `id`): kept, else built for this record.
fn labelled<'a, T: Copy + PartialEq, V: Into<SharedString>>(
    call: &CallInfo<'_>,
    kept: Option<&'a LabelledKeys<T>>,
    (name, label): (&'static str, &'static str),
    id: T,
    value: impl Fn() -> V,
) -> Cow<'a, Key> {
    let build = || {
        Key::from_parts(
            name,
            vec![
                Label::new("endpoint", endpoint(call)),
                Label::new(label, value()),
            ],
        )
    };
    match kept {
        Some(keys) => keys.get(id, build),
        None => Cow::Owned(build()),
    }
}

fn increment(key: &Key) {
    metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA).increment(1));
}

fn record(key: &Key, value: f64) {
    metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA).record(value));
}

pub(super) fn attempt_started(call: &CallInfo<'_>, attempt: &AttemptStart) {
    let keys = kept(call);
    increment(&plain(call, keys.map(|k| &k.attempts), ATTEMPTS));
    if let Some((reason, delay)) = attempt.retry {
        let label = reason.label();
        let by_reason = keys.map(|k| &k.retries);
        increment(&labelled(
            call,
            by_reason,
            (RETRIES, "reason"),
            label,
            || label,
        ));
        let delay_key = plain(call, keys.map(|k| &k.retry_delay), RETRY_DELAY);
        record(&delay_key, delay.as_secs_f64());
    }
}

pub(super) fn attempt_ended(call: &CallInfo<'_>, attempt: &AttemptEnd) {
    let keys = kept(call);
    let duration = plain(call, keys.map(|k| &k.attempt_duration), ATTEMPT_DURATION);
    record(&duration, attempt.elapsed.as_secs_f64());
    let code = attempt.status.map_or(0, |status| status.as_u16());
    let by_code = keys.map(|k| &k.responses);
    increment(&labelled(
        call,
        by_code,
        (RESPONSES, "code"),
        code,
        || match attempt.status {
            Some(status) => SharedString::from(status.as_str().to_owned()),
            None => SharedString::const_str("none"),
        },
    ));
}

pub(super) fn call_finished(call: &CallInfo<'_>, end: &CallEnd) {
    let outcome = end.stop.label();
    let by_outcome = kept(call).map(|k| &k.requests);
    increment(&labelled(
        call,
        by_outcome,
        (REQUESTS, "outcome"),
        outcome,
        || outcome,
    ));
}

pub(super) fn refused(call: &CallInfo<'_>, by: &'static str) {
    counter!(REFUSALS, "endpoint" => endpoint(call), "by" => by).increment(1);
    if by == "budget" {
        counter!(BUDGET_REFUSALS, "endpoint" => endpoint(call)).increment(1);
    }
}

pub(super) fn breaker_changed(endpoint: &str, change: &StateChange) {
    let value = match change.to {
        BreakerState::Closed => 0.0,
        BreakerState::Open => 1.0,
        BreakerState::HalfOpen => 2.0,
        BreakerState::Isolated => 3.0,
    };
    gauge!(BREAKER_STATE, "endpoint" => endpoint.to_owned()).set(value);
    counter!(BREAKER_TRANSITIONS, "endpoint" => endpoint.to_owned(), "to" => change.to.label())
        .increment(1);
}

pub(super) fn hedge(call: &CallInfo<'_>, event: HedgeEvent) {
    let label = match event {
        HedgeEvent::Sent { .. } => "sent",
        HedgeEvent::Won { .. } => "won",
        HedgeEvent::Cancelled { .. } => "cancelled",
    };
    counter!(HEDGES, "endpoint" => endpoint(call), "event" => label).increment(1);
}

pub(super) fn fallback(call: &CallInfo<'_>, reason: FallbackReason) {
    counter!(FALLBACKS, "endpoint" => endpoint(call), "reason" => reason.label()).increment(1);
}

#[cfg(test)]
mod tests {
    #[test]
    fn describing_the_metrics_exposes_the_cpu_allowance() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, super::describe_metrics);
        let text = handle.render();
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        assert!(
            text.contains(&format!("process_cpu_allowance_cores {cores}\n")),
            "{text}"
        );
    }
}
