//! Retrying that stops when retrying stops helping.
//!
//! A retry loop that counts attempts and nothing else is what turns a blip into an outage: it
//! retries deterministic errors, it retries while the caller has already given up, and it
//! multiplies load exactly when the downstream is weakest. The retrier here stops at the
//! first of:
//!
//! - **success**;
//! - **a failure retrying cannot fix** ([`Outcome::NeverRetry`](crate::classify::Outcome)),
//!   or one whose effect is unknown ([`Outcome::InDoubt`](crate::classify::Outcome)) when the
//!   operation is neither idempotent nor keyed — retrying a payment after a timeout may
//!   charge twice;
//! - **attempts exhausted**;
//! - **the budget refuses** — see [`budget`](crate::budget);
//! - **a gate refuses** — with [`Retrier::with_breaker`] (or [`Retrier::with_gate`]) every
//!   attempt, the first included, needs a permit (see [`admission`](crate::admission) for how
//!   attempts are counted); a refusal met further down (a [`Refusal`](crate::admission::Refusal)
//!   that a [`Classifier::refusal`](crate::classify::Classifier::refusal) recognises) stops
//!   the loop the same way, uncharged;
//! - **the deadline cannot fit another attempt**: remaining < wait + minimum useful call time
//!   (the seeds' example ①: with 250 ms and 60 ms calls, five configured attempts become
//!   three, because the fourth could never finish in time);
//! - **the caller cancels** by dropping the future.
//!
//! The decision is a plain function ([`RetryRun::finish_attempt`]) that the async
//! [`Retrier`] and the simulator share. A server's `Retry-After` or gRPC pushback is honoured
//! as a lower bound on the wait, and an idempotency key is handed unchanged to every
//! attempt.

mod decide;
mod error;
#[cfg(feature = "tokio")]
mod executor;
mod key;
mod observe;
mod policy;
#[cfg(feature = "tokio")]
mod random;

pub use decide::{AttemptOutcome, Decision, RetryReason, RetryRun, StopReason};
pub use error::{Failure, RetryError};
#[cfg(feature = "tokio")]
pub use executor::{Attempt, Call, Report, Retrier};
pub use key::{IdempotencyKey, InvalidKey};
pub use observe::RetryObserver;
pub use policy::{InvalidPolicy, RetryPolicy};
#[cfg(feature = "tokio")]
pub use random::{RandomSource, SeededRandom};
