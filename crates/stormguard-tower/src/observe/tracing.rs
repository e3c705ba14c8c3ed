//! A span per attempt (feature `tracing`).

use std::time::Duration;

use stormguard::retry::RetryReason;
use tracing::Span;
use tracing::field::Empty;

use super::active::{AttemptEnd, CallInfo};

/// Opens the span of attempt `attempt`; `retry` is why and after how long it is sent.
pub(super) fn attempt_span(
    info: &CallInfo,
    attempt: u32,
    retry: Option<(RetryReason, Duration)>,
) -> Span {
    let span = tracing::info_span!(
        target: "stormguard::retry",
        "stormguard.attempt",
        retry.attempt = attempt,
        http.request.resend_count = Empty,
        retry.reason = Empty,
        retry.delay_ms = Empty,
        http.request.method = %info.method,
        request_id = info.request_id(),
        http.response.status_code = Empty,
        rpc.grpc.status_code = Empty,
        "error.type" = Empty,
        retry.outcome = Empty,
        elapsed_ms = Empty,
    );
    if let Some((reason, delay)) = retry {
        span.record("http.request.resend_count", attempt.saturating_sub(1));
        span.record("retry.reason", reason.label());
        span.record("retry.delay_ms", millis(delay));
    }
    span
}

/// Records how the attempt ended on its span.
pub(super) fn attempt_ended(span: &Span, end: &AttemptEnd<'_>) {
    if let Some(status) = end.details.status {
        span.record("http.response.status_code", status.as_u16());
    }
    if let Some(code) = end.details.grpc {
        span.record("rpc.grpc.status_code", code as u8);
    }
    if let Some(kind) = end.details.error_type {
        span.record("error.type", kind);
    }
    span.record("retry.outcome", end.ended.outcome.label());
    span.record("elapsed_ms", millis(end.elapsed));
}

/// Whole milliseconds, saturating.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
