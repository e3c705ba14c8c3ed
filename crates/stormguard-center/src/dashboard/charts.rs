//! Live charts of each downstream: error ratio, P99 and attempts per request, drawn as inline
//! SVG from the collector's recent rounds.
//!
//! The charts are small and simple (one line, a shared time axis, three labelled gridlines),
//! so they are written here as SVG elements rather than through a plotting crate: the
//! browser draws their text with its own fonts, so nothing is measured or bundled, and the
//! page's refresh (`live.js` swapping the overview's live part every two seconds) redraws
//! them. A dashed mark shows when each version was published, so a change in the lines can
//! be matched to the policy change that caused it (or that a rule made because of it). A
//! gap in the data (a round without traffic to the endpoint) is a gap in the line.

use maud::{Markup, html};

use crate::server::{Center, now_ms};

/// The chart's size in SVG units (it scales with the page).
const WIDTH: f64 = 360.0;
const HEIGHT: f64 = 150.0;
const LEFT: f64 = 52.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 24.0;

/// One downstream's recent values, oldest first: `(at_ms, value)`, `None` for a round
/// without traffic to it.
#[derive(Debug, Default)]
pub(crate) struct Downstream {
    pub(crate) endpoint: String,
    pub(crate) error_ratio: Vec<(i64, Option<f64>)>,
    pub(crate) p99_seconds: Vec<(i64, Option<f64>)>,
    pub(crate) attempts_per_request: Vec<(i64, Option<f64>)>,
}

/// What a chart shows: its title, how values are written, and the least top of its axis
/// (so that a flat 0 % does not fill the chart).
struct Measure {
    title: &'static str,
    class: &'static str,
    format: fn(f64) -> String,
    least_top: f64,
}

const ERROR_RATIO: Measure = Measure {
    title: "Error ratio",
    class: "errors",
    format: percent,
    least_top: 0.1,
};
const P99: Measure = Measure {
    title: "P99 attempt latency",
    class: "p99",
    format: seconds,
    least_top: 0.1,
};
const ATTEMPTS: Measure = Measure {
    title: "Attempts per request",
    class: "attempts",
    format: plain,
    least_top: 2.0,
};

/// The charts of `service`'s downstreams, or a line that says why there are none.
pub(crate) fn section(center: &Center, service: &str, versions: &[(i64, u64)]) -> Markup {
    let downstreams = super::observed(center, service);
    let now = now_ms();
    html! {
        h2 { "Downstreams" span.muted.small { " · live, from the center's metric collection" } }
        @if downstreams.is_empty() {
            p.muted { "No observations of this service yet: the center charts its downstreams once it collects their metrics." }
        }
        @for downstream in &downstreams {
            div.downstream data-endpoint=(downstream.endpoint) {
                h3 { code { (downstream.endpoint) } }
                div.charts {
                    (chart(&ERROR_RATIO, &downstream.error_ratio, versions, now))
                    (chart(&P99, &downstream.p99_seconds, versions, now))
                    (chart(&ATTEMPTS, &downstream.attempts_per_request, versions, now))
                }
            }
        }
    }
}

/// One line chart over the points' time span, ending now, with a mark at each version
/// published in that span (`versions`: when, and its number).
fn chart(
    measure: &Measure,
    points: &[(i64, Option<f64>)],
    versions: &[(i64, u64)],
    now: i64,
) -> Markup {
    let latest = points.iter().rev().find_map(|(_, v)| *v);
    let top = nice_top(
        points
            .iter()
            .filter_map(|(_, v)| *v)
            .fold(measure.least_top, f64::max),
    );
    let start = points
        .first()
        .map_or(now - 60_000, |(t, _)| *t)
        .min(now - 10_000);
    let span = (now - start).max(1) as f64;
    let x = |t: i64| LEFT + (t - start) as f64 / span * (WIDTH - LEFT - RIGHT);
    let y = |v: f64| TOP + (1.0 - (v / top).clamp(0.0, 1.0)) * (HEIGHT - TOP - BOTTOM);
    let line = path(points, x, y);
    let label = format!(
        "{}: {}",
        measure.title,
        latest.map_or_else(|| "no traffic".to_owned(), measure.format)
    );
    html! {
        figure.chart {
            figcaption { (measure.title) " " strong.now { (latest.map_or_else(|| "—".to_owned(), measure.format)) } }
            svg class={"chart " (measure.class)} viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(label) {
                @for fraction in [0.0, 0.5, 1.0] {
                    line.grid x1=(LEFT) x2=(WIDTH - RIGHT) y1=(y(top * fraction)) y2=(y(top * fraction)) {}
                    text.tick x=(LEFT - 6.0) y=(y(top * fraction) + 4.0) text-anchor="end" { ((measure.format)(top * fraction)) }
                }
                text.tick x=(LEFT) y=(HEIGHT - 6.0) text-anchor="start" { (minutes_ago(now - start)) }
                text.tick x=(WIDTH - RIGHT) y=(HEIGHT - 6.0) text-anchor="end" { "now" }
                @for (at, label) in marks(versions, start, now, x) {
                    line.mark x1=(x(at)) x2=(x(at)) y1=(TOP) y2=(HEIGHT - BOTTOM) {}
                    @if let Some(version) = label {
                        text.mark x=(x(at) - 3.0) y=(TOP + 9.0) text-anchor="end" { "v" (version) }
                    }
                }
                path.line d=(line) {}
            }
        }
    }
}

/// The versions published between `start` and `now` (newest first, as the history reads),
/// each with its number as a label unless a newer one's label is too close to it.
fn marks(
    versions: &[(i64, u64)],
    start: i64,
    now: i64,
    x: impl Fn(i64) -> f64,
) -> Vec<(i64, Option<u64>)> {
    const LABEL_ROOM: f64 = 24.0;
    let mut last_label: Option<f64> = None;
    versions
        .iter()
        .filter(|(at, _)| (start..=now).contains(at))
        .map(|&(at, version)| {
            let free = last_label.is_none_or(|last| (last - x(at)).abs() >= LABEL_ROOM);
            if free {
                last_label = Some(x(at));
            }
            (at, free.then_some(version))
        })
        .collect()
}

/// The SVG path through the points, broken where a value is missing.
fn path(points: &[(i64, Option<f64>)], x: impl Fn(i64) -> f64, y: impl Fn(f64) -> f64) -> String {
    let mut d = String::new();
    let mut pen_down = false;
    for (t, value) in points {
        match value {
            Some(v) => {
                let command = if pen_down { 'L' } else { 'M' };
                d.push_str(&format!("{command}{:.1},{:.1} ", x(*t), y(*v)));
                pen_down = true;
            }
            None => pen_down = false,
        }
    }
    d
}

/// The smallest of 1, 2, 2.5, 5 × 10ⁿ at or above `value` (a round top for the axis).
fn nice_top(value: f64) -> f64 {
    if !(value.is_finite() && value > 0.0) {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|step| step * magnitude)
        .find(|top| *top >= value * 0.999_999)
        .unwrap_or(10.0 * magnitude)
}

fn percent(value: f64) -> String {
    let percent = value * 100.0;
    if percent == 0.0 || percent >= 10.0 {
        format!("{percent:.0}%")
    } else {
        format!("{percent:.1}%")
    }
}

fn seconds(value: f64) -> String {
    if value >= 1.0 {
        format!("{value:.1} s")
    } else {
        format!("{:.0} ms", value * 1000.0)
    }
}

fn plain(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

fn minutes_ago(span_ms: i64) -> String {
    let secs = span_ms / 1000;
    if secs < 120 {
        format!("−{secs} s")
    } else {
        format!("−{} min", secs / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_tops_are_round() {
        assert_eq!(nice_top(0.07), 0.1);
        assert_eq!(nice_top(0.1), 0.1);
        assert_eq!(nice_top(0.13), 0.2);
        assert_eq!(nice_top(2.2), 2.5);
        assert_eq!(nice_top(3.0), 5.0);
        assert_eq!(nice_top(0.0), 1.0);
        assert_eq!(nice_top(f64::NAN), 1.0);
    }

    #[test]
    fn a_missing_value_breaks_the_line() {
        let points = [(0, Some(1.0)), (1, Some(2.0)), (2, None), (3, Some(1.0))];
        let d = path(&points, |t| t as f64, |v| v);
        assert_eq!(d, "M0.0,1.0 L1.0,2.0 M3.0,1.0 ");
    }

    #[test]
    fn close_version_marks_keep_the_newest_label() {
        let versions = [(100, 3), (99, 2), (10, 1)];
        let marks = marks(&versions, 0, 100, |t| t as f64);
        assert_eq!(marks, [(100, Some(3)), (99, None), (10, Some(1))]);
    }

    #[test]
    fn values_are_written_as_people_write_them() {
        assert_eq!(percent(0.0), "0%");
        assert_eq!(percent(0.05), "5.0%");
        assert_eq!(percent(0.5), "50%");
        assert_eq!(seconds(0.25), "250 ms");
        assert_eq!(seconds(1.5), "1.5 s");
        assert_eq!(plain(3.0), "3");
        assert_eq!(plain(1.25), "1.25");
    }
}
