//! Every metric this crate emits, named in one place.
//!
//! The names follow Prometheus conventions (`_total` for counters, base units in the name).
//! The client stack and the layers emit them through the [`metrics`](https://docs.rs/metrics)
//! facade when the `metrics` feature is on, so any recorder (the Prometheus exporter, a test
//! recorder) sees them; with the feature off nothing is emitted and nothing is compiled in.
//! Every client metric carries the `endpoint` label: the policy endpoint a call was routed to.
//!
//! | name | kind | labels | counts |
//! | --- | --- | --- | --- |
//! | [`REQUESTS`] | counter | `endpoint`, `outcome` | logical requests, by how they ended ([`StopReason::label`](stormguard::retry::StopReason::label)) |
//! | [`ATTEMPTS`] | counter | `endpoint` | attempts sent, the first included |
//! | [`RESPONSES`] | counter | `endpoint`, `code` | attempts that ended, by the HTTP status answered (`504`), or `none` when no response came (timeout, refused connection, …) |
//! | [`RETRIES`] | counter | `endpoint`, `reason` | retries sent, by [`RetryReason::label`](stormguard::retry::RetryReason::label) |
//! | [`REFUSALS`] | counter | `endpoint`, `by` | calls or retries not sent: `budget`, `circuit_open`, `throttled`, `deadline_too_close` |
//! | [`BUDGET_REFUSALS`] | counter | `endpoint` | retries and hedges the retry budget refused |
//! | [`BREAKER_STATE`] | gauge | `endpoint` | 0 closed, 1 open, 2 half-open, 3 isolated |
//! | [`BREAKER_TRANSITIONS`] | counter | `endpoint`, `to` | breaker state changes, by the state entered |
//! | [`HEDGES`] | counter | `endpoint`, `event` | hedged attempts `sent`, `won` and `cancelled` |
//! | [`FALLBACKS`] | counter | `endpoint`, `reason` | calls answered from the fallback |
//! | [`DEADLINE_DROPS`] | counter | `side` | requests not run or not sent because their deadline could not be met (`server` or `client`) |
//! | [`DEADLINE_HEADER_ERRORS`] | counter | `header` | malformed incoming deadline headers |
//! | [`ATTEMPT_DURATION`] | histogram | `endpoint` | seconds per attempt |
//! | [`RETRY_DELAY`] | histogram | `endpoint` | seconds waited before each retry |
//! | [`CONCURRENCY_LIMIT`] | gauge | | the server limit layer's current limit |
//! | [`CONCURRENCY_IN_FLIGHT`] | gauge | | requests the server limit layer has in flight |
//! | [`LIMIT_QUEUE_DELAY`] | histogram | | seconds admitted requests waited in the limit layer's queue |
//! | [`LIMIT_SHED`] | counter | `reason` | requests the limit layer shed: `deadline`, `queue_full`, `queue_timeout` |
//! | [`CPU_ALLOWANCE`] | gauge | | the cores this process may use (set by `describe_metrics`) |
//!
//! [`ATTEMPT_DURATION`] is a histogram for the `metrics` facade; the Prometheus exporter
//! renders a histogram as a summary unless it is given buckets, and a summary's quantiles
//! are over the exporter's own rolling window (about a minute), 0 when it is empty, and
//! cannot be summed over instances. Give it [`ATTEMPT_DURATION_BUCKETS`]
//! (`PrometheusBuilder::set_buckets_for_metric`) so that the policy center and Prometheus
//! read real bucket counts.

/// Counter of logical requests, labelled `endpoint` and `outcome`.
pub const REQUESTS: &str = "stormguard_requests_total";
/// Counter of attempts sent, the first included.
pub const ATTEMPTS: &str = "stormguard_attempts_total";
/// Counter of attempts that ended, labelled `code`: the HTTP status of the response
/// (`"504"`), or `"none"` when none came. What the policy center's error ratios by status
/// code and class are made of.
pub const RESPONSES: &str = "stormguard_responses_total";
/// Counter of retries sent, labelled `reason`.
pub const RETRIES: &str = "stormguard_retries_total";
/// Counter of calls and retries not sent, labelled `by`.
pub const REFUSALS: &str = "stormguard_refusals_total";
/// Counter of retries and hedges refused by the retry budget.
pub const BUDGET_REFUSALS: &str = "stormguard_budget_refusals_total";
/// Gauge of the breaker's state: 0 closed, 1 open, 2 half-open, 3 isolated.
pub const BREAKER_STATE: &str = "stormguard_breaker_state";
/// Counter of breaker state changes, labelled `to`.
pub const BREAKER_TRANSITIONS: &str = "stormguard_breaker_transitions_total";
/// Counter of hedged attempts, labelled `event` (`sent`, `won`, `cancelled`).
pub const HEDGES: &str = "stormguard_hedges_total";
/// Counter of calls answered from the fallback, labelled `reason`.
pub const FALLBACKS: &str = "stormguard_fallbacks_total";
/// Counter of requests dropped for their deadline, labelled `side` (`server` or `client`).
pub const DEADLINE_DROPS: &str = "stormguard_deadline_drops_total";
/// Counter of malformed incoming deadline headers, labelled `header`.
pub const DEADLINE_HEADER_ERRORS: &str = "stormguard_deadline_header_errors_total";
/// Histogram of attempt durations in seconds.
pub const ATTEMPT_DURATION: &str = "stormguard_attempt_duration_seconds";
/// Bucket bounds, in seconds, recommended for [`ATTEMPT_DURATION`]: 1 ms to 10 s.
pub const ATTEMPT_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Gauge of the CPU cores this process may use (`std::thread::available_parallelism`,
/// which follows the cgroup quota of a container): what the policy center divides
/// `process_cpu_seconds_total`'s rate by to make its `cpu` series a fraction, 0..=1.
pub const CPU_ALLOWANCE: &str = "process_cpu_allowance_cores";
/// Histogram of retry delays in seconds.
pub const RETRY_DELAY: &str = "stormguard_retry_delay_seconds";
/// Gauge of the server's adaptive concurrency limit.
pub const CONCURRENCY_LIMIT: &str = "stormguard_concurrency_limit";
/// Gauge of the requests the limit layer has in flight.
pub const CONCURRENCY_IN_FLIGHT: &str = "stormguard_concurrency_in_flight";
/// Histogram of the seconds admitted requests waited in the limit layer's queue.
pub const LIMIT_QUEUE_DELAY: &str = "stormguard_limit_queue_delay_seconds";
/// Counter of requests the limit layer shed, labelled `reason` (`deadline`, `queue_full`, `queue_timeout`).
pub const LIMIT_SHED: &str = "stormguard_shed_total";
