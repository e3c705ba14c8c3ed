//! What `advise timeouts` prints: the advice table (or JSON rows), the P99 alarm window by
//! window, the suggested time windows, and the alerting rules that implement the alarm.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use comfy_table::Table;
use comfy_table::presets::UTF8_FULL_CONDENSED;
use serde::Serialize;
use stormguard::advise::timed::{Alarm, rfc3339};
use stormguard::advise::{Advice, TimedAdvice, WindowAdvice};
use stormguard::duration::format_duration;

/// Said where an input has no timestamps.
pub(super) const NO_TIME_SERIES: &str = "no time series in this input";

/// One endpoint's advice: from timestamped data or not.
pub(super) struct Endpoint {
    pub(super) advice: Advice,
    pub(super) timed: Option<TimedAdvice>,
}

/// What the alert rule expressions are built from.
pub(super) struct Rules<'a> {
    pub(super) metric: &'a str,
    pub(super) label: &'a str,
    pub(super) selector: &'a str,
    pub(super) window: Duration,
}

/// An alerting rule for Prometheus: when it applies and its expression.
#[derive(Serialize)]
struct AlertRule {
    when: String,
    expr: String,
}

/// One row of the JSON output.
#[derive(Serialize)]
struct Row<'a> {
    endpoint: &'a str,
    #[serde(flatten)]
    advice: &'a Advice,
    #[serde(skip_serializing_if = "Option::is_none")]
    time_series: Option<&'static str>,
    alarm_windows: Option<&'a Alarm>,
    peak_days: Option<usize>,
    windows: &'a [WindowAdvice],
    alert_rules: Vec<AlertRule>,
}

pub(super) fn json(
    advice: &BTreeMap<String, Endpoint>,
    rules: &Rules<'_>,
) -> Result<String, String> {
    let rows: Vec<Row<'_>> = advice
        .iter()
        .map(|(endpoint, e)| Row {
            endpoint,
            advice: &e.advice,
            time_series: e.timed.is_none().then_some(NO_TIME_SERIES),
            alarm_windows: e.timed.as_ref().map(|t| &t.alarm),
            peak_days: e.timed.as_ref().map(|t| t.peak_days),
            windows: e.timed.as_ref().map_or(&[], |t| &t.windows),
            alert_rules: alert_rules(endpoint, e, rules),
        })
        .collect();
    serde_json::to_string_pretty(&rows)
        .map(|s| s + "\n")
        .map_err(|e| format!("JSON encoding failed: {e}"))
}

pub(super) fn table(advice: &BTreeMap<String, Endpoint>, rules: &Rules<'_>) -> String {
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
    for (name, e) in advice {
        let a = &e.advice;
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
            if a.alarm { "FIRING" } else { "ok" }.to_owned(),
        ]);
    }
    let mut out = format!("{t}\n");
    let _ = writeln!(
        out,
        "timeout = 1.25 x P999 (initial) or 0.7 x P999 + 0.3 x stress P999 + 200ms; alarm when P99 > 80% of it"
    );
    if advice
        .values()
        .flat_map(|e| e.timed.iter().flat_map(|t| &t.windows))
        .any(|w| w.suggested)
    {
        let _ = writeln!(
            out,
            "an endpoint with a suggested window: its percentiles and timeout above are those of the hours outside it"
        );
    }
    let _ = writeln!(
        out,
        "\nP99 alarm over {} windows (each judged against the timeout in force then):",
        format_duration(rules.window)
    );
    let mut alarms = Table::new();
    alarms.load_preset(UTF8_FULL_CONDENSED);
    alarms.set_header([
        "endpoint", "windows", "firing", "share", "first", "worst", "alarm",
    ]);
    let at = |w: Option<stormguard::advise::timed::WindowP99>| {
        w.map_or_else(
            || "-".to_owned(),
            |w| format!("{} P99 {}", rfc3339(w.start), format_duration(w.p99)),
        )
    };
    for (name, e) in advice {
        match &e.timed {
            None => alarms.add_row([name.as_str(), NO_TIME_SERIES]),
            Some(t) => {
                let a = &t.alarm;
                alarms.add_row([
                    name.clone(),
                    a.windows.to_string(),
                    a.firing.to_string(),
                    format!("{:.2}%", a.share * 100.0),
                    at(a.first),
                    at(a.worst),
                    if a.would_fire() {
                        "would fire"
                    } else {
                        "quiet"
                    }
                    .to_owned(),
                ])
            }
        };
    }
    let _ = writeln!(out, "{alarms}");
    let mut windows = Table::new();
    windows.load_preset(UTF8_FULL_CONDENSED);
    windows.set_header([
        "endpoint",
        "daily peak",
        "typical hourly P99",
        "peak P99",
        "peak P999",
        "window timeout",
        "patch",
    ]);
    let mut any = false;
    for (name, e) in advice {
        for w in e.timed.iter().flat_map(|t| &t.windows) {
            any = true;
            windows.add_row([
                name.clone(),
                format!("{}-{} {}", w.peak.start, w.peak.end, w.peak.time_zone),
                format_duration(w.peak.typical_p99),
                format_duration(w.peak.percentiles.p99),
                format_duration(w.peak.percentiles.p999),
                format_duration(w.advice.timeout),
                if w.suggested {
                    "windows entry".to_owned()
                } else {
                    "no: the all-day timeout covers it".to_owned()
                },
            ]);
        }
    }
    if any {
        let _ = writeln!(
            out,
            "\nDaily peaks (hourly P99 > 1.5 x the day's median, on most days):\n{windows}"
        );
    } else {
        let _ = writeln!(
            out,
            "\nDaily peaks: none (needs a day or more of timestamped data)"
        );
    }
    let _ = writeln!(out, "\nAlerting rules (PromQL):");
    for (name, e) in advice {
        for rule in alert_rules(name, e, rules) {
            let _ = writeln!(out, "  {name} ({}):\n    {}", rule.when, rule.expr);
        }
    }
    out
}

/// The Prometheus alert expressions of the P99 alarm: one for the endpoint's threshold and
/// one per suggested window. PromQL's `hour()` is UTC, so the hours of a window are written
/// into the expressions only for windows in UTC.
fn alert_rules(name: &str, e: &Endpoint, rules: &Rules<'_>) -> Vec<AlertRule> {
    let mut matchers = format!("{}=\"{}\"", rules.label, escape(name));
    if !rules.selector.trim().is_empty() {
        let _ = write!(matchers, ",{}", rules.selector);
    }
    let p99 = format!(
        "histogram_quantile(0.99, sum by (le) (rate({}_bucket{{{matchers}}}[{}s])))",
        rules.metric,
        rules.window.as_secs().max(1)
    );
    let suggested: Vec<&WindowAdvice> = e
        .timed
        .iter()
        .flat_map(|t| &t.windows)
        .filter(|w| w.suggested)
        .collect();
    let hours = |w: &WindowAdvice| {
        let h = |s: &str| s.get(..2).and_then(|h| h.parse::<u8>().ok()).unwrap_or(0);
        let (start, end) = (h(&w.peak.start), h(&w.peak.end));
        if start < end {
            format!("(hour() >= {start} < {end})")
        } else {
            format!("(hour() >= {start} or hour() < {end})")
        }
    };
    let utc = suggested.iter().all(|w| w.peak.time_zone == "UTC");
    let mut base = format!("{p99} > {}", e.advice.alarm_above.as_secs_f64());
    let mut when = "all day".to_owned();
    if !suggested.is_empty() {
        if utc {
            for w in &suggested {
                let _ = write!(base, " unless on() {}", hours(w));
            }
            when = "outside the windows".to_owned();
        } else {
            when = "outside the windows (PromQL's hour() is UTC: add the windows' hours yourself)"
                .to_owned();
        }
    }
    let mut out = vec![AlertRule { when, expr: base }];
    for w in suggested {
        let mut expr = format!("{p99} > {}", w.advice.alarm_above.as_secs_f64());
        if utc {
            let _ = write!(expr, " and on() {}", hours(w));
        }
        out.push(AlertRule {
            when: format!("{}-{} {}", w.peak.start, w.peak.end, w.peak.time_zone),
            expr,
        });
    }
    out
}

/// A PromQL string's content: `\` and `"` escaped.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}
