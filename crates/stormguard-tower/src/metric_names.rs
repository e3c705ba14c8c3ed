//! Every metric the layers emit, named in one place.
//!
//! The names follow Prometheus conventions (`_total` for counters, base units in the name).
//! Layers emit them through the [`metrics`](https://docs.rs/metrics) facade when the
//! `metrics` feature is on, so any recorder (the Prometheus exporter, a test recorder) sees
//! them; with the feature off nothing is emitted and nothing is compiled in.
//!
//! | name | kind | labels | counts |
//! | --- | --- | --- | --- |
//! | [`REQUESTS`] | counter | `outcome` | logical requests, by how they ended ([`StopReason::label`](stormguard::retry::StopReason::label)) |
//! | [`ATTEMPTS`] | counter | — | attempts sent, the first included |
//! | [`RETRIES`] | counter | `reason` | retries sent, by [`RetryReason::label`](stormguard::retry::RetryReason::label) |
//! | [`BUDGET_REFUSALS`] | counter | — | retries the budget refused |
//! | [`DEADLINE_DROPS`] | counter | `side` | requests not run or not sent because their deadline could not be met (`server` or `client`) |
//! | [`DEADLINE_HEADER_ERRORS`] | counter | `header` | malformed incoming deadline headers |
//! | [`ATTEMPT_DURATION`] | histogram | — | seconds per attempt |
//! | [`RETRY_DELAY`] | histogram | — | seconds waited before each retry |

/// Counter of logical requests, labelled `outcome`.
pub const REQUESTS: &str = "stormguard_requests_total";
/// Counter of attempts sent, the first included.
pub const ATTEMPTS: &str = "stormguard_attempts_total";
/// Counter of retries sent, labelled `reason`.
pub const RETRIES: &str = "stormguard_retries_total";
/// Counter of retries refused by the retry budget.
pub const BUDGET_REFUSALS: &str = "stormguard_budget_refusals_total";
/// Counter of requests dropped for their deadline, labelled `side` (`server` or `client`).
pub const DEADLINE_DROPS: &str = "stormguard_deadline_drops_total";
/// Counter of malformed incoming deadline headers, labelled `header`.
pub const DEADLINE_HEADER_ERRORS: &str = "stormguard_deadline_header_errors_total";
/// Histogram of attempt durations in seconds.
pub const ATTEMPT_DURATION: &str = "stormguard_attempt_duration_seconds";
/// Histogram of retry delays in seconds.
pub const RETRY_DELAY: &str = "stormguard_retry_delay_seconds";
