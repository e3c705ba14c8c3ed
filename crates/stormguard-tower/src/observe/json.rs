//! Structured log events (feature `json-log`).

use stormguard::admission::Refusal;
use stormguard::breaker::StateChange;

use super::{AttemptEnd, CallInfo, TARGET};

/// One event per attempt; `tracing_subscriber`'s JSON formatter prints it as one line.
pub(super) fn attempt_ended(call: &CallInfo<'_>, attempt: &AttemptEnd) {
    let elapsed_ms = u64::try_from(attempt.elapsed.as_millis()).unwrap_or(u64::MAX);
    tracing::info!(
        target: TARGET,
        request_id = call.request_id,
        endpoint = call.endpoint,
        http.request.method = %call.method,
        retry_count = attempt.number.saturating_sub(1),
        elapsed_ms,
        status_code = attempt.status.map(|s| s.as_u16()),
        grpc_status = attempt.grpc_status.map(|c| c as u8),
        error_type = attempt.error_type,
        outcome = attempt.outcome.label(),
        "attempt finished"
    );
}

/// One event per refusal.
pub(super) fn refused(call: &CallInfo<'_>, refusal: &Refusal) {
    tracing::warn!(
        target: TARGET,
        request_id = call.request_id,
        endpoint = call.endpoint,
        http.request.method = %call.method,
        refused_by = refusal.label(),
        reason = %refusal,
        "call refused"
    );
}

/// One event per breaker transition.
pub(super) fn breaker_changed(endpoint: &str, change: &StateChange) {
    tracing::warn!(
        target: TARGET,
        endpoint,
        from = change.from.label(),
        to = change.to.label(),
        cause = ?change.cause,
        "breaker state changed"
    );
}
