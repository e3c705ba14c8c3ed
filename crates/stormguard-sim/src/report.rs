//! Serialisation helpers shared by every scenario's report.
//!
//! Every report row serialises to one flat JSON object with the keys `scenario`, `strategy`
//! and `parameters` first, then the row's figures. Durations in parameters are seconds as
//! numbers (`"base_s"`-style names are avoided so that `parameters` mirrors the command-line
//! flags one to one, and the unit is stated here once: **every duration in JSON is in
//! seconds**).

/// Serialises a [`Duration`](std::time::Duration) as a number of seconds.
pub mod seconds {
    use std::time::Duration;

    use serde::Serializer;

    /// Writes `d` as seconds (an `f64`).
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// Serialises an `Option<Duration>` as seconds or `null`.
pub mod seconds_opt {
    use std::time::Duration;

    use serde::Serializer;

    /// Writes `d` as seconds (an `f64`) or `null`.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

/// Rounds `x` to `digits` decimals, so JSON figures do not carry float noise
/// (`0.30000000000000004`) and stay byte-identical across platforms' formatting.
pub fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}
