//! One structured log event per attempt (feature `json-log`).

use super::active::{AttemptEnd, CallInfo};

/// Emits the attempt's log event; `tracing_subscriber`'s JSON formatter prints it as one
/// line.
pub(super) fn attempt_ended(info: &CallInfo, attempt: u32, end: &AttemptEnd<'_>) {
    let elapsed_ms = u64::try_from(end.elapsed.as_millis()).unwrap_or(u64::MAX);
    tracing::info!(
        target: "stormguard::retry",
        request_id = info.request_id(),
        http.request.method = %info.method,
        retry_count = attempt.saturating_sub(1),
        elapsed_ms,
        status_code = end.details.status.map(|s| s.as_u16()),
        grpc_status = end.details.grpc.map(|c| c as u8),
        error_type = end.details.error_type,
        outcome = end.ended.outcome.label(),
        "attempt finished"
    );
}
