//! Hedging: a second copy of a slow request, before the first has failed.
//!
//! # Why hedge?
//!
//! Retries fix failures; they do nothing for a request that is merely slow, and at scale
//! *some* request is always slow — a garbage collection, a cold cache, a busy disk. When 1 %
//! of calls take a second instead of ten milliseconds, a page that makes a hundred calls is
//! slow most of the time. Hedging (Dean and Barroso, "The Tail at Scale") sends another copy
//! of a request that has not answered within about its 95th-percentile latency and takes
//! whichever answers first: the tail shrinks to roughly the p95 plus one more fast call, for
//! a few percent of extra load.
//!
//! That extra load is the risk. When the downstream is slow *because* it is overloaded,
//! hedging adds copies exactly when it can least take them. So here, as in gRPC A6:
//!
//! - every hedge is paid for from the same [retry budget](crate::budget) as retries
//!   ([`Withdrawal::Hedge`](crate::budget::Withdrawal::Hedge)); when the budget refuses, no
//!   more hedges are sent;
//! - attempts are capped ([`MAX_ATTEMPTS`], A6's client-side limit of 5);
//! - a server's pushback postpones or stops hedges;
//! - only requests that are safe to run twice are hedged: idempotent ones, or ones carrying
//!   an idempotency key; any other request gets a single attempt;
//! - the deadline bounds the whole call, and the attempts that lose are cancelled (their
//!   futures dropped), so they stop consuming the caller's resources.
//!
//! See [`Hedger`] for the rules applied to each result. The [`HedgeDelay`] is fixed or read
//! from a live source (a latency percentile), once per call.

mod classify;
#[cfg(feature = "tokio")]
mod executor;
mod observe;
mod policy;

pub use classify::{HedgeClassifier, WithPushback};
#[cfg(feature = "tokio")]
pub use executor::{HedgeCall, HedgeError, HedgeFailure, HedgeReport, Hedger};
pub use observe::{HedgeObserver, HedgeStop, HedgingStopped};
pub use policy::{HedgeDelay, HedgePolicy, InvalidHedge, MAX_ATTEMPTS};
