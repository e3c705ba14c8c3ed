//! stormguard keeps timeouts and retries from turning a small fault into an outage.
//!
//! Every decision here is a question about a budget: the *time* left before the caller stops
//! listening (the [`deadline`]), and the *retries* left before retrying starts to hurt (the
//! retry [`budget`]). The core answers those questions with plain functions over an
//! injectable [`clock`] and random source, so the same policy objects run in production, in
//! tests under tokio's paused time, and in the simulator.
//!
//! | module | what it decides |
//! | --- | --- |
//! | [`backoff`] | how long to wait before retry *n* (fixed, linear, exponential; full, equal, decorrelated jitter) |
//! | [`budget`] | whether a retry may be sent at all (gRPC/AWS token buckets, Finagle ratio, Envoy concurrency) |
//! | [`deadline`] | how much time is left, what to hand downstream, and the wire formats that carry it |
//! | [`classify`] | what a result means: success, retryable, never retry, overloaded, in doubt |
//! | [`health`] | how a downstream is doing: one shared window of outcomes and slow calls |
//! | [`admission`] | whether an attempt may be sent at all: gates (breaker, throttle) and the refusals that stop retries |
//! | [`breaker`] | whether to call a downstream at all (circuit breaker over the health window) |
//! | [`throttle`] | whether to send a request to an overloaded backend (Google SRE adaptive throttling) |
//! | [`retry`] | the retrier that combines them, and the pure decision it is built on |
//! | [`hedge`] | when to send another copy of a slow request (gRPC A6 hedging), paid from the retry budget |
//! | [`limit`] | how many requests a server works on at once: adaptive concurrency limits (AIMD, Vegas, Gradient2) |
//! | [`fault`] | latency, error statuses and resets injected on purpose, at run-time switchable rates |
//! | [`policy`] | one endpoint's whole client policy (retry or hedge, timeouts, budget, breaker, throttle, deadline propagation, fallback, time windows), and the TOML/JSON files that hold them, validated at load |
//!
//! # Configuration is checked before anything runs
//!
//! Every configuration type has one check, `validate(&self) -> Result<(), E>`, whose typed
//! error names the rule and the field broken ([`RetryPolicy::validate`](retry::RetryPolicy::validate),
//! [`BreakerConfig::validate`](breaker::BreakerConfig::validate), …). Every running type is
//! made by a constructor that runs that check and returns `Result` —
//! `retry::Retrier::new`, `hedge::Hedger::new` (feature `tokio`),
//! [`CircuitBreaker::new`](breaker::CircuitBreaker::new), [`HealthWindow::new`](health::HealthWindow::new),
//! [`AdaptiveThrottle::new`](throttle::AdaptiveThrottle::new), [`Limiter::new`](limit::Limiter::new),
//! [`FaultInjector::new`](fault::FaultInjector::new), the budgets' constructors — so a
//! configuration that breaks a rule never runs: it is refused where it is handed over.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use stormguard::backoff::Backoff;
//! use stormguard::budget::TokenBucket;
//! use stormguard::classify::ByErrorClass;
//! use stormguard::deadline::{self, Deadline};
//! use stormguard::retry::{Retrier, RetryPolicy, StopReason};
//!
//! let policy = RetryPolicy::new(5)
//!     .with_backoff(Backoff::exponential(Duration::from_millis(20)).with_cap(Duration::from_millis(200)))
//!     .with_min_call(Duration::from_millis(60));
//! let budget = Arc::new(TokenBucket::grpc(10, 0.1).unwrap());
//! // The policy is checked here: a retrier only runs a valid one.
//! let retrier = Retrier::new(policy).unwrap().with_budget(budget);
//!
//! // A server handler: the request arrived with 250 ms left.
//! let call = retrier.run(
//!     |_attempt| async {
//!         tokio::time::sleep(Duration::from_millis(60)).await;
//!         Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
//!     },
//!     ByErrorClass,
//! );
//! let err = deadline::scope(Deadline::after(Duration::from_millis(250), Default::default()), call)
//!     .await
//!     .unwrap_err();
//! assert_eq!(err.reason(), StopReason::DeadlineTooClose);
//! # }
//! ```

// Module docs explain the tokio executor and the policy types beside the decisions they use;
// without those features the links to them cannot resolve. They are checked where they do
// (the default and all-features doc builds in CI); a build without them still checks the rest.
#![cfg_attr(
    not(all(feature = "tokio", feature = "policy")),
    allow(rustdoc::broken_intra_doc_links)
)]

pub mod admission;
#[cfg(feature = "policy")]
pub mod advise;
pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod classify;
pub mod clock;
pub mod deadline;
pub mod duration;
pub mod fault;
#[cfg(feature = "policy")]
pub mod graph;
pub mod health;
pub mod hedge;
pub mod limit;
#[cfg(feature = "policy")]
pub mod lint;
#[cfg(feature = "policy")]
pub mod policy;
pub mod retry;
#[cfg(feature = "policy")]
pub mod rules;
pub mod throttle;
