//! The Prometheus server path of `advise timeouts`: instant queries for the window's
//! percentiles, range queries for the alarm windows' P99 and the hourly histograms of the
//! daily peak search.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use stormguard::advise::prometheus::Histogram;
use stormguard::advise::prometheus::api::{Labels, Points, instant_vector, range_matrix};
use stormguard::advise::prometheus::exposition::parse_value;
use stormguard::advise::timed::{Interval, WindowP99};
use stormguard::advise::{MAX_LATENCY_SECS, Percentiles};

use super::TimeoutArgs;
use crate::run::Failure;

/// Prometheus refuses range queries of more points than this.
const MAX_POINTS: u64 = 11_000;

/// A client of one Prometheus server.
pub(super) struct Server<'a> {
    client: reqwest::blocking::Client,
    url: &'a str,
    args: &'a TimeoutArgs,
}

impl<'a> Server<'a> {
    pub(super) fn new(url: &'a str, args: &'a TimeoutArgs) -> Result<Self, Failure> {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| Failure::Io(format!("HTTP client: {e}")))?;
        Ok(Server { client, url, args })
    }

    /// The body of one API call, and how to name the endpoint in an error.
    fn get(&self, api: &str, params: &[(&str, String)]) -> Result<(String, String), Failure> {
        let endpoint = format!("{}/api/v1/{api}", self.url.trim_end_matches('/'));
        let body = self
            .client
            .get(&endpoint)
            .query(params)
            .send()
            .and_then(reqwest::blocking::Response::text)
            .map_err(|e| Failure::Usage(format!("{endpoint}: {e}")))?;
        Ok((body, endpoint))
    }

    /// `{METRIC_bucket{SELECTOR}`.
    fn buckets(&self) -> String {
        format!("{}_bucket{{{}}}", self.args.metric, self.args.selector)
    }

    /// The percentiles of every endpoint over `range` ending at `end`.
    pub(super) fn window(
        &self,
        range: Duration,
        end: Option<f64>,
    ) -> Result<BTreeMap<String, Percentiles>, Failure> {
        let label = &self.args.label;
        let mut by_quantile: Vec<BTreeMap<String, f64>> = Vec::new();
        for q in [0.5, 0.9, 0.99, 0.999] {
            let query = format!(
                "histogram_quantile({q}, sum by (le, {label}) (increase({}[{}s])))",
                self.buckets(),
                range.as_secs().max(1),
            );
            let mut params = vec![("query", query)];
            if let Some(t) = end {
                params.push(("time", t.to_string()));
            }
            let (body, endpoint) = self.get("query", &params)?;
            let samples = instant_vector(&body)
                .map_err(|e| Failure::Usage(format!("{endpoint}: the query failed: {e}")))?;
            by_quantile.push(by_label(samples, label)?);
        }
        let mut out = BTreeMap::new();
        for name in by_quantile[0].keys() {
            let at = |i: usize| by_quantile[i].get(name).copied().and_then(latency);
            if let (Some(p50), Some(p90), Some(p99), Some(p999)) = (at(0), at(1), at(2), at(3)) {
                out.insert(
                    name.clone(),
                    Percentiles {
                        p50,
                        p90,
                        p99,
                        p999,
                    },
                );
            }
        }
        Ok(out)
    }

    /// The P99 of each alarm window of `len` over `range` ending at `end`:
    /// `histogram_quantile(0.99, … rate(…[LEN]))` with step LEN, each point standing for the
    /// window that ends at it.
    pub(super) fn window_p99s(
        &self,
        range: Duration,
        end: f64,
        len: Duration,
    ) -> Result<BTreeMap<String, Vec<WindowP99>>, Failure> {
        let step = len.as_secs().max(1);
        let query = format!(
            "histogram_quantile(0.99, sum by (le, {label}) (rate({buckets}[{step}s])))",
            label = self.args.label,
            buckets = self.buckets(),
        );
        let mut out: BTreeMap<String, Vec<WindowP99>> = BTreeMap::new();
        for (labels, points) in self.range(query, range, end, step)? {
            let name = name(&labels, &self.args.label)?;
            let p99s = out.entry(name).or_default();
            for (t, v) in points {
                if let (Some(p99), Some(start)) = (latency(v), unix(t - step as f64)) {
                    p99s.push(WindowP99 { start, p99 });
                }
            }
        }
        Ok(out)
    }

    /// Each endpoint's histogram of each hour over `range` ending at `end`:
    /// `sum by (le, LABEL) (increase(…[1h]))` with step 1h.
    pub(super) fn hours(
        &self,
        range: Duration,
        end: f64,
    ) -> Result<BTreeMap<String, Vec<Interval<Histogram>>>, Failure> {
        let label = &self.args.label;
        let query = format!("sum by (le, {label}) (increase({}[3600s]))", self.buckets());
        let mut buckets: BTreeMap<(String, i64), Vec<(f64, f64)>> = BTreeMap::new();
        for (labels, points) in self.range(query, range, end, 3600)? {
            let name = name(&labels, label)?;
            let le = labels
                .get("le")
                .map(String::as_str)
                .and_then(parse_value)
                .ok_or_else(|| Failure::Usage("a bucket series without `le`".into()))?;
            for (t, count) in points {
                if count.is_finite() && count >= 0.0 {
                    #[allow(clippy::cast_possible_truncation)]
                    buckets
                        .entry((name.clone(), t as i64))
                        .or_default()
                        .push((le, count));
                }
            }
        }
        let mut out: BTreeMap<String, Vec<Interval<Histogram>>> = BTreeMap::new();
        for ((name, t), b) in buckets {
            #[allow(clippy::cast_precision_loss)]
            if let Some(start) = unix(t as f64 - 3600.0) {
                out.entry(name).or_default().push(Interval {
                    start,
                    latencies: Histogram::new(b),
                });
            }
        }
        Ok(out)
    }

    /// The series of a range query whose points end at `end`, `step` seconds apart, over
    /// `range`.
    fn range(
        &self,
        query: String,
        range: Duration,
        end: f64,
        step: u64,
    ) -> Result<Vec<(Labels, Points)>, Failure> {
        let points = (range.as_secs() / step).max(1);
        if points > MAX_POINTS {
            return Err(Failure::Usage(format!(
                "{points} windows of {step}s in --normal-range: Prometheus answers at most {MAX_POINTS}; give a longer --alarm-window or a shorter range"
            )));
        }
        // Prometheus evaluates at start + k·step exactly as given: the end is rounded up to
        // a multiple of the step, so its windows and hours are the clock's (as the windows of
        // a file are), not ones shifted to whenever the command ran; the last is the window
        // in progress, as a file's last window is.
        #[allow(clippy::cast_precision_loss)]
        let end = (end / step as f64).ceil() * step as f64;
        #[allow(clippy::cast_precision_loss)]
        let start = end - ((points - 1) * step) as f64;
        let (body, endpoint) = self.get(
            "query_range",
            &[
                ("query", query),
                ("start", start.to_string()),
                ("end", end.to_string()),
                ("step", format!("{step}s")),
            ],
        )?;
        range_matrix(&body)
            .map_err(|e| Failure::Usage(format!("{endpoint}: the query failed: {e}")))
    }
}

/// The end of a window: `end`, or now.
pub(super) fn end_or_now(end: Option<f64>) -> f64 {
    end.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    })
}

/// An instant vector's values by the value of `label`.
fn by_label(samples: Vec<(Labels, f64)>, label: &str) -> Result<BTreeMap<String, f64>, Failure> {
    samples
        .into_iter()
        .map(|(labels, value)| Ok((name(&labels, label)?, value)))
        .collect()
}

/// The `label` of a series.
fn name(labels: &Labels, label: &str) -> Result<String, Failure> {
    labels
        .get(label)
        .cloned()
        .ok_or_else(|| Failure::Usage(format!("a series without the `{label}` label")))
}

/// Seconds as a latency, when they can be one.
fn latency(secs: f64) -> Option<Duration> {
    (secs.is_finite() && (0.0..MAX_LATENCY_SECS).contains(&secs))
        .then(|| Duration::from_secs_f64(secs))
}

/// Unix seconds as a time, when after the epoch.
fn unix(secs: f64) -> Option<SystemTime> {
    (0.0..1e12)
        .contains(&secs)
        .then(|| SystemTime::UNIX_EPOCH + Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_by_label() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"endpoint":"GET /"},"value":[1700000000,"1.2"]},
            {"metric":{"endpoint":"POST /"},"value":[1700000000,"NaN"]}]}}"#;
        let Ok(v) = by_label(instant_vector(body).unwrap_or_default(), "endpoint") else {
            panic!("a vector")
        };
        assert_eq!(v["GET /"], 1.2);
        assert!(v["POST /"].is_nan());
        let missing = vec![(Labels::new(), 1.0)];
        assert!(by_label(missing, "endpoint").is_err());
    }
}
