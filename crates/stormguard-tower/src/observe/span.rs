//! A span per attempt (feature `tracing`), opened by the client stack around each attempt.

use std::time::Duration;

use tracing::Span;
use tracing::field::Empty;

use super::{AttemptEnd, AttemptStart, CallInfo, TARGET};

/// Opens the span of an attempt.
pub(crate) fn attempt_span(call: &CallInfo<'_>, attempt: &AttemptStart) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "stormguard.attempt",
        retry.attempt = attempt.number,
        http.request.resend_count = Empty,
        retry.reason = Empty,
        retry.delay_ms = Empty,
        endpoint = call.endpoint,
        http.request.method = %call.method,
        request_id = call.request_id,
        http.response.status_code = Empty,
        rpc.grpc.status_code = Empty,
        "error.type" = Empty,
        retry.outcome = Empty,
        elapsed_ms = Empty,
    );
    if let Some((reason, delay)) = attempt.retry {
        span.record(
            "http.request.resend_count",
            attempt.number.saturating_sub(1),
        );
        span.record("retry.reason", reason.label());
        span.record("retry.delay_ms", millis(delay));
    }
    span
}

/// Records how the attempt ended on its span.
pub(crate) fn attempt_ended(span: &Span, end: &AttemptEnd) {
    if let Some(status) = end.status {
        span.record("http.response.status_code", status.as_u16());
    }
    if let Some(code) = end.grpc_status {
        span.record("rpc.grpc.status_code", code as u8);
    }
    if let Some(kind) = end.error_type {
        span.record("error.type", kind);
    }
    span.record("retry.outcome", end.outcome.label());
    span.record("elapsed_ms", millis(end.elapsed));
}

/// Whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
