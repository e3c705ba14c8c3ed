//! A circuit breaker: stop calling a downstream that is failing, and find out cheaply when it
//! has recovered.
//!
//! # Why a breaker, when there are retry budgets?
//!
//! A budget limits how much *extra* load retries add; it still lets every first attempt
//! through. When a downstream is down — not slow, not flaky, down — every one of those first
//! attempts waits for a timeout, holds a connection and a thread, and tells us nothing new. A
//! breaker notices the correlated failure in the shared [`HealthWindow`](crate::health::HealthWindow) and fails calls
//! *immediately* with [`BreakerOpen`], which also gives the downstream room to recover.
//!
//! # States
//!
//! - **Closed**: every call is admitted. After each recorded call, if the window holds at least
//!   `minimum_throughput` calls and its failure ratio or slow-call ratio crosses its threshold
//!   (see [`Comparison`]), the breaker opens.
//! - **Open**: every call is rejected with [`BreakerOpen`] for the open duration: `open_duration
//!   × growth^(n−1)` for the *n*-th consecutive open (growth 1 by default), capped at
//!   `max_open_duration`, then multiplied by a random factor in `[1 − jitter, 1 + jitter]` and
//!   capped again. The jitter keeps a fleet of clients that opened together from probing
//!   together.
//! - **Half-open**: the first [`try_acquire`](CircuitBreaker::try_acquire) after the open
//!   duration moves the breaker here (lazily: no timer runs). At most `permitted_probes` calls
//!   are admitted as probes. Any probe that fails (a health failure or a slow call) reopens the
//!   breaker; when `permitted_probes` probes have succeeded it closes, clears the window and
//!   resets the growth.
//! - **Isolated**: held open by [`isolate`](CircuitBreaker::isolate) until
//!   [`reset`](CircuitBreaker::reset).
//!
//! # How attempts are counted
//!
//! Every attempt is one call: the retrier acquires a permit for *each* attempt, retries
//! included, and records its outcome. A request that fails three times is three failed calls,
//! because the downstream saw three requests. Retries add to the number of calls as well as to
//! the number of failures, so a retry storm cannot push the failure *ratio* above what the
//! downstream actually produces; it can only reach `minimum_throughput` sooner. Calls the
//! breaker rejected were never sent and are not recorded. See also
//! [`health`](crate::health#what-is-a-call) for which outcomes are failures.
//!
//! # Permits
//!
//! [`try_acquire`](CircuitBreaker::try_acquire) returns a [`Permit`]; record the call's outcome
//! with [`Permit::record`]. A permit dropped **without** a record (the caller was cancelled,
//! or lost a hedge race) is *abandoned*: nothing is recorded in the window, because a
//! cancellation says nothing about the downstream, and a half-open probe slot it held is
//! returned, so another probe may be admitted (Resilience4j's `releasePermission` does the
//! same). A timeout that *you* enforce is not an abandonment: record it as
//! [`Outcome::InDoubt`](crate::classify::Outcome::InDoubt).
//!
//! # Events
//!
//! State changes and rejections are reported to a [`BreakerObserver`] (no-op by default),
//! after the breaker's lock is released, so an observer may call back into the breaker.
//!
//! # Cost
//!
//! A closed breaker admits a call with one atomic load. Recording a healthy call on a
//! closed breaker over a time-based window takes no lock either: the window records it in the
//! recording thread's own shard (see [`health`](crate::health#cost)), and the breaker looks at
//! the totals only when they may have moved towards a threshold (a failed or slow call, a new
//! bucket; see `CircuitBreaker::record`'s notes in the source). Failed and slow calls, probes
//! and state changes take the breaker's mutex; a count-based window takes its own mutex on
//! every record (and the breaker's only to open). `benches/breaker.rs` measures the healthy path against recloser, failsafe
//! and tower-resilience.
//!
//! # Owned permits
//!
//! [`CircuitBreaker::try_acquire_owned`] gives an [`OwnedPermit`] holding an [`Arc`](std::sync::Arc) of the
//! breaker, for futures that must be `'static` (tower services).

// One file per concern; every public item is re-exported here, so the paths stay
// `stormguard::breaker::X`.
mod circuit;
mod config;
mod error;
mod events;
mod permit;
mod state;

pub use config::{BreakerConfig, Comparison};
pub use error::{BreakerOpen, Rejection};
pub use events::{BreakerObserver, Cause, StateChange};
pub use permit::{OwnedPermit, Permit};
pub use state::{BreakerState, CircuitBreaker};

#[cfg(test)]
mod tests;
