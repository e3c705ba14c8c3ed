//! A discrete-event simulator of retry storms, retry amplification, retry budgets and
//! metastable overload, driving stormguard's real policy objects on a virtual clock.
//!
//! # Why a simulator, and why the real policies
//!
//! Retry policies fail in production at scale and under correlated failure — the conditions
//! unit tests do not reach. A thousand clients failing in one millisecond, three layers each
//! retrying twice, a budget that must shut retries off within tens of milliseconds, a system
//! that stays overloaded after its trigger is gone: these are questions about *populations*
//! of requests over *time*. The simulator answers them in virtual time, deterministically,
//! in seconds of CPU.
//!
//! What it simulates is the downstream (latency, capacity, failures, outages) and the
//! population (arrivals, clients). What it does **not** do is re-implement any policy: every
//! wait comes from the core's [`Backoff`](stormguard::backoff::Backoff), every retry/stop
//! decision (attempts, deadline, budget) from
//! [`RetryRun::finish_attempt`](stormguard::retry::RetryRun::finish_attempt), and every
//! budget decision from the core's [`RetryBudget`](stormguard::budget::RetryBudget)s, with
//! time-windowed budgets reading a [`ManualClock`](stormguard::clock::ManualClock) that the
//! event loop moves ([`vclock`]). So the figures are what the production code does.
//!
//! # Scenarios
//!
//! | module | question |
//! | --- | --- |
//! | [`scenario::storm`] | how high is the retry peak when N clients fail at once, per backoff strategy? |
//! | [`scenario::chain`] | how much traffic does a failing bottom service see when every layer retries? |
//! | [`scenario::budget`] | how fast does each budget kind shut retries off when success drops? |
//! | [`scenario::overload`] | does the system come back after a trigger, with and without protection? |
//! | [`scenario::occ`] | how many calls do clients contending on optimistic concurrency need? |
//! | [`scenario::converge`] | how fast does the server's adaptive concurrency limit follow a handler that gets slower? |
//! | [`scenario::whatif`] | what does *my* call graph, with *my* policy files, do when one of its services fails? |
//!
//! # Engine
//!
//! Virtual time is a `u64` of nanoseconds ([`time`]). Pending events are 16 bytes (time and a
//! packed payload) in a timing wheel backed by a monotone radix heap ([`queue`]) that pops
//! them in exact (time, payload) order; per-request state lives in slots reused through a free list
//! ([`slab`]), so memory follows requests *in flight* plus bins ([`bins`]), never the total
//! number of events. Randomness is a seeded [`SmallRng`](rand::rngs::SmallRng) per
//! independent stream ([`rng`]): the same `seed` gives byte-identical results.
//!
//! # Example
//!
//! ```
//! use stormguard_sim::progress::NoProgress;
//! use stormguard_sim::scenario::storm::{StormConfig, run};
//!
//! let report = run(&StormConfig::default(), &mut NoProgress)?;
//! let fixed = &report.rows[0];
//! assert_eq!((fixed.total_retries, fixed.peak_per_bin, fixed.last_retry_s), (4000, 1000, 4.0));
//! # Ok::<(), stormguard_sim::error::InvalidParam>(())
//! ```

pub mod bins;
pub mod budgets;
pub mod error;
pub mod progress;
pub mod queue;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod slab;
pub mod strategy;
pub mod time;
pub mod vclock;

pub use error::InvalidParam;
pub use strategy::Strategy;
