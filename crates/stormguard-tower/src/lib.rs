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
//! | [`breaker::CircuitBreakerLayer`] | fails calls fast while a shared circuit breaker is open; records every call's outcome and latency in its window |
//! | [`throttle::AdaptiveThrottleLayer`] | rejects requests locally in proportion to the backend's refusals (Google SRE adaptive throttling) |

pub mod breaker;
pub mod deadline;
pub mod fault;
pub mod hedge;
pub mod http_status;
pub mod metric_names;
pub mod observe;
pub mod reject;
#[cfg(feature = "reqwest")]
pub mod reqwest;
pub mod retry;
pub mod throttle;

pub use deadline::{DeadlineLayer, PropagateDeadlineLayer};
