//! `stormguard advise timeouts`: timeouts from latency data (see [`stormguard::advise`]).
//!
//! Latency comes from files — a CSV of latencies (`.csv`, columns `endpoint,latency_ms`), an
//! HdrHistogram interval log (`.hlog`, one tag per endpoint, values in `--hdr-unit`), or
//! a Prometheus text exposition snapshot (any other name; the histogram `--metric`, grouped
//! by `--label`) — or from a Prometheus server's HTTP API (`--prometheus URL`), where each
//! percentile is `histogram_quantile(q, sum by (le, LABEL) (increase(METRIC_bucket{SELECTOR}[RANGE])))`
//! evaluated at the window's end. Both ways read a histogram's quantiles the same way, so a
//! snapshot file and the server holding the same counts give the same advice.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use comfy_table::Table;
use comfy_table::presets::UTF8_FULL_CONDENSED;
use serde::Serialize;
use stormguard::advise::{Advice, Percentiles, advise, csv, patch, prometheus};
use stormguard::duration::format_duration;

use super::load_policy;
use crate::cli::Format;
use crate::parse;
use crate::run::Failure;

/// `stormguard advise …`.
#[derive(Debug, Subcommand)]
pub(crate) enum AdviseCommand {
    /// Recommend per-endpoint timeouts from latency data (the seeds' 0.7/0.3 rule).
    #[command(long_about = HELP)]
    Timeouts(TimeoutArgs),
}

const HELP: &str = "\
Recommend per-endpoint timeouts from latency data.

  stormguard advise timeouts --normal week.csv --stress stress.prom --base policies.toml --patch new.toml
  stormguard advise timeouts --prometheus http://127.0.0.1:9090 --normal-range 7d \\
      --stress-range 30m --stress-end 1764650000 --metric http_request_duration_seconds

For each endpoint: P50/P90/P99/P999 of the normal window (and of the stress window, a load
test at 120% of peak); the timeout = 1.25 x normal P999 without a stress window (the seeds'
1200 ms -> 1500 ms), else 0.7 x normal P999 + 0.3 x stress P999 + 200 ms, rounded up to 10 ms;
the P99 alarm threshold (80% of the timeout) and whether the P99 is already above it.

--patch writes the advice as a policy file (the --base policies with their attempt timeout
set: per_try when they have one, else overall) that `policy diff` and `policy lint` read.
Files: .csv = endpoint,latency_ms rows; .hlog = HdrHistogram interval log (each interval's
Tag= is its endpoint, values in --hdr-unit); anything else = Prometheus text exposition.
Exit status: 0, or 2 for bad input (a file or server answer that cannot be read).";

/// `advise timeouts`.
#[derive(Debug, Args)]
pub(crate) struct TimeoutArgs {
    /// The normal (baseline) window's latency file.
    #[arg(long, value_name = "FILE", required_unless_present = "prometheus")]
    normal: Option<PathBuf>,
    /// The stress window's latency file.
    #[arg(long, value_name = "FILE")]
    stress: Option<PathBuf>,
    /// A Prometheus server to query instead of files.
    #[arg(long, value_name = "URL", conflicts_with_all = ["normal", "stress"])]
    prometheus: Option<String>,
    /// The normal window's length (Prometheus).
    #[arg(long, default_value = "7d", value_parser = parse_range)]
    normal_range: Duration,
    /// The normal window's end, Unix seconds (Prometheus; default now).
    #[arg(long)]
    normal_end: Option<f64>,
    /// The stress window's length (Prometheus; no stress window without it).
    #[arg(long, value_parser = parse_range)]
    stress_range: Option<Duration>,
    /// The stress window's end, Unix seconds (Prometheus; default now).
    #[arg(long)]
    stress_end: Option<f64>,
    /// Extra label matchers for the Prometheus query, e.g. `job="api"`.
    #[arg(long, default_value = "")]
    selector: String,
    /// The latency histogram's name (seconds, without `_bucket`).
    #[arg(long, default_value = "http_request_duration_seconds")]
    metric: String,
    /// The label naming the endpoint.
    #[arg(long, default_value = "endpoint")]
    label: String,
    /// The unit of an HdrHistogram log's values (ns, us, ms, s): the recorder's choice.
    #[arg(long, default_value = "us", value_parser = super::hdr_log::parse_unit)]
    hdr_unit: Duration,
    /// The policy file whose policies the patch starts from.
    #[arg(long, value_name = "FILE")]
    base: Option<PathBuf>,
    /// Write the advice as a policy file here (.toml or .json).
    #[arg(long, value_name = "FILE")]
    patch: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

fn parse_range(s: &str) -> Result<Duration, String> {
    if let Some(days) = s.strip_suffix('d') {
        return days
            .parse::<u64>()
            .ok()
            .and_then(|d| d.checked_mul(86_400))
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{s:?} is not a number of days"));
    }
    parse::duration(s)
}

/// One row of the output.
#[derive(Serialize)]
struct Row<'a> {
    endpoint: &'a str,
    #[serde(flatten)]
    advice: &'a Advice,
}

pub(crate) fn run(command: AdviseCommand) -> Result<String, Failure> {
    let AdviseCommand::Timeouts(args) = command;
    let (normal, stress) = match &args.prometheus {
        Some(url) => {
            let normal = query_window(&args, url, args.normal_range, args.normal_end)?;
            let stress = args
                .stress_range
                .map(|range| query_window(&args, url, range, args.stress_end))
                .transpose()?;
            (normal, stress)
        }
        None => {
            let normal = args
                .normal
                .as_deref()
                .ok_or_else(|| Failure::Usage("give --normal FILE or --prometheus URL".into()))?;
            let normal = read_file(normal, &args)?;
            let stress = args
                .stress
                .as_deref()
                .map(|p| read_file(p, &args))
                .transpose()?;
            (normal, stress)
        }
    };
    if normal.is_empty() {
        return Err(Failure::Usage("no latency data for any endpoint".into()));
    }
    let advice: BTreeMap<String, Advice> = normal
        .iter()
        .map(|(name, p)| {
            let s = stress.as_ref().and_then(|s| s.get(name));
            (name.clone(), advise(p, s))
        })
        .collect();
    if let Some(out) = &args.patch {
        let base = args.base.as_deref().map(load_policy).transpose()?;
        let file = patch(&advice, base.as_ref().map(|(f, _)| f)).map_err(|e| {
            Failure::Usage(format!("the advice does not fit the --base policy: {e}"))
        })?;
        let text = if out
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
        {
            file.to_json()
        } else {
            file.to_toml()
        };
        std::fs::write(out, text)
            .map_err(|e| Failure::Io(format!("--patch {}: {e}", out.display())))?;
    }
    match args.format {
        Format::Json => {
            let rows: Vec<Row<'_>> = advice
                .iter()
                .map(|(endpoint, advice)| Row { endpoint, advice })
                .collect();
            serde_json::to_string_pretty(&rows)
                .map(|s| s + "\n")
                .map_err(|e| Failure::Io(format!("JSON encoding failed: {e}")))
        }
        Format::Table => Ok(table(&advice)),
    }
}

fn read_file(path: &Path, args: &TimeoutArgs) -> Result<BTreeMap<String, Percentiles>, Failure> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("hlog"))
    {
        let bytes =
            std::fs::read(path).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
        return super::hdr_log::parse(&bytes, args.hdr_unit)
            .map_err(|e| Failure::Usage(format!("{}: {e}", path.display())));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
    let bad =
        |e: stormguard::advise::AdviseError| Failure::Usage(format!("{}: {e}", path.display()));
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
    {
        Ok(csv::parse(&text)
            .map_err(bad)?
            .into_iter()
            .filter_map(|(name, samples)| Percentiles::of_samples(&samples).map(|p| (name, p)))
            .collect())
    } else {
        Ok(prometheus::parse(&text, &args.metric, &args.label)
            .map_err(bad)?
            .into_iter()
            .filter_map(|(name, h)| h.percentiles().map(|p| (name, p)))
            .collect())
    }
}

/// The percentiles of every endpoint over `range` ending at `end`, from the server.
fn query_window(
    args: &TimeoutArgs,
    url: &str,
    range: Duration,
    end: Option<f64>,
) -> Result<BTreeMap<String, Percentiles>, Failure> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| Failure::Io(format!("HTTP client: {e}")))?;
    let mut by_quantile: Vec<BTreeMap<String, f64>> = Vec::new();
    for q in [0.5, 0.9, 0.99, 0.999] {
        let query = format!(
            "histogram_quantile({q}, sum by (le, {label}) (increase({metric}_bucket{{{selector}}}[{secs}s])))",
            label = args.label,
            metric = args.metric,
            selector = args.selector,
            secs = range.as_secs().max(1),
        );
        let mut params = vec![("query", query)];
        if let Some(t) = end {
            params.push(("time", t.to_string()));
        }
        let endpoint = format!("{}/api/v1/query", url.trim_end_matches('/'));
        let body = client
            .get(&endpoint)
            .query(&params)
            .send()
            .and_then(reqwest::blocking::Response::text)
            .map_err(|e| Failure::Usage(format!("{endpoint}: {e}")))?;
        by_quantile.push(
            vector(&body, &args.label).map_err(|m| Failure::Usage(format!("{endpoint}: {m}")))?,
        );
    }
    let mut out = BTreeMap::new();
    for name in by_quantile[0].keys() {
        let at = |i: usize| {
            by_quantile[i]
                .get(name)
                .filter(|s| {
                    s.is_finite() && (0.0..stormguard::advise::MAX_LATENCY_SECS).contains(*s)
                })
                .map(|s| Duration::from_secs_f64(*s))
        };
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

/// An instant-vector answer of the Prometheus HTTP API, by the value of `label`.
fn vector(body: &str, label: &str) -> Result<BTreeMap<String, f64>, String> {
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("not a Prometheus API answer: {e}"))?;
    if v["status"] != "success" {
        return Err(format!(
            "the query failed: {}",
            v["error"].as_str().unwrap_or("no error message")
        ));
    }
    let result = v["data"]["result"]
        .as_array()
        .ok_or("the answer holds no result vector")?;
    let mut out = BTreeMap::new();
    for sample in result {
        let (Some(name), Some(value)) = (
            sample["metric"][label].as_str(),
            sample["value"][1].as_str(),
        ) else {
            return Err(format!("a sample without the `{label}` label or a value"));
        };
        let value = match value {
            "NaN" => f64::NAN,
            "+Inf" => f64::INFINITY,
            other => other
                .parse()
                .map_err(|_| format!("{other:?} is not a number"))?,
        };
        out.insert(name.to_owned(), value);
    }
    Ok(out)
}

fn table(advice: &BTreeMap<String, Advice>) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "endpoint",
        "P50",
        "P90",
        "P99",
        "P999",
        "stress P999",
        "timeout",
        "rule",
        "alarm above",
        "P99 alarm",
    ]);
    for (name, a) in advice {
        t.add_row([
            name.clone(),
            format_duration(a.normal.p50),
            format_duration(a.normal.p90),
            format_duration(a.normal.p99),
            format_duration(a.normal.p999),
            a.stress
                .map_or_else(|| "-".to_owned(), |s| format_duration(s.p999)),
            format_duration(a.timeout),
            a.rule.to_owned(),
            format_duration(a.alarm_above),
            if a.alarm {
                "FIRING".to_owned()
            } else {
                "ok".to_owned()
            },
        ]);
    }
    let mut out = format!("{t}\n");
    let _ = writeln!(
        out,
        "timeout = 1.25 x P999 (initial) or 0.7 x P999 + 0.3 x stress P999 + 200ms; alarm when P99 > 80% of it"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_answers_are_read_by_label() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"endpoint":"GET /"},"value":[1700000000,"1.2"]},
            {"metric":{"endpoint":"POST /"},"value":[1700000000,"NaN"]}]}}"#;
        let v = vector(body, "endpoint").expect("a vector");
        assert_eq!(v["GET /"], 1.2);
        assert!(v["POST /"].is_nan());
        let err =
            vector(r#"{"status":"error","error":"parse error"}"#, "endpoint").expect_err("error");
        assert!(err.contains("parse error"));
        assert!(vector("<html>", "endpoint").is_err());
    }

    #[test]
    fn ranges_take_days() {
        assert_eq!(parse_range("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_range("90s"), Ok(Duration::from_secs(90)));
        assert!(parse_range("xd").is_err());
    }
}
