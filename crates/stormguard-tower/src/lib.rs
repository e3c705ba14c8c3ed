//! stormguard's policies on the wire: one client stack for hyper, tonic and reqwest, and the
//! server layers that meet it on the other side.
//!
//! A call chain behaves well only when every hop agrees on two budgets: the time the caller is
//! still waiting (each hop hands downstream its remaining time minus a reserve) and the retries
//! the chain may send (only one layer retries; a failure marked `X-Retry-Exhausted: true` is
//! never retried again upstream).
//!
//! # The client: one stack, one policy
//!
//! [`client::ClientLayer`] is what a service puts in front of each downstream. One
//! [`EndpointPolicy`](stormguard::policy::EndpointPolicy) per endpoint drives, in the one
//! order in which they work together: the call's deadline, the adaptive throttle, retries or
//! hedging with a shared budget, the circuit breaker per attempt, and each attempt's deadline
//! written on the wire; every step reports to one [`observe::Observer`]. Its policies can be
//! swapped while it runs, without losing a breaker's state or a budget's tokens.
//!
//! ```
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use stormguard::policy::PolicyFile;
//! use stormguard_tower::client::ClientLayer;
//! use tower::ServiceBuilder;
//! # type Body = stormguard_tower::body::ReplayBody<http_body_util::Full<bytes::Bytes>>;
//!
//! let policies = PolicyFile::from_toml(r#"
//!     [endpoints."GET /users/*"]
//!     idempotency = "idempotent"
//!     timeouts = { per_try = "300ms", overall = "1s" }
//!     budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
//!     breaker = { count = 20, minimum_throughput = 10 }
//! "#)?;
//! let users = ServiceBuilder::new()
//!     .layer(ClientLayer::from_policy_file(&policies)?)
//!     .service(Client::builder(TokioExecutor::new()).build_http::<Body>());
//! # let _ = users;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The layers, one by one
//!
//! | layer | what it does |
//! | --- | --- |
//! | [`DeadlineLayer`] | server: reads the incoming deadline (`grpc-timeout`, `connect-timeout-ms`, `x-envoy-expected-rq-timeout-ms`, `X-Request-Deadline`), refuses expired requests, runs the handler under it and cancels it when it passes (504 / `DEADLINE_EXCEEDED`) |
//! | [`limit::AdaptiveLimitLayer`] | server: works on at most an adaptive number of requests at once (Vegas, AIMD, Gradient2), sheds requests whose deadline is too close first, queues briefly (CoDel, adaptive LIFO), answers 503 + `Retry-After` / `RESOURCE_EXHAUSTED` + pushback |
//! | [`PropagateDeadlineLayer`] | client: writes the current deadline minus the hop reserve on the outgoing request, and does not send when less than the minimum useful call time is left |
//! | [`retry::RetryLayer`] | client: the stack's retrying alone, for composing by hand |
//! | [`hedge::HedgeLayer`] | client: the stack's hedging alone (gRPC A6), for composing by hand |
//! | [`breaker::CircuitBreakerLayer`] | fails calls fast while a shared circuit breaker is open; records every call's outcome and latency in its window |
//! | [`throttle::AdaptiveThrottleLayer`] | rejects requests locally in proportion to the backend's refusals (Google SRE adaptive throttling) |
//! | [`fault::FaultLayer`] | injects latency, error statuses or resets at seeded, run-time switchable rates, to prove the others |
//!
//! Composed by hand, in any order, they still never retry into an open breaker or past a
//! throttle refusal or a deadline: a refusal is typed ([`stormguard::admission::Refusal`]),
//! stops a retry loop uncharged, and is marked exhausted upstream.
//!
//! # Shared parts
//!
//! [`wire`] holds every fact read off or written on a request or response (header names, gRPC
//! detection, the retry-safety rule, the `Idempotency-Key` parser the idempotency server uses
//! too, deadline headers, what a status or an error means); [`body::ReplayBody`] is the body
//! that retries, hedges and the idempotency server replay; [`observe`] (features `tracing`,
//! `metrics`, `json-log`) makes every attempt visible, with the metric names in
//! [`metric_names`]. With the `reqwest` feature, the `reqwest` module gives reqwest callers
//! the same stack as a `reqwest-middleware` middleware.

pub mod body;
pub mod breaker;
pub mod client;
pub mod deadline;
pub mod fault;
pub mod hedge;
pub mod limit;
pub mod metric_names;
pub mod observe;
pub mod reject;
#[cfg(feature = "reqwest")]
pub mod reqwest;
pub mod retry;
pub mod throttle;
pub mod wire;

pub use deadline::{DeadlineLayer, PropagateDeadlineLayer};
