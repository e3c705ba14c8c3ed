//! tower Layers that carry stormguard's policies across HTTP and gRPC hops.
//!
//! A call chain behaves well only when every hop agrees on two budgets: the time the caller
//! is still waiting (each hop hands downstream its remaining time minus a reserve) and the
//! retries the chain may send (only one layer retries; a response marked
//! `X-Retry-Exhausted: true` is never retried again upstream). The layers here put the core's
//! decisions at the edges of a hyper, axum, tonic or reqwest service.

pub mod metric_names;
pub mod observe;
pub mod retry;
