//! What every layer does, made visible through one observer API.
//!
//! A retry that nobody can see is how a retry storm goes unnoticed until the downstream falls
//! over: the caller's latency looks fine, the error rate looks fine, and the downstream's load
//! has tripled. So the client stack and every layer of this crate report what they do — each
//! attempt, each retry and why, each refusal by a budget, breaker, throttle or deadline, each
//! breaker transition, each hedge, each fallback — to one [`Observer`], with the call's
//! context ([`CallInfo`]: endpoint, method, protocol, request id).
//!
//! [`Telemetry`], the default observer, turns those events into the three outputs below, each
//! behind a feature that costs nothing when off (the observer's methods are then empty and the
//! stack skips its bookkeeping, see [`Observer::ENABLED`]). Implement [`Observer`] for your
//! own sink (a per-dependency counter, a test probe) and combine it with [`Telemetry`] as a
//! pair: `(Telemetry, MyObserver)`.
//!
//! | feature | what | through |
//! | --- | --- | --- |
//! | `tracing` | a span per attempt | [`tracing`](https://docs.rs/tracing) |
//! | `metrics` | counters, gauges and histograms ([`metric_names`](crate::metric_names)) | the [`metrics`](https://docs.rs/metrics) facade |
//! | `json-log` | one structured event per attempt, per refusal and per breaker transition | `tracing` events, printed as JSON lines by `tracing_subscriber::fmt().json()` |
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
//! | `retry.reason` | on retries only: why ([`RetryReason::label`]: `failed`, `overloaded`, `in_doubt`, `timed_out`) |
//! | `retry.delay_ms` | on retries only: the wait before this attempt |
//! | `endpoint` | the policy endpoint the request was routed to |
//! | `http.request.method` | the request method |
//! | `request_id` | the request's `x-request-id`, when it has one |
//! | `http.response.status_code` | the response status, when a response came |
//! | `rpc.grpc.status_code` | the gRPC status, for gRPC responses |
//! | `error.type` | for transport failures and timeouts: `timeout`, `connection_refused`, `connection_reset`, `incomplete_message`, … |
//! | `retry.outcome` | the classification ([`Outcome::label`]) |
//! | `elapsed_ms` | the attempt's duration |
//!
//! # Metrics (`metrics`)
//!
//! The names in [`metric_names`](crate::metric_names), every one labelled with the
//! `endpoint`: requests by `outcome` (the stop reason), attempts, attempt results by `code`
//! (the HTTP status, or `none`), retries by `reason`,
//! refusals by `by` (budget, circuit_open, throttled, deadline_too_close), breaker state and
//! transitions, hedges sent/won/cancelled, fallbacks, and the attempt-duration and
//! retry-delay histograms (seconds). Call `describe_metrics()` (feature `metrics`) once to give them units and
//! help texts.
//!
//! # Log lines (`json-log`)
//!
//! One INFO event per attempt, target [`TARGET`], message `"attempt finished"`, inside the
//! attempt's span when `tracing` is on, with the fields `request_id`, `endpoint`,
//! `http.request.method`, `retry_count` (retries before this attempt), `elapsed_ms`,
//! `status_code`, `grpc_status`, `error_type` (as `error.type` above) and `outcome`; a WARN
//! event `"call refused"` per refusal and `"breaker state changed"` per transition. A field
//! without a value is left out rather than written as null.
//!
//! *Why events and not a writer of our own:* the application already decides where logs go,
//! how they are filtered and sampled, and in which format; an event joins that pipeline,
//! carries the span context, and `tracing_subscriber::fmt().json().flatten_event(true)`
//! prints exactly one JSON object per event:
//!
//! ```text
//! {"timestamp":"…","level":"INFO","message":"attempt finished","request_id":"req-7","endpoint":"GET /users/*","http.request.method":"GET","retry_count":1,"elapsed_ms":10,"status_code":503,"outcome":"retryable","target":"stormguard::retry","span":{…},"spans":[…]}
//! ```

#[cfg(feature = "json-log")]
mod json;
#[cfg(feature = "metrics")]
mod metric_keys;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "tracing")]
pub(crate) mod span;

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use stormguard::admission::Refusal;
use stormguard::breaker::{BreakerObserver, StateChange};
use stormguard::classify::{GrpcCode, Outcome};
use stormguard::retry::{RetryReason, StopReason};

use crate::wire::Protocol;

#[cfg(feature = "metrics")]
pub(crate) use self::metric_keys::EndpointKeys;
#[cfg(feature = "metrics")]
pub use self::metrics::describe_metrics;

/// Without the `metrics` feature an endpoint has no metric keys to keep.
#[cfg(not(feature = "metrics"))]
#[derive(Clone, Debug)]
pub(crate) struct EndpointKeys;

#[cfg(not(feature = "metrics"))]
impl EndpointKeys {
    pub(crate) fn new(_endpoint: &Arc<str>) -> Self {
        EndpointKeys
    }
}

/// The name of the span each attempt runs in (feature `tracing`).
pub const SPAN_NAME: &str = "stormguard.attempt";

/// The target of the attempt spans and log events.
pub const TARGET: &str = "stormguard::retry";

/// The context of one call, handed to every event of it.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct CallInfo<'a> {
    /// The policy endpoint the call was routed to (`"default"` for a single policy).
    pub endpoint: &'a str,
    /// The request method.
    pub method: &'a Method,
    /// HTTP, gRPC or gRPC-Web.
    pub protocol: Protocol,
    /// The request's `x-request-id`, when it has a printable one.
    pub request_id: Option<&'a str>,
    /// The endpoint's metric keys, when the client stack made this context.
    #[cfg(feature = "metrics")]
    metric_keys: Option<&'a EndpointKeys>,
}

impl std::fmt::Debug for CallInfo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallInfo")
            .field("endpoint", &self.endpoint)
            .field("method", self.method)
            .field("protocol", &self.protocol)
            .field("request_id", &self.request_id)
            .finish_non_exhaustive()
    }
}

impl<'a> CallInfo<'a> {
    /// The context of a call to `endpoint`.
    pub fn new(
        endpoint: &'a str,
        method: &'a Method,
        protocol: Protocol,
        request_id: Option<&'a str>,
    ) -> Self {
        CallInfo {
            endpoint,
            method,
            protocol,
            request_id,
            #[cfg(feature = "metrics")]
            metric_keys: None,
        }
    }

    /// The same context, recorded with the endpoint's metric keys.
    pub(crate) fn with_metric_keys(self, keys: &'a EndpointKeys) -> Self {
        #[cfg(feature = "metrics")]
        return CallInfo {
            metric_keys: Some(keys),
            ..self
        };
        #[cfg(not(feature = "metrics"))]
        {
            let _ = keys;
            self
        }
    }
}

/// An attempt about to be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttemptStart {
    /// 1 for the first attempt.
    pub number: u32,
    /// For a retry: why, and how long the stack waited before it.
    pub retry: Option<(RetryReason, Duration)>,
}

/// An attempt that ended.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct AttemptEnd {
    /// 1 for the first attempt.
    pub number: u32,
    /// How long it took.
    pub elapsed: Duration,
    /// How it was classified.
    pub outcome: Outcome,
    /// Whether its per-try timeout (or the deadline) cut it.
    pub timed_out: bool,
    /// The response status, when a response came.
    pub status: Option<StatusCode>,
    /// The gRPC status, for gRPC responses.
    pub grpc_status: Option<GrpcCode>,
    /// A short label for a failure without a response (`timeout`, `connection_refused`, …;
    /// see [`wire::error_type`](crate::wire::error_type)).
    pub error_type: Option<&'static str>,
}

/// A call that ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallEnd {
    /// Attempts sent, the first included.
    pub attempts: u32,
    /// Why the stack stopped.
    pub stop: StopReason,
    /// How long the call took, retries and waits included.
    pub elapsed: Duration,
    /// Whether the answer was marked `X-Retry-Exhausted: true`.
    pub marked_exhausted: bool,
}

/// What a hedged call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HedgeEvent {
    /// Attempt `attempt` was sent (the original is 1).
    Sent {
        /// Its number.
        attempt: u32,
    },
    /// Attempt `attempt`'s answer was returned.
    Won {
        /// Its number.
        attempt: u32,
    },
    /// Attempt `attempt` was cancelled: another won, or the call ended.
    Cancelled {
        /// Its number.
        attempt: u32,
    },
}

/// Why a call was answered from the fallback.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum FallbackReason {
    /// The stack gave up (the stop reason says why).
    GaveUp(StopReason),
    /// A gate or the deadline refused the call before anything was sent.
    Refused(Refusal),
    /// The policy says to always use the fallback (`fallback = "always"`).
    Forced,
}

impl FallbackReason {
    /// A short label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            FallbackReason::GaveUp(stop) => stop.label(),
            FallbackReason::Refused(refusal) => refusal.label(),
            FallbackReason::Forced => "forced",
        }
    }
}

/// Receives what the client stack and the layers of this crate do. Every method has an empty
/// default; implement the ones you need.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use stormguard_tower::observe::{CallEnd, CallInfo, Observer};
///
/// #[derive(Default)]
/// struct GiveUps(AtomicU64);
///
/// impl Observer for GiveUps {
///     fn call_finished(&self, _call: &CallInfo<'_>, end: &CallEnd) {
///         if end.attempts > 1 && !end.stop.eq(&stormguard::retry::StopReason::Succeeded) {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait Observer: Send + Sync + 'static {
    /// Whether this observer wants events at all. An observer whose methods are all empty
    /// sets it to `false`, and the stack then reads no clock and keeps no state for it.
    const ENABLED: bool = true;

    /// An attempt is about to be sent.
    fn attempt_started(&self, call: &CallInfo<'_>, attempt: &AttemptStart) {
        let _ = (call, attempt);
    }

    /// An attempt ended.
    fn attempt_ended(&self, call: &CallInfo<'_>, attempt: &AttemptEnd) {
        let _ = (call, attempt);
    }

    /// The call ended.
    fn call_finished(&self, call: &CallInfo<'_>, end: &CallEnd) {
        let _ = (call, end);
    }

    /// The retry budget refused a retry or a hedge.
    fn budget_refused(&self, call: &CallInfo<'_>) {
        let _ = call;
    }

    /// A breaker, the throttle or the deadline refused the call (or one of its attempts)
    /// before it was sent.
    fn refused(&self, call: &CallInfo<'_>, refusal: &Refusal) {
        let _ = (call, refusal);
    }

    /// The breaker of `endpoint` changed state.
    fn breaker_changed(&self, endpoint: &str, change: &StateChange) {
        let _ = (endpoint, change);
    }

    /// A hedged call sent, won with, or cancelled an attempt.
    fn hedge(&self, call: &CallInfo<'_>, event: HedgeEvent) {
        let _ = (call, event);
    }

    /// The call was answered from the fallback.
    fn fallback(&self, call: &CallInfo<'_>, reason: FallbackReason) {
        let _ = (call, reason);
    }
}

/// No observer: nothing is reported and nothing is measured for it.
impl Observer for () {
    const ENABLED: bool = false;
}

impl<A: Observer, B: Observer> Observer for (A, B) {
    const ENABLED: bool = A::ENABLED || B::ENABLED;

    fn attempt_started(&self, call: &CallInfo<'_>, attempt: &AttemptStart) {
        self.0.attempt_started(call, attempt);
        self.1.attempt_started(call, attempt);
    }
    fn attempt_ended(&self, call: &CallInfo<'_>, attempt: &AttemptEnd) {
        self.0.attempt_ended(call, attempt);
        self.1.attempt_ended(call, attempt);
    }
    fn call_finished(&self, call: &CallInfo<'_>, end: &CallEnd) {
        self.0.call_finished(call, end);
        self.1.call_finished(call, end);
    }
    fn budget_refused(&self, call: &CallInfo<'_>) {
        self.0.budget_refused(call);
        self.1.budget_refused(call);
    }
    fn refused(&self, call: &CallInfo<'_>, refusal: &Refusal) {
        self.0.refused(call, refusal);
        self.1.refused(call, refusal);
    }
    fn breaker_changed(&self, endpoint: &str, change: &StateChange) {
        self.0.breaker_changed(endpoint, change);
        self.1.breaker_changed(endpoint, change);
    }
    fn hedge(&self, call: &CallInfo<'_>, event: HedgeEvent) {
        self.0.hedge(call, event);
        self.1.hedge(call, event);
    }
    fn fallback(&self, call: &CallInfo<'_>, reason: FallbackReason) {
        self.0.fallback(call, reason);
        self.1.fallback(call, reason);
    }
}

impl<O: Observer> Observer for Arc<O> {
    const ENABLED: bool = O::ENABLED;

    fn attempt_started(&self, call: &CallInfo<'_>, attempt: &AttemptStart) {
        (**self).attempt_started(call, attempt);
    }
    fn attempt_ended(&self, call: &CallInfo<'_>, attempt: &AttemptEnd) {
        (**self).attempt_ended(call, attempt);
    }
    fn call_finished(&self, call: &CallInfo<'_>, end: &CallEnd) {
        (**self).call_finished(call, end);
    }
    fn budget_refused(&self, call: &CallInfo<'_>) {
        (**self).budget_refused(call);
    }
    fn refused(&self, call: &CallInfo<'_>, refusal: &Refusal) {
        (**self).refused(call, refusal);
    }
    fn breaker_changed(&self, endpoint: &str, change: &StateChange) {
        (**self).breaker_changed(endpoint, change);
    }
    fn hedge(&self, call: &CallInfo<'_>, event: HedgeEvent) {
        (**self).hedge(call, event);
    }
    fn fallback(&self, call: &CallInfo<'_>, reason: FallbackReason) {
        (**self).fallback(call, reason);
    }
}

/// A circuit breaker's state changes, reported to an [`Observer`] as
/// [`breaker_changed`](Observer::breaker_changed) with the endpoint's name: the
/// [`BreakerObserver`] to build a breaker with, so that its transitions are seen the same way
/// whichever layer or stack uses it.
///
/// ```
/// use stormguard::breaker::CircuitBreaker;
/// use stormguard_tower::observe::{BreakerEvents, Telemetry};
///
/// let breaker = CircuitBreaker::resilience4j_default()
///     .with_observer(BreakerEvents::new("payments", Telemetry));
/// # let _ = breaker;
/// ```
pub struct BreakerEvents<O> {
    endpoint: Arc<str>,
    observer: Arc<O>,
}

impl<O: Observer> BreakerEvents<O> {
    /// Reports the transitions of the breaker of `endpoint` to `observer`.
    pub fn new(endpoint: &str, observer: O) -> Self {
        BreakerEvents::shared(Arc::from(endpoint), Arc::new(observer))
    }

    /// As [`new`](Self::new), with an observer and a name already shared.
    pub fn shared(endpoint: Arc<str>, observer: Arc<O>) -> Self {
        BreakerEvents { endpoint, observer }
    }
}

impl<O: Observer> BreakerObserver for BreakerEvents<O> {
    fn state_changed(&self, change: &StateChange) {
        self.observer.breaker_changed(&self.endpoint, change);
    }
}

impl<O> std::fmt::Debug for BreakerEvents<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BreakerEvents")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// The default observer: metrics (feature `metrics`) and JSON log events (feature
/// `json-log`); the attempt spans (feature `tracing`) are opened by the stack itself, around
/// each attempt. With every feature off it is as empty as `()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Telemetry;

impl Observer for Telemetry {
    const ENABLED: bool = cfg!(any(
        feature = "tracing",
        feature = "metrics",
        feature = "json-log"
    ));

    fn attempt_started(&self, call: &CallInfo<'_>, attempt: &AttemptStart) {
        #[cfg(feature = "metrics")]
        self::metrics::attempt_started(call, attempt);
        let _ = (call, attempt);
    }

    fn attempt_ended(&self, call: &CallInfo<'_>, attempt: &AttemptEnd) {
        #[cfg(feature = "metrics")]
        self::metrics::attempt_ended(call, attempt);
        #[cfg(feature = "json-log")]
        self::json::attempt_ended(call, attempt);
        let _ = (call, attempt);
    }

    fn call_finished(&self, call: &CallInfo<'_>, end: &CallEnd) {
        #[cfg(feature = "metrics")]
        self::metrics::call_finished(call, end);
        let _ = (call, end);
    }

    fn budget_refused(&self, call: &CallInfo<'_>) {
        #[cfg(feature = "metrics")]
        self::metrics::refused(call, "budget");
        let _ = call;
    }

    fn refused(&self, call: &CallInfo<'_>, refusal: &Refusal) {
        #[cfg(feature = "metrics")]
        self::metrics::refused(call, refusal.label());
        #[cfg(feature = "json-log")]
        self::json::refused(call, refusal);
        let _ = (call, refusal);
    }

    fn breaker_changed(&self, endpoint: &str, change: &StateChange) {
        #[cfg(feature = "metrics")]
        self::metrics::breaker_changed(endpoint, change);
        #[cfg(feature = "json-log")]
        self::json::breaker_changed(endpoint, change);
        let _ = (endpoint, change);
    }

    fn hedge(&self, call: &CallInfo<'_>, event: HedgeEvent) {
        #[cfg(feature = "metrics")]
        self::metrics::hedge(call, event);
        let _ = (call, event);
    }

    fn fallback(&self, call: &CallInfo<'_>, reason: FallbackReason) {
        #[cfg(feature = "metrics")]
        self::metrics::fallback(call, reason);
        let _ = (call, reason);
    }
}
