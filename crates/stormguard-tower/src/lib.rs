//! tower Layers that carry stormguard's policies across HTTP and gRPC hops.
//!
//! A call chain behaves well only when every hop agrees on two budgets: the time the caller
//! is still waiting (each hop hands downstream its remaining time minus a reserve) and the
//! retries the chain may send (only one layer retries; a response marked
//! `X-Retry-Exhausted: true` is never retried again upstream). The layers here put the core's
//! decisions at the edges of a hyper, axum, tonic or reqwest service.
//!
//! | layer | what it does |
//! | --- | --- |
//! | [`DeadlineLayer`] | server: reads the incoming deadline (`grpc-timeout`, `connect-timeout-ms`, `x-envoy-expected-rq-timeout-ms`, `X-Request-Deadline`), refuses expired requests, runs the handler under it and cancels it when it passes (504 / `DEADLINE_EXCEEDED`) |
//! | [`PropagateDeadlineLayer`] | client: writes the current deadline minus the hop reserve on the outgoing request, and does not send when less than the minimum useful call time is left |
//! | [`retry::RetryLayer`] | client: the core's retrier for HTTP and gRPC — body replay, idempotency rules, Retry-After and pushback, per-route policies, `X-Retry-Exhausted` so only one layer of a chain retries |
//! | [`hedge::HedgeLayer`] | client: sends another copy of a slow idempotent request after a delay, paid from the retry budget (gRPC A6 hedging) |
//! | [`breaker::CircuitBreakerLayer`] | fails calls fast while a shared circuit breaker is open; records every call's outcome and latency in its window |
//! | [`throttle::AdaptiveThrottleLayer`] | rejects requests locally in proportion to the backend's refusals (Google SRE adaptive throttling) |
//! | [`fault::FaultLayer`] | injects latency, error statuses or resets at seeded, run-time switchable rates, to prove the others |
//!
//! Outside the layers: [`reqwest::RetryMiddleware`] (feature `reqwest`) gives reqwest callers the
//! same retry rules, and [`observe`] (features `tracing`, `metrics`, `json-log`) makes every
//! attempt visible, with the metric names in [`metric_names`].

pub mod body;
pub mod breaker;
pub mod client;
pub mod deadline;
pub mod fault;
pub mod hedge;
pub mod metric_names;
pub mod observe;
pub mod reject;
#[cfg(feature = "reqwest")]
pub mod reqwest;
pub mod retry;
pub mod throttle;
pub mod wire;

pub use deadline::{DeadlineLayer, PropagateDeadlineLayer};
