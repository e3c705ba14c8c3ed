//! JSON log lines on stderr: the library's per-attempt events (feature `json-log` of
//! stormguard-tower) and the proxy's own, one JSON object per line, for a log shipper.

/// Installs a JSON subscriber writing to stderr, filtered by `filter` (the `RUST_LOG` syntax,
/// such as `info` or `stormguard=debug`). Returns `false` when a subscriber was already
/// installed (the program's own stays) or the filter does not parse.
pub fn init_json_logs(filter: &str) -> bool {
    let Ok(filter) = tracing_subscriber::EnvFilter::try_new(filter) else {
        return false;
    };
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init()
        .is_ok()
}
