//! What a rule looks at: one snapshot of named series values, filled by a collector.
//!
//! The engine does not scrape, query or average anything itself: a collector (the center's
//! scrape of each instance's `/metrics`, or PromQL against a Prometheus server) reduces what
//! it read to one number per series and hands the engine an [`Observations`]. Keeping that
//! reduction outside makes the decisions a pure function of the numbers, testable with a
//! hand-written snapshot, and lets two collectors be compared on the same rule.

use std::collections::BTreeMap;
use std::fmt;

/// A named series a condition reads.
///
/// Per downstream endpoint (the policy file's endpoint key): the error ratios and the P99
/// latency. Per service (the worst of its instances, as the collector reduces them): CPU and
/// memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Series {
    /// Failed calls / all calls to the endpoint, 0..=1.
    ErrorRatio,
    /// Attempts answered with a status of this class (`5` for 5xx) / attempts that ended,
    /// 0..=1. Per attempt, not per call: what the downstream answers, retries included.
    ErrorRatioClass(u8),
    /// Attempts answered with this status code / attempts that ended, 0..=1.
    ErrorRatioCode(u16),
    /// The 99th percentile of the endpoint's attempt latency (each attempt, retries
    /// included, not the whole call), in seconds.
    P99,
    /// CPU used by the busiest instance, as a fraction of what it may use, 0..=1.
    Cpu,
    /// Resident memory of the largest instance, in bytes.
    Memory,
}

impl Series {
    /// Whether the series is measured per downstream endpoint (else per service).
    pub const fn per_endpoint(self) -> bool {
        matches!(
            self,
            Series::ErrorRatio
                | Series::ErrorRatioClass(_)
                | Series::ErrorRatioCode(_)
                | Series::P99
        )
    }
}

impl fmt::Display for Series {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Series::ErrorRatio => f.write_str("error_ratio"),
            Series::ErrorRatioClass(class) => write!(f, "error_ratio{{class={class}xx}}"),
            Series::ErrorRatioCode(code) => write!(f, "error_ratio{{code={code}}}"),
            Series::P99 => f.write_str("p99_seconds"),
            Series::Cpu => f.write_str("cpu"),
            Series::Memory => f.write_str("memory_bytes"),
        }
    }
}

/// One snapshot of series values for one service: what a collector read at one instant.
///
/// A series the collector could not read is simply absent; a condition on an absent series
/// neither holds nor clears (see [`Condition`](super::Condition)). Values that are not
/// finite are not stored.
///
/// ```
/// use stormguard::rules::{Observations, Series};
///
/// let mut seen = Observations::new();
/// seen.set_endpoint("GET /img/*", Series::ErrorRatioCode(504), 0.4)
///     .set_service(Series::Cpu, 0.95);
/// assert_eq!(seen.get(Some("GET /img/*"), Series::ErrorRatioCode(504)), Some(0.4));
/// assert_eq!(seen.get(None, Series::Cpu), Some(0.95));
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observations {
    values: BTreeMap<(Option<String>, Series), f64>,
}

impl Observations {
    /// No values.
    pub fn new() -> Self {
        Observations::default()
    }

    /// Sets a per-endpoint series of `endpoint`.
    pub fn set_endpoint(&mut self, endpoint: &str, series: Series, value: f64) -> &mut Self {
        if value.is_finite() {
            self.values
                .insert((Some(endpoint.to_owned()), series), value);
        }
        self
    }

    /// Sets a per-service series (CPU, memory).
    pub fn set_service(&mut self, series: Series, value: f64) -> &mut Self {
        if value.is_finite() {
            self.values.insert((None, series), value);
        }
        self
    }

    /// The value of `series`: of `endpoint` for a per-endpoint series, of the service (pass
    /// `None`) otherwise.
    pub fn get(&self, endpoint: Option<&str>, series: Series) -> Option<f64> {
        let key = (endpoint.map(str::to_owned), series);
        self.values.get(&key).copied()
    }

    /// The value a rule on `endpoint` reads for `series`: the endpoint's for a per-endpoint
    /// series, the service's for the others.
    pub fn for_rule(&self, endpoint: &str, series: Series) -> Option<f64> {
        if series.per_endpoint() {
            self.get(Some(endpoint), series)
        } else {
            self.get(None, series)
        }
    }
}
