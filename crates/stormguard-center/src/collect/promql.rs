//! The PromQL path: the same series read from a Prometheus server that scrapes the fleet.
//!
//! A fleet of hundreds of instances already scraped by Prometheus should not be scraped a
//! second time by the center: the center asks Prometheus instead, with one instant query
//! per quantity over its HTTP API (`GET /api/v1/query`), each a `rate()` over a window
//! (`histogram_quantile` over the summed bucket rates for the P99), summed over the
//! service's instances by endpoint. Which series are a service's is a label selector
//! written by the operator, `{service}` replaced by the service's name (`job="{service}"`
//! by default). The numbers then become a round exactly as the scrape path's do.
//!
//! Every query of a round is evaluated at the same instant (the API's `time`): a ratio
//! made of two queries evaluated a moment apart could compare different windows. CPU is
//! each instance's `rate(process_cpu_seconds_total)` divided by its
//! `process_cpu_allowance_cores`, the largest of the instances'.

use std::time::Duration;

use stormguard_tower::metric_names::{
    ATTEMPT_DURATION, ATTEMPTS, CPU_ALLOWANCE, REQUESTS, RESPONSES,
};

use super::counters::{PROCESS_CPU, PROCESS_MEMORY, PROCESS_THREADS};
use super::reading::{EndpointRates, Reading};
use stormguard::advise::prometheus::api::{Labels, QueryError, instant_vector};

/// The selector when none is given: Prometheus's job named as the service.
pub const DEFAULT_SELECTOR: &str = "job=\"{service}\"";

/// Where and how to read the series from Prometheus.
#[derive(Clone, Debug, PartialEq)]
pub struct PrometheusSource {
    /// The server's base URL (`http://prometheus:9090`).
    pub url: String,
    /// Label matchers selecting a service's series, `{service}` replaced by its name
    /// ([`DEFAULT_SELECTOR`] by default).
    pub selector: String,
    /// The window of each `rate()`: at least twice Prometheus's scrape interval.
    pub window: Duration,
}

impl PrometheusSource {
    /// Reads from `url` with the default selector and a one-minute window.
    pub fn new(url: &str) -> PrometheusSource {
        PrometheusSource {
            url: url.trim_end_matches('/').to_owned(),
            selector: DEFAULT_SELECTOR.to_owned(),
            window: Duration::from_secs(60),
        }
    }
}

/// Why Prometheus could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PromqlError {
    /// The request failed or did not answer in time.
    #[error("prometheus at {url}: {what}")]
    Unreachable {
        /// The query URL (without the query).
        url: String,
        /// What failed.
        what: String,
    },
    /// Prometheus refused the query.
    #[error("prometheus refused {query:?}: {error_type}: {error}")]
    Refused {
        /// The PromQL.
        query: String,
        /// Its `errorType`.
        error_type: String,
        /// Its `error`.
        error: String,
    },
    /// The answer is not the API's JSON, or not an instant vector.
    #[error("prometheus answered {query:?} with {what}")]
    Malformed {
        /// The PromQL.
        query: String,
        /// What was wrong.
        what: String,
    },
}

/// A Prometheus HTTP API client for one source.
#[derive(Debug)]
pub(crate) struct Promql {
    client: reqwest::Client,
    source: PrometheusSource,
}

impl Promql {
    pub(crate) fn new(source: PrometheusSource, timeout: Duration) -> Promql {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .unwrap_or_default();
        Promql { client, source }
    }

    pub(crate) fn window(&self) -> Duration {
        self.source.window
    }

    /// The selector of `service` with `extra` matchers, in braces.
    fn select(&self, service: &str, extra: &str) -> String {
        let base = self.source.selector.replace("{service}", service);
        let parts: Vec<&str> = [base.as_str(), extra]
            .into_iter()
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        format!("{{{}}}", parts.join(","))
    }

    /// `service`'s reading at `at_ms` (milliseconds since the Unix epoch) and how many
    /// instances it came from.
    pub(crate) async fn read(
        &self,
        service: &str,
        at_ms: i64,
    ) -> Result<(Reading, usize), PromqlError> {
        let w = format!("{}ms", self.source.window.as_millis().max(1));
        let s = |extra: &str| self.select(service, extra);
        let rate = |name: &str, extra: &str| format!("rate({name}{}[{w}])", s(extra));
        let mut reading = Reading::default();
        for (row, value) in self
            .query(
                at_ms,
                &format!("sum by (endpoint) ({})", rate(REQUESTS, "")),
            )
            .await?
        {
            entry(&mut reading, &row).requests = value;
        }
        let failed = rate(REQUESTS, "outcome!=\"succeeded\"");
        for (row, value) in self
            .query(at_ms, &format!("sum by (endpoint) ({failed})"))
            .await?
        {
            entry(&mut reading, &row).failed = value;
        }
        for (row, value) in self
            .query(
                at_ms,
                &format!("sum by (endpoint) ({})", rate(ATTEMPTS, "")),
            )
            .await?
        {
            entry(&mut reading, &row).attempts = value;
        }
        for (row, value) in self
            .query(
                at_ms,
                &format!("sum by (endpoint, code) ({})", rate(RESPONSES, "")),
            )
            .await?
        {
            let code = row.get("code").cloned().unwrap_or_default();
            entry(&mut reading, &row).results.insert(code, value);
        }
        let buckets = rate(&format!("{ATTEMPT_DURATION}_bucket"), "");
        let p99 = format!("histogram_quantile(0.99, sum by (endpoint, le) ({buckets}))");
        let mut measured = Vec::new();
        for (row, value) in self.query(at_ms, &p99).await? {
            if value.is_finite() {
                entry(&mut reading, &row).p99 = Some(value);
                measured.push(row.get("endpoint").cloned().unwrap_or_default());
            }
        }
        let summary = format!(
            "max by (endpoint) ({ATTEMPT_DURATION}{})",
            s("quantile=\"0.99\"")
        );
        for (row, value) in self.query(at_ms, &summary).await? {
            let endpoint = row.get("endpoint").cloned().unwrap_or_default();
            if value.is_finite() && !measured.contains(&endpoint) {
                entry(&mut reading, &row).p99 = Some(value);
            }
        }
        reading.cpu = self
            .scalar(
                at_ms,
                &format!("max({} / {CPU_ALLOWANCE}{})", rate(PROCESS_CPU, ""), s("")),
            )
            .await?;
        reading.memory = self
            .scalar(at_ms, &format!("max({PROCESS_MEMORY}{})", s("")))
            .await?;
        reading.threads = self
            .scalar(at_ms, &format!("max({PROCESS_THREADS}{})", s("")))
            .await?;
        let names = format!("__name__=~\"{REQUESTS}|{ATTEMPTS}|{PROCESS_CPU}\"");
        let instances = self
            .scalar(
                at_ms,
                &format!("count(count by (instance) ({}))", s(&names)),
            )
            .await?
            .unwrap_or(0.0);
        Ok((reading, instances as usize))
    }

    async fn scalar(&self, at_ms: i64, query: &str) -> Result<Option<f64>, PromqlError> {
        Ok(self
            .query(at_ms, query)
            .await?
            .into_iter()
            .map(|(_, v)| v)
            .find(|v| v.is_finite()))
    }

    /// The instant vector `query` evaluates to at `at_ms`: each sample's labels and value.
    async fn query(&self, at_ms: i64, query: &str) -> Result<Vec<(Labels, f64)>, PromqlError> {
        let url = format!("{}/api/v1/query", self.source.url);
        let time = unix_seconds(at_ms);
        let unreachable = |what: String| PromqlError::Unreachable {
            url: url.clone(),
            what,
        };
        let response = self
            .client
            .get(&url)
            .query(&[("query", query), ("time", time.as_str())])
            .send()
            .await
            .map_err(|e| {
                unreachable(if e.is_timeout() {
                    "timed out".into()
                } else {
                    "request failed".into()
                })
            })?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|_| unreachable("the body could not be read".into()))?;
        instant_vector(&text).map_err(|error| match error {
            QueryError::Refused { error_type, error } => PromqlError::Refused {
                query: query.to_owned(),
                error_type,
                error,
            },
            not_json @ QueryError::NotJson(_) => PromqlError::Malformed {
                query: query.to_owned(),
                what: format!("status {status} and {not_json}"),
            },
            QueryError::Malformed(what) => PromqlError::Malformed {
                query: query.to_owned(),
                what,
            },
        })
    }
}

/// `ms` since the Unix epoch as the API's seconds, to the millisecond.
fn unix_seconds(ms: i64) -> String {
    format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
}

fn entry<'a>(reading: &'a mut Reading, row: &Labels) -> &'a mut EndpointRates {
    let endpoint = row.get("endpoint").cloned().unwrap_or_default();
    reading.endpoints.entry(endpoint).or_default()
}
