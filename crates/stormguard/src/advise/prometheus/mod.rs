//! Latency histograms from a Prometheus text exposition snapshot (what a `/metrics` endpoint
//! serves), and quantiles read from them exactly as Prometheus's `histogram_quantile` does.
//!
//! ```text
//! # TYPE http_request_duration_seconds histogram
//! http_request_duration_seconds_bucket{endpoint="GET /search",le="0.1"} 950
//! http_request_duration_seconds_bucket{endpoint="GET /search",le="+Inf"} 1000
//! ```
//!
//! The `METRIC_bucket` series are grouped by one label (the endpoint's) and summed over every
//! other label, like `sum by (le, endpoint)`. The quantile interpolates linearly inside the
//! bucket where the rank falls, with the first bucket starting at 0 and a rank in the `+Inf`
//! bucket answered with the highest finite bound — so the same counts give the same answer
//! from a snapshot file as from a Prometheus server, and the policy center's P99 from its
//! scrapes the same as from Prometheus.
//!
//! The text format itself is read by [`exposition`]; the JSON of Prometheus's query API by
//! [`api`].

use std::collections::BTreeMap;
use std::time::Duration;

use super::{AdviseError, Percentiles};
use exposition::ExpositionError;

pub mod api;
pub mod exposition;

/// A cumulative histogram: (upper bound in seconds, count of observations at or below it),
/// by increasing bound, the last `+Inf`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    buckets: Vec<(f64, f64)>,
}

impl Histogram {
    /// A histogram of these cumulative buckets (any order; bounds given twice are summed).
    pub fn new(buckets: impl IntoIterator<Item = (f64, f64)>) -> Histogram {
        let mut h = Histogram::default();
        for (le, count) in buckets {
            h.add(le, count);
        }
        h
    }

    fn add(&mut self, le: f64, count: f64) {
        match self.buckets.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += count,
            None => {
                self.buckets.push((le, count));
                self.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
        }
    }

    /// The `q`-quantile in seconds, as `histogram_quantile(q, …)` computes it; `None` without
    /// a `+Inf` bucket or observations.
    ///
    /// ```
    /// use stormguard::advise::prometheus::Histogram;
    /// let h = Histogram::new([(0.1, 50.0), (0.2, 100.0), (f64::INFINITY, 100.0)]);
    /// assert_eq!(h.quantile(0.5), Some(0.1));
    /// assert!((h.quantile(0.75).unwrap() - 0.15).abs() < 1e-12);
    /// ```
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let &(last, observations) = self.buckets.last()?;
        if last != f64::INFINITY
            || self.buckets.len() < 2
            || observations.is_nan()
            || observations <= 0.0
        {
            return None;
        }
        if !(0.0..=1.0).contains(&q) {
            return None;
        }
        // Counts are cumulative, but a scrape racing an observation (or rates of counters
        // read apart) can make them dip: keep them monotonic, as Prometheus does.
        let mut highest = 0.0f64;
        let buckets: Vec<(f64, f64)> = self
            .buckets
            .iter()
            .map(|&(le, count)| {
                highest = highest.max(count);
                (le, highest)
            })
            .collect();
        let rank = q * highest;
        let b = buckets.iter().position(|(_, c)| *c >= rank)?;
        if b == buckets.len() - 1 {
            return Some(buckets[b - 1].0);
        }
        let (end, mut count) = buckets[b];
        let (start, mut rank) = (0.0, rank);
        let start = if b == 0 {
            if end <= 0.0 {
                return Some(end);
            }
            start
        } else {
            let (prev_le, prev_count) = buckets[b - 1];
            count -= prev_count;
            rank -= prev_count;
            prev_le
        };
        if count <= 0.0 {
            return Some(end);
        }
        Some(start + (end - start) * (rank / count))
    }

    /// P50, P90, P99 and P999.
    pub fn percentiles(&self) -> Option<Percentiles> {
        let at = |q| {
            self.quantile(q)
                .filter(|s| s.is_finite() && (0.0..super::MAX_LATENCY_SECS).contains(s))
                .map(Duration::from_secs_f64)
        };
        Some(Percentiles {
            p50: at(0.5)?,
            p90: at(0.9)?,
            p99: at(0.99)?,
            p999: at(0.999)?,
        })
    }
}

impl super::timed::Latencies for Histogram {
    /// Cumulative buckets add bound by bound; where only one side has a bound, the other's
    /// count there is its count at its next lower bound (what it observed at or below).
    fn merge(&mut self, other: &Self) {
        let at_or_below = |h: &Histogram, le: f64| {
            h.buckets
                .iter()
                .take_while(|(bound, _)| *bound <= le)
                .last()
                .map_or(0.0, |(_, count)| *count)
        };
        let mut bounds: Vec<f64> = self
            .buckets
            .iter()
            .chain(&other.buckets)
            .map(|(bound, _)| *bound)
            .collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        let merged = bounds
            .into_iter()
            .map(|le| (le, at_or_below(self, le) + at_or_below(other, le)))
            .collect();
        self.buckets = merged;
    }

    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn count(&self) -> u64 {
        self.buckets.last().map_or(0, |(_, c)| c.max(0.0) as u64)
    }

    fn percentiles(&self) -> Option<Percentiles> {
        Histogram::percentiles(self)
    }
}

/// The histograms of `metric` (its `_bucket` series) in `text`, by the value of `label`.
///
/// The whole text must be the exposition format ([`exposition::parse`]): a malformed line
/// of another series is an error too, naming its line.
///
/// ```
/// use stormguard::advise::prometheus::parse;
/// let text = "m_bucket{endpoint=\"GET /\",le=\"0.5\"} 3\nm_bucket{endpoint=\"GET /\",le=\"+Inf\"} 4\n";
/// let h = &parse(text, "m", "endpoint")?["GET /"];
/// assert_eq!(h.quantile(0.5), Some(0.5 * 2.0 / 3.0));
/// # Ok::<(), stormguard::advise::AdviseError>(())
/// ```
pub fn parse(
    text: &str,
    metric: &str,
    label: &str,
) -> Result<BTreeMap<String, Histogram>, AdviseError> {
    let series = format!("{metric}_bucket");
    let samples = exposition::parse_lines(text).map_err(|e| match e {
        ExpositionError::Line { line, what } => AdviseError::at(line, what),
        too_many @ ExpositionError::TooManySamples => AdviseError::at(0, too_many.to_string()),
    })?;
    let mut out: BTreeMap<String, Histogram> = BTreeMap::new();
    for (n, sample) in samples.iter().filter(|(_, s)| s.name == series) {
        let count = Some(sample.value)
            .filter(|c| c.is_finite() && *c >= 0.0)
            .ok_or_else(|| {
                AdviseError::at(*n, format!("{} is not a bucket count", sample.value))
            })?;
        let le = sample
            .labels
            .get("le")
            .ok_or_else(|| AdviseError::at(*n, "a bucket without `le`"))?;
        let le = exposition::parse_value(le)
            .filter(|v| !v.is_nan())
            .ok_or_else(|| AdviseError::at(*n, format!("le {le:?} is not a number")))?;
        let Some(endpoint) = sample.labels.get(label) else {
            return Err(AdviseError::at(
                *n,
                format!("a bucket without the `{label}` label"),
            ));
        };
        out.entry(endpoint.clone()).or_default().add(le, count);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::Histogram;
    use crate::advise::timed::Latencies as _;

    #[test]
    fn a_dip_in_cumulative_counts_is_read_as_no_observation() {
        // 10 at or below 0.1, a racing read says 9 at or below 0.5: 0 between them.
        let h = Histogram::new([(0.1, 10.0), (0.5, 9.0), (1.0, 20.0), (f64::INFINITY, 20.0)]);
        assert!((h.quantile(0.75).expect("a quantile") - 0.75).abs() < 1e-9);
        assert_eq!(h.quantile(0.5), Some(0.1));
    }

    #[test]
    fn histograms_with_different_bounds_merge_by_what_each_saw_at_or_below() {
        let mut a = Histogram::new([(0.1, 10.0), (0.2, 20.0), (f64::INFINITY, 30.0)]);
        let b = Histogram::new([(0.1, 5.0), (f64::INFINITY, 8.0)]);
        a.merge(&b);
        // At 0.2 the second saw its 5 at or below 0.1.
        assert_eq!(
            a.buckets,
            vec![(0.1, 15.0), (0.2, 25.0), (f64::INFINITY, 38.0)]
        );
        let mut empty = Histogram::new([]);
        empty.merge(&b);
        assert_eq!(empty.buckets, b.buckets);
    }
}
