//! `stormguard advise timeouts`: timeouts from latency data (see [`stormguard::advise`]).
//!
//! Latency comes from files — a CSV of latencies (`.csv`, columns `endpoint,latency_ms`), an
//! HdrHistogram interval log (`.hlog`, one tag per endpoint, values in `--hdr-unit`), or
//! a Prometheus text exposition snapshot (any other name; the histogram `--metric`, grouped
//! by `--label`) — or from a Prometheus server's HTTP API (`--prometheus URL`), where each
//! percentile is `histogram_quantile(q, sum by (le, LABEL) (increase(METRIC_bucket{SELECTOR}[RANGE])))`
//! evaluated at the window's end. Both ways read a histogram's quantiles the same way, so a
//! snapshot file and the server holding the same counts give the same advice.
//!
//! Inputs with time (a CSV with a `timestamp` column, an `.hlog` whose intervals have
//! absolute starts, the server's range queries) also give the P99 alarm window by window
//! (`--alarm-window`, 5 minutes) and the daily peaks, suggested as policy time windows (see
//! [`stormguard::advise::timed`] and [`stormguard::advise::peak`]); a snapshot has no time,
//! and the output says so.

mod output;
mod server;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use stormguard::advise::peak::{PeakSearch, daily_peaks};
use stormguard::advise::timed::{Interval, Latencies, WindowP99, window_p99s};
use stormguard::advise::{
    Advice, Percentiles, WindowAdvice, advise, advise_timed, csv, patch, prometheus,
};

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

With time (a .csv with a timestamp column, an .hlog with absolute interval starts, or
--prometheus): the P99 alarm as monitoring evaluates it. The normal window is cut into
consecutive --alarm-window windows (5m), each window's P99 is computed, and the windows where
it is above 80% of the timeout in force are reported (count, share, first, worst): whether
the alarm would have fired. The PromQL alerting rule that implements the alarm is printed.
A Prometheus text snapshot has no time: the output says \"no time series in this input\".

Daily peaks (a day or more of timestamped data): the local hours (--time-zone) whose P99 is
above 1.5 x the median hourly P99 of their day, on most days, merged when contiguous. A peak
whose timeout (the same rule, from the peak hours' data) is above the one from the other
hours is suggested as a policy time window; the endpoint's timeout then comes from the other
hours, and --patch writes the window as a `windows` entry of the endpoint.

--patch writes the advice as a policy file (the --base policies with their attempt timeout
set: per_try when they have one, else overall) that `policy diff` and `policy lint` read.
Files: .csv = endpoint,latency_ms rows and an optional timestamp column (RFC 3339 or Unix
seconds); .hlog = HdrHistogram interval log (each interval's Tag= is its endpoint, values
in --hdr-unit); anything else = Prometheus text exposition.
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
    /// The P99 alarm's window: the data is cut into consecutive windows this long.
    #[arg(long, default_value = "5m", value_parser = crate::parse::duration)]
    alarm_window: Duration,
    /// The time zone of daily peaks and suggested windows (an IANA name).
    #[arg(long, default_value = "UTC")]
    time_zone: String,
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

/// What one input says of each endpoint.
struct Input {
    /// The percentiles over the whole window.
    whole: BTreeMap<String, Percentiles>,
    /// With time: each endpoint's alarm windows' P99 and daily peak search.
    timed: Option<BTreeMap<String, (Vec<WindowP99>, PeakSearch)>>,
}

pub(crate) fn run(command: AdviseCommand) -> Result<String, Failure> {
    let AdviseCommand::Timeouts(args) = command;
    if args.alarm_window < Duration::from_secs(1) || args.alarm_window.subsec_nanos() != 0 {
        return Err(Failure::Usage(
            "--alarm-window is whole seconds, at least 1s".into(),
        ));
    }
    stormguard::policy::Schedule::daily("00:00", "01:00", &args.time_zone).map_err(|_| {
        Failure::Usage(format!(
            "--time-zone {:?} is not an IANA time zone",
            args.time_zone
        ))
    })?;
    let (normal, stress) = match &args.prometheus {
        Some(url) => {
            let server = server::Server::new(url, &args)?;
            let normal = query_normal(&server, &args)?;
            let stress = args
                .stress_range
                .map(|range| server.window(range, args.stress_end))
                .transpose()?;
            (normal, stress)
        }
        None => {
            let normal = args
                .normal
                .as_deref()
                .ok_or_else(|| Failure::Usage("give --normal FILE or --prometheus URL".into()))?;
            let normal = read_file(normal, &args, true)?;
            let stress = args
                .stress
                .as_deref()
                .map(|p| read_file(p, &args, false).map(|i| i.whole))
                .transpose()?;
            (normal, stress)
        }
    };
    if normal.whole.is_empty() {
        return Err(Failure::Usage("no latency data for any endpoint".into()));
    }
    let mut timed = normal.timed;
    let advice: BTreeMap<String, output::Endpoint> = normal
        .whole
        .iter()
        .map(|(name, p)| {
            let s = stress.as_ref().and_then(|s| s.get(name));
            let endpoint = match timed.as_mut() {
                Some(series) => {
                    let (p99s, peaks) = series.remove(name).unwrap_or_else(|| {
                        (
                            Vec::new(),
                            PeakSearch {
                                days: 0,
                                peaks: Vec::new(),
                                off_peak: None,
                            },
                        )
                    });
                    let t = advise_timed(p, s, &p99s, args.alarm_window, peaks);
                    output::Endpoint {
                        advice: t.advice,
                        timed: Some(t),
                    }
                }
                None => output::Endpoint {
                    advice: advise(p, s),
                    timed: None,
                },
            };
            (name.clone(), endpoint)
        })
        .collect();
    if let Some(out) = &args.patch {
        write_patch(out, &advice, &args)?;
    }
    let rules = output::Rules {
        metric: &args.metric,
        label: &args.label,
        selector: &args.selector,
        window: args.alarm_window,
    };
    match args.format {
        Format::Json => output::json(&advice, &rules).map_err(Failure::Io),
        Format::Table => Ok(output::table(&advice, &rules)),
    }
}

fn write_patch(
    out: &Path,
    advice: &BTreeMap<String, output::Endpoint>,
    args: &TimeoutArgs,
) -> Result<(), Failure> {
    let base = args.base.as_deref().map(load_policy).transpose()?;
    let timeouts: BTreeMap<String, Advice> =
        advice.iter().map(|(n, e)| (n.clone(), e.advice)).collect();
    let windows: BTreeMap<String, Vec<WindowAdvice>> = advice
        .iter()
        .filter_map(|(n, e)| Some((n.clone(), e.timed.as_ref()?.windows.clone())))
        .collect();
    let file = patch(&timeouts, &windows, base.as_ref().map(|(f, _)| f))
        .map_err(|e| Failure::Usage(format!("the advice does not fit the --base policy: {e}")))?;
    let text = if out
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        file.to_json()
    } else {
        file.to_toml()
    };
    std::fs::write(out, text).map_err(|e| Failure::Io(format!("--patch {}: {e}", out.display())))
}

/// The normal window from the server: its percentiles, the P99 of each alarm window and, over
/// a day or more, the hourly histograms for the daily peak search.
fn query_normal(server: &server::Server<'_>, args: &TimeoutArgs) -> Result<Input, Failure> {
    let whole = server.window(args.normal_range, args.normal_end)?;
    let end = server::end_or_now(args.normal_end);
    let mut p99s = server.window_p99s(args.normal_range, end, args.alarm_window)?;
    let mut hours = if args.normal_range >= Duration::from_secs(86_400) {
        server.hours(args.normal_range, end)?
    } else {
        BTreeMap::new()
    };
    let mut timed = BTreeMap::new();
    for name in whole.keys() {
        let peaks = peaks(hours.remove(name).unwrap_or_default(), args)?;
        timed.insert(name.clone(), (p99s.remove(name).unwrap_or_default(), peaks));
    }
    Ok(Input {
        whole,
        timed: Some(timed),
    })
}

fn peaks<L: Latencies>(
    intervals: Vec<Interval<L>>,
    args: &TimeoutArgs,
) -> Result<PeakSearch, Failure> {
    daily_peaks(intervals, &args.time_zone)
        .map_err(|e| Failure::Usage(format!("--time-zone: {}", e.message)))
}

/// Each endpoint's alarm windows and daily peak search, from its intervals.
fn series<L: Latencies>(
    by_endpoint: BTreeMap<String, Vec<Interval<L>>>,
    args: &TimeoutArgs,
) -> Result<BTreeMap<String, (Vec<WindowP99>, PeakSearch)>, Failure> {
    by_endpoint
        .into_iter()
        .map(|(name, intervals)| {
            let p99s = window_p99s(intervals.iter().cloned(), args.alarm_window);
            Ok((name, (p99s, peaks(intervals, args)?)))
        })
        .collect()
}

/// The step to which a log's intervals are merged: the largest that divides both the alarm
/// window and the hour, so that neither an alarm window nor an hour of the peak search
/// splits a merged interval.
fn merge_step(alarm_window: Duration) -> Duration {
    let (mut a, mut b) = (alarm_window.as_secs().max(1), 3600);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    Duration::from_secs(a)
}

/// A latency file; with `timed`, its time series too when it has time.
fn read_file(path: &Path, args: &TimeoutArgs, timed: bool) -> Result<Input, Failure> {
    let bad = |e: &dyn std::fmt::Display| Failure::Usage(format!("{}: {e}", path.display()));
    let ext = |x: &str| path.extension().is_some_and(|e| e.eq_ignore_ascii_case(x));
    if ext("hlog") {
        let bytes = std::fs::read(path).map_err(|e| bad(&e))?;
        let whole = super::hdr_log::parse(&bytes, args.hdr_unit).map_err(|e| bad(&e))?;
        let timed = if timed {
            super::hdr_log::parse_timed(&bytes, args.hdr_unit, merge_step(args.alarm_window))
                .map_err(|e| bad(&e))?
                .map(|t| series(t, args))
                .transpose()?
        } else {
            None
        };
        return Ok(Input { whole, timed });
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(&e))?;
    if ext("csv") {
        let whole = csv::parse(&text)
            .map_err(|e| bad(&e))?
            .into_iter()
            .filter_map(|(name, samples)| Percentiles::of_samples(&samples).map(|p| (name, p)))
            .collect();
        let timed = if timed {
            csv::parse_timed(&text)
                .map_err(|e| bad(&e))?
                .map(|rows| {
                    let intervals = rows
                        .into_iter()
                        .map(|(name, rows)| {
                            let rows = rows
                                .into_iter()
                                .map(|(start, l)| Interval {
                                    start,
                                    latencies: vec![l],
                                })
                                .collect();
                            (name, rows)
                        })
                        .collect();
                    series(intervals, args)
                })
                .transpose()?
        } else {
            None
        };
        Ok(Input { whole, timed })
    } else {
        let whole = prometheus::parse(&text, &args.metric, &args.label)
            .map_err(|e| bad(&e))?
            .into_iter()
            .filter_map(|(name, h)| h.percentiles().map(|p| (name, p)))
            .collect();
        Ok(Input { whole, timed: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_take_days() {
        assert_eq!(parse_range("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_range("90s"), Ok(Duration::from_secs(90)));
        assert!(parse_range("xd").is_err());
    }
}
