//! `demo self-heal --plot`: the CDN outage as users, the client stacks and the center saw it.
//!
//! Three panels on one time axis, the outage shaded and the switch dashed in each: what
//! share of requests failed for users (and what share the backup source answered), how
//! many attempts each call sent, and which policy version the clients ran. Read top to
//! bottom at the dashed line: errors stop, attempts drop to one, the version steps up.

use crate::selfheal::{Bin, Summary};

use super::draw::number;
use super::figure::{Axis, Figure, Panel, Rule, Series, Span, Style};
use super::layout::{empty, panel, steps};

/// The figure of one self-heal run.
pub(crate) fn self_heal(bins: &[Bin], s: &Summary) -> Figure {
    let Some(last) = bins.last() else {
        return empty("self-heal: no data");
    };
    let x_max = last.t + 1.0;
    let x = || Axis::linear("time (s)", 0.0..x_max);
    let outage = match (s.outage_at_s, s.recovered_at_s) {
        (Some(from), Some(to)) => vec![Span {
            from,
            to,
            label: "CDN answers 504".into(),
        }],
        _ => Vec::new(),
    };
    let switch: Vec<Rule> = s
        .fired
        .as_ref()
        .and_then(|f| f.all_applied_s)
        .into_iter()
        .chain(s.reverted.as_ref().and_then(|r| r.all_applied_s))
        .map(|at| Rule {
            at,
            vertical: true,
            label: String::new(),
        })
        .collect();
    let line = |name: &str, style, colour, value: fn(&Bin) -> f64| Series {
        name: name.into(),
        points: steps(bins.iter().map(value), 1.0, x_max),
        style,
        colour,
    };
    let top_version = bins.iter().filter_map(|b| b.version_max).max().unwrap_or(1) as f64;
    let errors = Panel {
        title: format!(
            "Users: {} errors, none after the switch{}",
            s.errors,
            if s.errors_after_switch == 0 {
                String::new()
            } else {
                format!(" but {}", s.errors_after_switch)
            }
        ),
        x: x(),
        y: Axis::linear("share of requests", 0.0..1.05),
        series: vec![
            line("user errors", Style::Line, 0, Bin::error_rate),
            line("answered by the backup", Style::Thin, 1, |b| {
                if b.requests == 0 {
                    0.0
                } else {
                    f64::from(b.from_backup) / f64::from(b.requests)
                }
            }),
        ],
        spans: outage.clone(),
        rules: switch.clone(),
        ..panel()
    };
    let attempts = Panel {
        title: format!(
            "Client stacks: up to {} attempts per request before the switch, {} after",
            s.max_attempts_before, s.max_attempts_switched
        ),
        x: x(),
        y: Axis::linear(
            "attempts per request",
            0.0..f64::from(s.max_attempts_before.max(2)) + 0.5,
        ),
        series: vec![
            line("mean", Style::Line, 2, Bin::attempts_per_request),
            line("most", Style::Thin, 3, |b| f64::from(b.max_attempts)),
        ],
        spans: outage.clone(),
        rules: switch.clone(),
        ..panel()
    };
    let versions = Panel {
        title: match (&s.fired, &s.reverted) {
            (Some(f), Some(r)) => format!(
                "Center: the rule published version {} and reverted with version {}",
                f.version, r.version
            ),
            (Some(f), None) => format!(
                "Center: the rule published version {}, no revert",
                f.version
            ),
            _ => "Center: the rule never fired".to_owned(),
        },
        x: x(),
        y: Axis::linear("policy version", 0.0..top_version + 1.0),
        series: vec![
            line("lowest", Style::Line, 4, |b| {
                b.version_min.unwrap_or(0) as f64
            }),
            line("highest", Style::Thin, 5, |b| {
                b.version_max.unwrap_or(0) as f64
            }),
        ],
        spans: outage,
        rules: switch,
        ..panel()
    };
    Figure {
        title: match s.switch_s {
            Some(t) => format!(
                "Self-healing CDN outage: first 504 to every client switched in {} s",
                number((t * 10.0).round() / 10.0)
            ),
            None => "Self-healing CDN outage: the clients never switched".to_owned(),
        },
        note: "Thick/thin: errors/backup answers, mean/most attempts, lowest/highest version. \
               Shaded: CDN answers 504. Dashed: all switched, then reverted."
            .to_owned(),
        columns: 1,
        panel_size: (1000, 240),
        panels: vec![errors, attempts, versions],
    }
}
