//! One health window per downstream: the metric source the breaker (and later the throttle and
//! the retrier) read.
//!
//! # Why one shared window?
//!
//! A retrier and a circuit breaker that keep separate statistics about the same downstream
//! disagree exactly when it matters: the retrier keeps retrying into a downstream the breaker has
//! given up on, or the breaker counts every retry as fresh evidence and trips twice as fast as
//! the real failure rate says. Keeping *one* window per downstream, shared in an
//! [`Arc`](std::sync::Arc), gives every policy the same picture.
//!
//! # What is a call?
//!
//! Every attempt that reaches the downstream is one call, **retries included**: a request that
//! fails, is retried and fails again is two failed calls, because the downstream saw two
//! requests. A retry storm therefore moves the failure *ratio* only as fast as the failures the
//! downstream actually produces — retries add calls to both sides of the ratio, so they cannot
//! open a breaker that the same failures without retries would not open (they only reach the
//! minimum throughput sooner, which is the point: more traffic, more evidence). Calls that were
//! never sent (rejected by a breaker, a budget or a deadline) are not recorded.
//!
//! # What is a failure?
//!
//! Each call is sorted by its [`Outcome`](crate::classify::Outcome):
//!
//! | outcome | counted as |
//! | --- | --- |
//! | [`Outcome::Success`](crate::classify::Outcome::Success) | success |
//! | [`Outcome::Retryable`](crate::classify::Outcome::Retryable) | health failure |
//! | [`Outcome::Overloaded`](crate::classify::Outcome::Overloaded) | health failure |
//! | [`Outcome::InDoubt`](crate::classify::Outcome::InDoubt) | health failure (a timeout is the classic sign of a sick downstream) |
//! | [`Outcome::NeverRetry`](crate::classify::Outcome::NeverRetry) | a call, but **not** a health failure, unless [`HealthConfig::with_never_retry_as_failure`] |
//!
//! A deterministic failure (404, 422, and — by [`classify`](crate::classify)'s rules — 500/501)
//! says the downstream answered; counting it would let one client with a bad request open the
//! breaker for everyone. Every class is also counted separately in [`HealthCounts`].
//!
//! A call is *slow* when its elapsed time is strictly greater than the configured slow-call
//! threshold (as in Resilience4j); a slow call is counted as slow whatever its outcome.
//!
//! # Two shapes of window
//!
//! - [`HealthConfig::count`]: the last *N* calls, as a ring.
//! - [`HealthConfig::time`]: the last *T*, split into buckets of `T / buckets` on a
//!   [`CoarseMillis`](crate::clock::CoarseMillis) counter; the window covers the current bucket and the `buckets − 1`
//!   before it, so it holds between `T − T/buckets` and `T` of history.
//!
//! # Latency
//!
//! Every call's elapsed time also goes into a log-linear histogram per bucket (see
//! [`latency`]), so the same window answers "what is p99 of the recent calls?"
//! ([`HealthWindow::latency_percentile`]) for a hedging delay or a dashboard.
//!
//! # Cost
//!
//! A **time-based** window is built for the hot path: each recording thread owns the counts
//! of the current bucket (see the `time` module's notes), so a healthy call is recorded with
//! a few plain loads and stores and no lock, and two threads recording at once do not slow
//! each other down. Reading ([`HealthWindow::snapshot`]) locks the history and adds up the
//! live buckets and the recording threads' current ones. Memory: about 1 KiB per bucket plus
//! about 0.6 KiB per thread that has recorded.
//!
//! A **count-based** window must *evict* the call that falls out of the ring when a new one
//! arrives, and the eviction and the insertion must agree on the totals, in one global order
//! of calls; it keeps one short mutex per record, which keeps the totals exact and the code
//! obviously right, at the price of a lock on every call. Prefer a time-based window for a
//! downstream that sees many calls per second from many threads.
//!
//! Neither kind exposes its synchronisation, so either can change without changing callers.

// One file per concern; every public item is re-exported here, so the paths stay
// `stormguard::health::X`.
mod config;
mod counts;
pub mod latency;
mod ring;
mod time;
mod window;

pub use config::{
    HealthConfig, InvalidConfig, MAX_WINDOW_BUCKETS, MAX_WINDOW_CALLS, Problem, WindowKind,
};
pub use counts::HealthCounts;
pub use window::{HealthWindow, LatencySnapshot};

pub(crate) use window::Recorded;

#[cfg(test)]
mod tests;
