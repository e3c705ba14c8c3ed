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
//! | [`admission::AdmissionLayer`] | asks a shared circuit breaker, adaptive throttle (Google SRE), or both before each call; refuses with a typed [`Refusal`](stormguard::admission::Refusal) and records each call's health outcome and latency |
//! | [`fault::FaultLayer`] | injects latency, error statuses or resets at seeded, run-time switchable rates, to prove the others |
//!
//! # Composing the layers by hand
//!
//! Composed by hand, they still never retry into an open breaker or past a throttle refusal
//! or a deadline: a refusal is typed ([`stormguard::admission::Refusal`]), stops a retry loop
//! uncharged, and is marked exhausted upstream. Put **one** retrying layer
//! ([`RetryLayer`](retry::RetryLayer) or [`HedgeLayer`](hedge::HedgeLayer)) in a client; the
//! others go around it in these orders, outermost first (each tested in
//! `tests/composition.rs` over a real server):
//!
//! | order | what you get |
//! | --- | --- |
//! | retry → admission → propagate → transport | the [`client`] stack's own order: the breaker counts every attempt; an open breaker or a throttle refusal stops the retries at once, uncharged to the budget; each attempt's own deadline is written on the wire |
//! | admission → retry → propagate → transport | the breaker counts each call once, by its final answer: a `503` the retry layer gave up on (marked `X-Retry-Exhausted`) is still a failure, so the breaker opens; a throttle here asks once per call |
//! | propagate → retry → admission → transport | the deadline header is written once, above; each attempt rewrites it with what is left for that attempt |
//! | hedge → admission → transport | no copy is sent into an open breaker, and none is charged for it |
//!
//! [`PropagateDeadlineLayer`] goes above or below the retrying layer (each attempt runs
//! under its own deadline either way) but above anything that moves the call to another task;
//! the [`DeadlineLayer`] belongs on the server, and [`fault::FaultLayer`] wherever a fault
//! should appear (in front of a server, or around a transport). A breaker or throttle on both
//! sides of a retry layer counts each attempt below and each call above: give each side its
//! own gate.
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

pub mod admission;
pub mod body;
pub mod client;
pub mod deadline;
pub mod fault;
pub mod hedge;
pub mod limit;
pub mod listen;
pub mod metric_names;
pub mod observe;
#[cfg(feature = "reqwest")]
pub mod reqwest;
pub mod retry;
pub mod wire;

pub use deadline::{DeadlineLayer, PropagateDeadlineLayer};
