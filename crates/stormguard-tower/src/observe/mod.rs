//! Per-attempt traces, metrics and log lines for the [`RetryLayer`](crate::retry::RetryLayer).
//!
//! A retry that nobody can see is how a retry storm goes unnoticed until the downstream
//! falls over: the caller's latency looks fine, the error rate looks fine, and the
//! downstream's load has tripled. So every attempt is visible, through three independent
//! features that cost nothing when off (the layer's observer is then an empty type and
//! none of this module is compiled in):
//!
//! | feature | what | through |
//! | --- | --- | --- |
//! | `tracing` | a span per attempt | [`tracing`](https://docs.rs/tracing) |
//! | `metrics` | counters and histograms ([`metric_names`](crate::metric_names)) | the [`metrics`](https://docs.rs/metrics) facade |
//! | `json-log` | one structured event per attempt | `tracing` events, printed as JSON lines by `tracing_subscriber::fmt().json()` |
//!
//! # Spans (`tracing`)
//!
//! Each attempt runs inside an INFO span named [`SPAN_NAME`] (target [`TARGET`]); the inner
//! service's own spans and events nest under it. Fields (OpenTelemetry names where one
//! exists):
//!
//! | field | value |
//! | --- | --- |
//! | `retry.attempt` | attempt number, 1 for the first |
//! | `http.request.resend_count` | on retries only: attempts sent before this one (OpenTelemetry) |
//! | `retry.reason` | on retries only: why ([`RetryReason::label`](stormguard::retry::RetryReason::label): `failed`, `overloaded`, `in_doubt`, `timed_out`) |
//! | `retry.delay_ms` | on retries only: the wait before this attempt |
//! | `http.request.method` | the request method |
//! | `request_id` | the request's `x-request-id`, when it has one |
//! | `http.response.status_code` | the response status, when a response came |
//! | `rpc.grpc.status_code` | the gRPC status, for gRPC responses |
//! | `error.type` | for transport failures and timeouts: `timeout`, `connection_refused`, `connection_reset`, `incomplete_message`, … |
//! | `retry.outcome` | the classification ([`Outcome::label`](stormguard::classify::Outcome::label)) |
//! | `elapsed_ms` | the attempt's duration |
//!
//! # Metrics (`metrics`)
//!
//! The names in [`metric_names`](crate::metric_names): requests by `outcome` (the stop
//! reason), attempts, retries by `reason`, budget refusals, and the attempt-duration and
//! retry-delay histograms (seconds). Call `describe_metrics()` (in this module) once to give
//! them units and help texts. `examples/prometheus.rs` serves them in the Prometheus text format.
//!
//! # Log lines (`json-log`)
//!
//! One INFO event per attempt, target [`TARGET`], message `"attempt finished"`, inside the
//! attempt's span when `tracing` is on, with the fields `request_id` (the request's
//! `x-request-id`), `http.request.method`, `retry_count` (retries before this attempt),
//! `elapsed_ms`, `status_code`, `grpc_status`, `error_type` (as `error.type` above) and
//! `outcome`. A field without a value (no response, no error) is left out rather than
//! written as null.
//!
//! *Why events and not a writer of our own:* the application already decides where logs
//! go, how they are filtered and sampled, and in which format; an event joins that
//! pipeline, carries the span context, and `tracing_subscriber::fmt().json()
//! .flatten_event(true)` prints exactly one JSON object per attempt:
//!
//! ```text
//! {"timestamp":"…","level":"INFO","message":"attempt finished","request_id":"req-7","http.request.method":"GET","retry_count":1,"elapsed_ms":10,"status_code":503,"outcome":"retryable","target":"stormguard::retry","span":{…},"spans":[…]}
//! ```
//!
//! # How the layer's shared observer knows the request
//!
//! The core's retrier has one observer per route, shared by every request. The layer runs
//! each request inside a tokio task-local that holds that request's context (request id,
//! method, the attempt's span and start time), and the observer writes to it: no allocation
//! per request beyond the span itself.

/// The name of the span each attempt runs in (feature `tracing`).
pub const SPAN_NAME: &str = "stormguard.attempt";

/// The target of the attempt spans and log events.
pub const TARGET: &str = "stormguard::retry";

#[cfg(any(feature = "tracing", feature = "metrics", feature = "json-log"))]
mod active;
#[cfg(feature = "json-log")]
mod json;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "tracing")]
mod tracing;

#[cfg(feature = "metrics")]
pub use self::metrics::describe_metrics;
#[cfg(any(feature = "tracing", feature = "metrics", feature = "json-log"))]
pub(crate) use active::{
    CallInfo, Observe, finished, in_call, instrument, record_error, record_response,
};

#[cfg(not(any(feature = "tracing", feature = "metrics", feature = "json-log")))]
pub(crate) use inactive::{
    CallInfo, Observe, finished, in_call, instrument, record_error, record_response,
};

/// With every observability feature off: empty types and functions that compile away.
#[cfg(not(any(feature = "tracing", feature = "metrics", feature = "json-log")))]
mod inactive {
    use std::future::Future;

    use http::StatusCode;
    use http::request::Parts;
    use stormguard::classify::GrpcCode;
    use stormguard::retry::{RetryObserver, StopReason};

    /// The observer of the core's retrier: every hook is the empty default.
    #[derive(Clone, Copy, Debug, Default)]
    pub(crate) struct Observe;

    impl RetryObserver for Observe {}

    /// Nothing to remember about a request.
    pub(crate) struct CallInfo;

    impl CallInfo {
        #[inline]
        pub(crate) fn new(_: &Parts, _: bool) -> Self {
            CallInfo
        }
    }

    #[inline]
    pub(crate) fn in_call<F: Future>(_: CallInfo, future: F) -> F {
        future
    }

    #[inline]
    pub(crate) fn instrument<F: Future>(future: F) -> F {
        future
    }

    #[inline]
    pub(crate) fn record_response(_: StatusCode, _: Option<GrpcCode>) {}

    #[inline]
    pub(crate) fn record_error(_: &(dyn std::error::Error + Send + Sync + 'static)) {}

    #[inline]
    pub(crate) fn finished(_: StopReason) {}
}
