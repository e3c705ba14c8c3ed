//! What either collector read for one service in one round, and the series made of it.
//!
//! Both collectors end with the same numbers — per downstream endpoint the rates of calls,
//! failed calls, attempts and attempt results by status code, and the P99; per service the
//! busiest instance's CPU and the largest one's memory and threads — and one function turns
//! them into the [`Round`] the rules read, so the scrape path and the PromQL path cannot
//! define a series two ways.
//!
//! Ratios are clamped to 0..=1 (two counters read a moment apart can disagree a little),
//! and the P99 is only a reading when attempts ended in the round: an exporter's summary
//! keeps answering (0 once its window is empty) with no traffic behind it, and a rule must
//! not clear on that.

use std::collections::BTreeMap;

use stormguard::rules::{Observations, Series};

use super::history::{EndpointTraffic, Round};

/// The rates of one downstream endpoint, summed over the service's instances (per second).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct EndpointRates {
    /// Logical requests that ended.
    pub(crate) requests: f64,
    /// Those that did not end `succeeded`.
    pub(crate) failed: f64,
    /// Attempts sent.
    pub(crate) attempts: f64,
    /// Attempts that ended, by their `code` label (an HTTP status, or `none`).
    pub(crate) results: BTreeMap<String, f64>,
    /// The 99th percentile of the attempt duration, in seconds.
    pub(crate) p99: Option<f64>,
}

/// One service's reading in one round.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Reading {
    pub(crate) endpoints: BTreeMap<String, EndpointRates>,
    /// CPU used by the busiest instance, a fraction of the cores it may use.
    pub(crate) cpu: Option<f64>,
    /// Resident bytes of the largest instance.
    pub(crate) memory: Option<f64>,
    /// Threads of the instance with the most.
    pub(crate) threads: Option<f64>,
}

/// `a` and `b` combined by `f`, or whichever is there.
pub(crate) fn combine(a: Option<f64>, b: Option<f64>, f: fn(f64, f64) -> f64) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(f(a, b)),
        (a, b) => a.or(b),
    }
}

impl Reading {
    /// The round the rules read: error ratios where there were calls (by code and by class
    /// where attempts ended), P99 where measured and attempts ended, CPU and memory where exposed;
    /// ratios clamped to 0..=1.
    pub(crate) fn into_round(
        self,
        at_ms: i64,
        window_seconds: f64,
        instances: usize,
        failures: Vec<String>,
        dropped_endpoints: usize,
    ) -> Round {
        let ratio = |part: f64, whole: f64| (part / whole).clamp(0.0, 1.0);
        let mut observations = Observations::new();
        let mut endpoints = BTreeMap::new();
        for (endpoint, rates) in &self.endpoints {
            let mut traffic = EndpointTraffic {
                requests_per_second: rates.requests,
                attempts_per_request: None,
            };
            if rates.requests > 0.0 {
                observations.set_endpoint(
                    endpoint,
                    Series::ErrorRatio,
                    ratio(rates.failed, rates.requests),
                );
                traffic.attempts_per_request = Some(rates.attempts / rates.requests);
            }
            let ended: f64 = rates.results.values().sum();
            if ended > 0.0 {
                let mut classes = [0.0; 6];
                for (code, count) in &rates.results {
                    let Ok(number) = code.parse::<u16>() else {
                        continue;
                    };
                    observations.set_endpoint(
                        endpoint,
                        Series::ErrorRatioCode(number),
                        ratio(*count, ended),
                    );
                    if let Some(class) = classes.get_mut(usize::from(number / 100)) {
                        *class += count;
                    }
                }
                for (class, count) in classes.iter().enumerate().skip(1) {
                    observations.set_endpoint(
                        endpoint,
                        Series::ErrorRatioClass(class as u8),
                        ratio(*count, ended),
                    );
                }
                if let Some(p99) = rates.p99 {
                    observations.set_endpoint(endpoint, Series::P99, p99);
                }
            }
            endpoints.insert(endpoint.clone(), traffic);
        }
        if let Some(cpu) = self.cpu {
            observations.set_service(Series::Cpu, cpu.clamp(0.0, 1.0));
        }
        if let Some(memory) = self.memory {
            observations.set_service(Series::Memory, memory);
        }
        Round {
            at_ms,
            window_seconds,
            observations,
            endpoints,
            threads: self.threads,
            instances,
            failures,
            dropped_endpoints,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ratios_by_code_and_class_share_one_denominator() {
        let mut reading = Reading::default();
        reading.endpoints.insert(
            "img".to_owned(),
            EndpointRates {
                requests: 10.0,
                failed: 4.0,
                attempts: 25.0,
                results: [("200", 15.0), ("504", 8.0), ("none", 2.0)]
                    .map(|(c, n)| (c.to_owned(), n))
                    .into(),
                p99: Some(0.3),
            },
        );
        reading.cpu = Some(0.5);
        let round = reading.into_round(1, 1.0, 1, Vec::new(), 0);
        let seen = &round.observations;
        assert_eq!(seen.get(Some("img"), Series::ErrorRatio), Some(0.4));
        assert_eq!(
            seen.get(Some("img"), Series::ErrorRatioCode(504)),
            Some(8.0 / 25.0)
        );
        assert_eq!(
            seen.get(Some("img"), Series::ErrorRatioClass(5)),
            Some(8.0 / 25.0)
        );
        assert_eq!(seen.get(Some("img"), Series::ErrorRatioClass(4)), Some(0.0));
        assert_eq!(seen.get(None, Series::Cpu), Some(0.5));
        assert_eq!(round.attempts_per_request("img"), Some(2.5));
        assert_eq!(round.p99_seconds("img"), Some(0.3));
    }

    #[test]
    fn ratios_of_counters_read_apart_stay_within_one() {
        // PromQL evaluates each query on its own: failed calls may exceed calls a little.
        let mut reading = Reading::default();
        reading.endpoints.insert(
            "img".to_owned(),
            EndpointRates {
                requests: 10.0,
                failed: 11.0,
                results: [("504", 5.0), ("200", -1.0)]
                    .map(|(c, n)| (c.to_owned(), n))
                    .into(),
                ..EndpointRates::default()
            },
        );
        reading.cpu = Some(1.2);
        let round = reading.into_round(1, 1.0, 1, Vec::new(), 0);
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
        assert_eq!(seen.get(None, Series::Cpu), Some(1.0));
    }
}
