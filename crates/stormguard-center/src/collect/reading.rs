//! What either collector read for one service in one round, and the series made of it.
//!
//! Both collectors end with the same numbers — per downstream endpoint the rates of calls,
//! failed calls, attempts and attempt results by status code, and the P99; per service the
//! busiest instance's CPU and the largest one's memory and threads — and one function turns
//! them into the [`Round`] the rules read, so the scrape path and the PromQL path cannot
//! define a series two ways.

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
    /// CPU-seconds per second of the busiest instance.
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
    /// where attempts ended), P99 where measured, CPU and memory where exposed.
    pub(crate) fn into_round(
        self,
        at_ms: i64,
        window_seconds: f64,
        instances: usize,
        failures: Vec<String>,
    ) -> Round {
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
                    rates.failed / rates.requests,
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
                        count / ended,
                    );
                    if let Some(class) = classes.get_mut(usize::from(number / 100)) {
                        *class += count;
                    }
                }
                for (class, count) in classes.iter().enumerate().skip(1) {
                    observations.set_endpoint(
                        endpoint,
                        Series::ErrorRatioClass(class as u8),
                        count / ended,
                    );
                }
            }
            if let Some(p99) = rates.p99 {
                observations.set_endpoint(endpoint, Series::P99, p99);
            }
            endpoints.insert(endpoint.clone(), traffic);
        }
        if let Some(cpu) = self.cpu {
            observations.set_service(Series::Cpu, cpu);
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
        }
    }
}

/// The `q` quantile of a histogram given as cumulative `(le, count)` buckets, the way
/// Prometheus's `histogram_quantile` computes it: linear within the bucket that holds the
/// rank, the highest finite bound when the rank falls in `+Inf`; `None` without a `+Inf`
/// bucket or without observations.
pub(crate) fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let mut buckets: Vec<(f64, f64)> = buckets
        .iter()
        .copied()
        .filter(|(le, count)| !le.is_nan() && count.is_finite())
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let &(last_le, total) = buckets.last()?;
    if last_le != f64::INFINITY || total <= 0.0 || buckets.len() < 2 {
        return None;
    }
    // Counts are cumulative; a scrape racing an observation can make them dip: keep them
    // monotonic as Prometheus does.
    let mut highest = 0.0f64;
    for bucket in &mut buckets {
        highest = highest.max(bucket.1);
        bucket.1 = highest;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let index = buckets.iter().position(|&(_, count)| count >= rank)?;
    if index == buckets.len() - 1 {
        return Some(buckets[buckets.len() - 2].0);
    }
    let (upper, count) = buckets[index];
    let (lower, below) = if index == 0 {
        (if upper > 0.0 { 0.0 } else { upper }, 0.0)
    } else {
        buckets[index - 1]
    };
    if count == below {
        return Some(upper);
    }
    Some(lower + (upper - lower) * (rank - below) / (count - below))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_quantile_interpolates_within_its_bucket() {
        let buckets = [
            (0.1, 50.0),
            (0.5, 90.0),
            (1.0, 100.0),
            (f64::INFINITY, 100.0),
        ];
        let p99 = histogram_quantile(0.99, &buckets).unwrap();
        assert!((p99 - 0.95).abs() < 1e-9, "{p99}");
        let p50 = histogram_quantile(0.5, &buckets).unwrap();
        assert!((p50 - 0.1).abs() < 1e-9, "{p50}");
        // In the +Inf bucket: the highest finite bound.
        let slow = [(0.1, 1.0), (f64::INFINITY, 100.0)];
        assert_eq!(histogram_quantile(0.99, &slow), Some(0.1));
        assert_eq!(
            histogram_quantile(0.99, &[(0.1, 0.0), (f64::INFINITY, 0.0)]),
            None
        );
        assert_eq!(histogram_quantile(0.99, &[(0.1, 3.0)]), None);
    }

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
        let round = reading.into_round(1, 1.0, 1, Vec::new());
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
}
