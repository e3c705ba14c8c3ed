//! The scrape path's arithmetic: one instance's exposition reduced to its counters, the
//! increase between two scrapes, and the increases of a service's instances summed into a
//! [`Reading`].
//!
//! Increases are taken series by series (each counter with its own labels), then summed:
//! summing first would hide a restart behind the growth of the other series. A restarted
//! process is recognised by any counter series going down, or by a new
//! `process_start_time_seconds`; its scrape is then a new baseline, not an increase (its
//! counters hold everything since it started, and the restart's moment is unknown). An
//! instance's first scrape is a baseline for the same reason.
//!
//! An exposition may name any number of `endpoint` labels; at most [`MAX_ENDPOINTS`] are
//! kept per instance (the first in the page's order), and the others are counted in the
//! round ([`Round::dropped_endpoints`](super::Round::dropped_endpoints)).

use std::collections::{BTreeMap, BTreeSet};

use stormguard::advise::prometheus::Histogram;
use stormguard::advise::prometheus::exposition::{Sample, parse_value};
use stormguard_tower::metric_names::{
    ATTEMPT_DURATION, ATTEMPTS, CPU_ALLOWANCE, REQUESTS, RESPONSES,
};

use super::reading::{Reading, combine};

/// The process collector's names (Prometheus client conventions), read where exposed.
pub(crate) const PROCESS_CPU: &str = "process_cpu_seconds_total";
/// Resident memory, bytes.
pub(crate) const PROCESS_MEMORY: &str = "process_resident_memory_bytes";
/// OS threads.
pub(crate) const PROCESS_THREADS: &str = "process_threads";
/// When the process started, seconds since the Unix epoch: a new value is a restart.
pub(crate) const PROCESS_START: &str = "process_start_time_seconds";

/// The most downstream endpoints read from one instance's exposition in one round.
pub const MAX_ENDPOINTS: usize = 256;

/// One counter series: its name and labels.
type SeriesKey = (String, BTreeMap<String, String>);

/// What one instance's exposition says, reduced to what the series are made of.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Counters {
    /// Every counter series the series are made of (attempt-duration buckets included), by
    /// name and labels.
    series: BTreeMap<SeriesKey, f64>,
    /// Each endpoint's P99 when the exporter renders a summary: the largest of its series.
    summary_p99: BTreeMap<String, f64>,
    cpu_seconds: Option<f64>,
    cpu_allowance: Option<f64>,
    memory_bytes: Option<f64>,
    threads: Option<f64>,
    start_time: Option<f64>,
    /// Endpoints past [`MAX_ENDPOINTS`], not read.
    dropped_endpoints: usize,
}

/// What one instance did between two scrapes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Increase {
    endpoints: BTreeMap<String, EndpointCounters>,
    cpu_seconds: Option<f64>,
    cpu_allowance: Option<f64>,
    memory_bytes: Option<f64>,
    threads: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct EndpointCounters {
    requests: f64,
    failed: f64,
    attempts: f64,
    results: BTreeMap<String, f64>,
    /// Cumulative attempt-duration buckets by bound, summed over the endpoint's series.
    buckets: Vec<(f64, f64)>,
    summary_p99: Option<f64>,
}

impl Counters {
    /// The counters in `samples`.
    pub(crate) fn read(samples: &[Sample]) -> Counters {
        let mut counters = Counters::default();
        let bucket = format!("{ATTEMPT_DURATION}_bucket");
        let mut kept = BTreeSet::new();
        let mut dropped = BTreeSet::new();
        for sample in samples {
            let name = sample.name.as_str();
            let gauge = match name {
                PROCESS_CPU => Some(&mut counters.cpu_seconds),
                CPU_ALLOWANCE => Some(&mut counters.cpu_allowance),
                PROCESS_MEMORY => Some(&mut counters.memory_bytes),
                PROCESS_THREADS => Some(&mut counters.threads),
                PROCESS_START => Some(&mut counters.start_time),
                _ => None,
            };
            if let Some(gauge) = gauge.filter(|_| sample.value.is_finite()) {
                *gauge = Some(sample.value);
            }
            let tracked = [REQUESTS, ATTEMPTS, RESPONSES, ATTEMPT_DURATION];
            if !(tracked.contains(&name) || name == bucket) || !sample.value.is_finite() {
                continue;
            }
            let endpoint = sample.label("endpoint");
            if !kept.contains(endpoint) {
                if kept.len() == MAX_ENDPOINTS {
                    dropped.insert(endpoint.to_owned());
                    continue;
                }
                kept.insert(endpoint.to_owned());
            }
            if name == ATTEMPT_DURATION {
                if sample.label("quantile") == "0.99" {
                    let p99 = counters
                        .summary_p99
                        .entry(endpoint.to_owned())
                        .or_insert(sample.value);
                    *p99 = p99.max(sample.value);
                }
            } else {
                counters
                    .series
                    .insert((name.to_owned(), sample.labels.clone()), sample.value);
            }
        }
        counters.dropped_endpoints = dropped.len();
        counters
    }

    /// Endpoints of the page past [`MAX_ENDPOINTS`], not read.
    pub(crate) fn dropped_endpoints(&self) -> usize {
        self.dropped_endpoints
    }

    /// What happened from `before` to `self` (gauges: `self`'s values); `None` when the
    /// process restarted in between (a counter series went down, or its start time
    /// changed): `self` is then a new baseline.
    pub(crate) fn since(&self, before: &Counters) -> Option<Increase> {
        if let (Some(now), Some(then)) = (self.start_time, before.start_time) {
            if now != then {
                return None;
            }
        }
        if let (Some(now), Some(then)) = (self.cpu_seconds, before.cpu_seconds) {
            if now < then {
                return None;
            }
        }
        let mut increase = Increase {
            cpu_seconds: self
                .cpu_seconds
                .map(|now| now - before.cpu_seconds.unwrap_or(0.0)),
            cpu_allowance: self.cpu_allowance,
            memory_bytes: self.memory_bytes,
            threads: self.threads,
            ..Increase::default()
        };
        let mut buckets: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
        for (key @ (name, labels), &now) in &self.series {
            let then = before.series.get(key).copied().unwrap_or(0.0);
            if now < then {
                return None;
            }
            let delta = now - then;
            let label = |l: &str| labels.get(l).map_or("", String::as_str);
            let endpoint = increase
                .endpoints
                .entry(label("endpoint").to_owned())
                .or_default();
            match name.as_str() {
                REQUESTS => {
                    endpoint.requests += delta;
                    if label("outcome") != "succeeded" {
                        endpoint.failed += delta;
                    }
                }
                ATTEMPTS => endpoint.attempts += delta,
                RESPONSES => {
                    *endpoint
                        .results
                        .entry(label("code").to_owned())
                        .or_default() += delta
                }
                _ => {
                    if let Some(le) = parse_value(label("le")).filter(|le| !le.is_nan()) {
                        buckets
                            .entry(label("endpoint"))
                            .or_default()
                            .push((le, delta));
                    }
                }
            }
        }
        for (name, summed) in buckets {
            if let Some(endpoint) = increase.endpoints.get_mut(name) {
                endpoint.buckets = summed;
            }
        }
        for (name, p99) in &self.summary_p99 {
            increase
                .endpoints
                .entry(name.clone())
                .or_default()
                .summary_p99 = Some(*p99);
        }
        Some(increase)
    }
}

/// The increases of a service's instances, each over its own seconds since its previous
/// scrape, summed (rates and buckets) and maxed (CPU, memory, threads, summary P99s) into
/// one reading. CPU is a fraction of what the instance may use ([`CPU_ALLOWANCE`]): absent
/// where the instance does not expose its allowance.
pub(crate) fn reading(increases: &[(Increase, f64)]) -> Reading {
    let mut reading = Reading::default();
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut summaries: BTreeMap<String, f64> = BTreeMap::new();
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
            summed.extend(counters.buckets.iter().map(|(le, c)| (*le, c / seconds)));
            if let Some(p99) = counters.summary_p99 {
                let max = summaries.entry(name.clone()).or_insert(p99);
                *max = max.max(p99);
            }
        }
        let cpu = match (delta.cpu_seconds, delta.cpu_allowance) {
            (Some(used), Some(cores)) if cores > 0.0 => Some(used / seconds / cores),
            _ => None,
        };
        reading.cpu = combine(reading.cpu, cpu, f64::max);
        reading.memory = combine(reading.memory, delta.memory_bytes, f64::max);
        reading.threads = combine(reading.threads, delta.threads, f64::max);
    }
    for (name, rates) in &mut reading.endpoints {
        // Bucket counts where there are some (they sum over instances); else the summary.
        rates.p99 = buckets
            .remove(name)
            .and_then(|b| Histogram::new(b).quantile(0.99))
            .or_else(|| summaries.get(name).copied());
    }
    reading
}

#[cfg(test)]
#[path = "counters_tests.rs"]
mod tests;
