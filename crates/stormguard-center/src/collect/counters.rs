//! The scrape path's arithmetic: one instance's exposition reduced to its counters, the
//! increase between two scrapes, and the increases of a service's instances summed into a
//! [`Reading`].
//!
//! A counter that went down between two scrapes belongs to a restarted process: its whole
//! value is the increase (Prometheus's `rate` reads it the same way). An instance's first
//! scrape is only a baseline: its counters hold everything since it started, which is not
//! this round's traffic.

use std::collections::BTreeMap;

use stormguard_tower::metric_names::{ATTEMPT_DURATION, ATTEMPTS, REQUESTS, RESPONSES};

use super::exposition::Sample;
use super::reading::{Reading, combine, histogram_quantile};

/// The process collector's names (Prometheus client conventions), read where exposed.
pub(crate) const PROCESS_CPU: &str = "process_cpu_seconds_total";
/// Resident memory, bytes.
pub(crate) const PROCESS_MEMORY: &str = "process_resident_memory_bytes";
/// OS threads.
pub(crate) const PROCESS_THREADS: &str = "process_threads";

/// What one instance's exposition says, reduced to what the series are made of.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Counters {
    endpoints: BTreeMap<String, EndpointCounters>,
    cpu_seconds: Option<f64>,
    memory_bytes: Option<f64>,
    threads: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct EndpointCounters {
    requests: f64,
    failed: f64,
    attempts: f64,
    results: BTreeMap<String, f64>,
    /// Cumulative attempt-duration buckets, by their `le` as written.
    buckets: BTreeMap<String, f64>,
    /// The exporter's own P99 when it renders the histogram as a summary.
    summary_p99: Option<f64>,
}

impl Counters {
    /// The counters in `samples`.
    pub(crate) fn read(samples: &[Sample]) -> Counters {
        let mut counters = Counters::default();
        let bucket = format!("{ATTEMPT_DURATION}_bucket");
        for sample in samples {
            let name = sample.name.as_str();
            if name == PROCESS_CPU {
                counters.cpu_seconds = Some(sample.value);
            } else if name == PROCESS_MEMORY {
                counters.memory_bytes = Some(sample.value);
            } else if name == PROCESS_THREADS {
                counters.threads = Some(sample.value);
            }
            let tracked = [REQUESTS, ATTEMPTS, RESPONSES, ATTEMPT_DURATION];
            if !(tracked.contains(&name) || name == bucket) || !sample.value.is_finite() {
                continue;
            }
            let endpoint = counters
                .endpoints
                .entry(sample.label("endpoint").to_owned())
                .or_default();
            match name {
                REQUESTS => {
                    endpoint.requests += sample.value;
                    if sample.label("outcome") != "succeeded" {
                        endpoint.failed += sample.value;
                    }
                }
                ATTEMPTS => endpoint.attempts += sample.value,
                RESPONSES => {
                    *endpoint
                        .results
                        .entry(sample.label("code").to_owned())
                        .or_default() += sample.value;
                }
                ATTEMPT_DURATION => {
                    if sample.label("quantile") == "0.99" {
                        endpoint.summary_p99 = Some(sample.value);
                    }
                }
                _ => {
                    endpoint
                        .buckets
                        .insert(sample.label("le").to_owned(), sample.value);
                }
            }
        }
        counters
    }

    /// The increase from `before` to `self` (gauges: `self`'s values).
    pub(crate) fn since(&self, before: &Counters) -> Counters {
        let endpoints = self
            .endpoints
            .iter()
            .map(|(name, now)| {
                let then = before.endpoints.get(name).cloned().unwrap_or_default();
                let delta = EndpointCounters {
                    requests: increase(now.requests, then.requests),
                    failed: increase(now.failed, then.failed),
                    attempts: increase(now.attempts, then.attempts),
                    results: increases(&now.results, &then.results),
                    buckets: increases(&now.buckets, &then.buckets),
                    summary_p99: now.summary_p99,
                };
                (name.clone(), delta)
            })
            .collect();
        Counters {
            endpoints,
            cpu_seconds: self
                .cpu_seconds
                .map(|now| increase(now, before.cpu_seconds.unwrap_or(0.0))),
            memory_bytes: self.memory_bytes,
            threads: self.threads,
        }
    }
}

fn increase(now: f64, then: f64) -> f64 {
    if now >= then { now - then } else { now }
}

fn increases(now: &BTreeMap<String, f64>, then: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    now.iter()
        .map(|(key, &value)| {
            (
                key.clone(),
                increase(value, then.get(key).copied().unwrap_or(0.0)),
            )
        })
        .collect()
}

/// The increases of a service's instances, each over its own seconds since its previous
/// scrape, summed (rates) and maxed (CPU, memory, threads) into one reading.
pub(crate) fn reading(increases: &[(Counters, f64)]) -> Reading {
    let mut reading = Reading::default();
    let mut buckets: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for (delta, seconds) in increases {
        let seconds = seconds.max(f64::MIN_POSITIVE);
        for (name, counters) in &delta.endpoints {
            let rates = reading.endpoints.entry(name.clone()).or_default();
            rates.requests += counters.requests / seconds;
            rates.failed += counters.failed / seconds;
            rates.attempts += counters.attempts / seconds;
            for (code, count) in &counters.results {
                *rates.results.entry(code.clone()).or_default() += count / seconds;
            }
            let summed = buckets.entry(name.clone()).or_default();
            for (le, count) in &counters.buckets {
                *summed.entry(le.clone()).or_default() += count / seconds;
            }
            rates.p99 = combine(rates.p99, counters.summary_p99, f64::max);
        }
        reading.cpu = combine(
            reading.cpu,
            delta.cpu_seconds.map(|c| c / seconds),
            f64::max,
        );
        reading.memory = combine(reading.memory, delta.memory_bytes, f64::max);
        reading.threads = combine(reading.threads, delta.threads, f64::max);
    }
    for (name, summed) in buckets {
        let parsed: Vec<(f64, f64)> = summed
            .iter()
            .filter_map(|(le, count)| Some((parse_le(le)?, *count)))
            .collect();
        if let (Some(p99), Some(rates)) = (
            histogram_quantile(0.99, &parsed),
            reading.endpoints.get_mut(&name),
        ) {
            rates.p99 = Some(p99);
        }
    }
    reading
}

fn parse_le(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        _ => text.parse().ok().filter(|v: &f64| v.is_finite()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use stormguard::rules::Series;

    use super::*;
    use crate::collect::exposition::parse;

    fn counters(text: &str) -> Counters {
        Counters::read(&parse(text).unwrap())
    }

    const BEFORE: &str = r#"
stormguard_requests_total{endpoint="img",outcome="succeeded"} 10
stormguard_attempts_total{endpoint="img"} 10
stormguard_responses_total{endpoint="img",code="200"} 10
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="0.1"} 10
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="1"} 10
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="+Inf"} 10
process_cpu_seconds_total 5
process_resident_memory_bytes 1000
"#;

    const AFTER: &str = r#"
stormguard_requests_total{endpoint="img",outcome="succeeded"} 10
stormguard_requests_total{endpoint="img",outcome="attempts_exhausted"} 10
stormguard_attempts_total{endpoint="img"} 40
stormguard_responses_total{endpoint="img",code="200"} 10
stormguard_responses_total{endpoint="img",code="504"} 30
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="0.1"} 10
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="1"} 40
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="+Inf"} 40
process_cpu_seconds_total 6
process_resident_memory_bytes 2000
"#;

    #[test]
    fn increases_between_scrapes_make_the_series() {
        let delta = counters(AFTER).since(&counters(BEFORE));
        let round = reading(&[(delta, 2.0)]).into_round(0, 2.0, 1, Vec::new());
        let seen = &round.observations;
        assert_eq!(seen.get(Some("img"), Series::ErrorRatio), Some(1.0));
        assert_eq!(
            seen.get(Some("img"), Series::ErrorRatioCode(504)),
            Some(1.0)
        );
        assert_eq!(
            seen.get(Some("img"), Series::ErrorRatioCode(200)),
            Some(0.0)
        );
        assert_eq!(round.attempts_per_request("img"), Some(3.0));
        assert_eq!(round.endpoints["img"].requests_per_second, 5.0);
        let p99 = seen.get(Some("img"), Series::P99).unwrap();
        assert!(p99 > 0.1 && p99 <= 1.0, "{p99}");
        assert_eq!(seen.get(None, Series::Cpu), Some(0.5));
        assert_eq!(seen.get(None, Series::Memory), Some(2000.0));
    }

    #[test]
    fn a_restarted_instance_counts_from_zero() {
        let delta = counters(BEFORE).since(&counters(AFTER));
        let round = reading(&[(delta, 1.0)]).into_round(0, 1.0, 1, Vec::new());
        assert_eq!(round.error_ratio("img"), Some(0.0));
        assert_eq!(round.endpoints["img"].requests_per_second, 10.0);
    }

    #[test]
    fn instances_are_summed_and_their_gauges_maxed() {
        let one = counters(AFTER).since(&counters(BEFORE));
        // Ten good calls since an empty page.
        let two = counters(BEFORE).since(&Counters::default());
        let round = reading(&[(one, 1.0), (two, 1.0)]).into_round(0, 1.0, 2, Vec::new());
        assert_eq!(round.error_ratio("img"), Some(0.5));
        assert_eq!(round.observations.get(None, Series::Memory), Some(2000.0));
    }
}
