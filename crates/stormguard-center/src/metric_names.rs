//! The names of the center's metrics, served at `/metrics` in the Prometheus text format.

/// Gauge: watchers connected to this replica (server-sent event streams open).
pub const WATCHERS: &str = "stormguard_center_watchers";
/// Counter: versions published through this replica (publishes, rollbacks, canaries).
pub const VERSIONS: &str = "stormguard_center_versions_total";
/// Histogram: seconds from a version's publish to each instance's ACK of it.
pub const PUBLISH_TO_ACK: &str = "stormguard_center_publish_to_ack_seconds";
/// Counter: NACKs (an instance could not apply a version).
pub const NACKS: &str = "stormguard_center_nacks_total";
/// Counter: requests refused by authentication or authorisation, by `reason`
/// (`missing`, `malformed`, `unknown`, `forbidden`).
pub const AUTH_FAILURES: &str = "stormguard_center_auth_failures_total";
/// Counter: compare-and-set publishes that lost to another publish (409).
pub const CONFLICTS: &str = "stormguard_center_conflicts_total";

/// Describes every metric to the installed recorder (units and help texts).
pub fn describe() {
    metrics::describe_gauge!(WATCHERS, "watchers connected to this replica");
    metrics::describe_counter!(VERSIONS, "versions published through this replica");
    metrics::describe_histogram!(
        PUBLISH_TO_ACK,
        metrics::Unit::Seconds,
        "time from a version's publish to an instance's ACK"
    );
    metrics::describe_counter!(NACKS, "versions an instance could not apply");
    metrics::describe_counter!(
        AUTH_FAILURES,
        "requests refused: no, bad or unknown token, or a role that does not allow it"
    );
    metrics::describe_counter!(
        CONFLICTS,
        "publishes refused because their base version was not the latest"
    );
}
