//! Each scenario's report as a [`Figure`] that answers the scenario's question.
//!
//! | scenario | question | figure |
//! | --- | --- | --- |
//! | storm | does the strategy spread the retries? | a panel per strategy, log counts per bin |
//! | chain | how much does each hop multiply? | requests per entry request per hop, log scale |
//! | budget | how soon does each budget cut retries? | a panel per budget kind, the drop marked |
//! | overload | does goodput come back? | a panel per protection, the trigger shaded |
//! | occ | which jitter needs the fewest writes? | bars per strategy (lines over several client counts) |
//! | converge | how fast does the limit follow a slower handler? | a panel per algorithm, limit and in-flight, the change marked |
//! | policy | what does my graph do around a fault? | a panel per service, load arriving per graph version, the faults shaded |

use stormguard::duration::format_duration;
use stormguard_sim::scenario::budget::BudgetReport;
use stormguard_sim::scenario::chain::ChainReport;
use stormguard_sim::scenario::converge::{ConvergePoint, ConvergeReport};
use stormguard_sim::scenario::occ::OccReport;
use stormguard_sim::scenario::overload::{OverloadReport, Trigger};
use stormguard_sim::scenario::storm::StormReport;
use stormguard_sim::scenario::whatif::{ServiceRow, WhatIfReport};

use super::draw::number;
use super::figure::{Axis, Figure, Note, Panel, Rule, Series, Span, Style};
use super::layout::{columns_for, empty, panel, panel_size_for, round_up, steps, time_of_share};

/// The storm's time axis ends where this share of every strategy's retries has been sent.
const STORM_SHARE_SHOWN: f64 = 0.95;

/// Retries per bin after the correlated failure, one panel per strategy on shared axes.
///
/// Plain backoff sends every client's k-th retry in the same bin, so on one chart the
/// strategies' spikes land on the same instants and hide each other, and the jittered curves
/// lie flat under them. Here each strategy has its own panel, the count axis is logarithmic
/// (a spike of every client and a band of a hundred read on the same scale), each bin is a
/// bar, and time ends where 95 % of every strategy's retries are sent (decorrelated jitter's
/// thin tail runs far beyond; its panel's title gives its last retry).
pub(crate) fn storm(r: &StormReport) -> Figure {
    let Some(first) = r.rows.first() else {
        return empty("storm: no rows");
    };
    let p = &first.parameters;
    let bin = p.bin.as_secs_f64();
    let until = r
        .rows
        .iter()
        .map(|row| time_of_share(&row.per_bin, bin, STORM_SHARE_SHOWN))
        .fold(bin, f64::max);
    let x_max = round_up(until);
    let peak = r.rows.iter().map(|row| row.peak_per_bin).max().unwrap_or(1);
    let y = Axis::log(
        format!("retries per {}", format_duration(p.bin)),
        0.8..round_up(peak as f64) * 1.5,
    );
    let panels = r
        .rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let mut title = format!(
                "{}: peak {} at {} s",
                row.label,
                row.peak_per_bin,
                number(row.peak_at_s)
            );
            if row.last_retry_s > x_max {
                title += &format!(", last retry {} s", number(row.last_retry_s.round()));
            }
            Panel {
                title,
                x: Axis::linear("time (s)", 0.0..x_max),
                y: y.clone(),
                series: vec![Series {
                    name: row.label.into(),
                    points: row
                        .per_bin
                        .iter()
                        .enumerate()
                        .map(|(k, &c)| (k as f64 * bin, c as f64))
                        .take_while(|&(x, _)| x < x_max)
                        .collect(),
                    style: Style::Bins(bin),
                    colour: i,
                }],
                ..panel()
            }
        })
        .collect();
    Figure {
        title: format!(
            "Retries per {} after {} clients fail at once ({} retries each)",
            format_duration(p.bin),
            p.clients,
            p.retries
        ),
        note: "Log scale, shared axes. A tall thin spike: every client retries in the same \
               instant. A low wide band: jitter spreads them."
            .into(),
        columns: columns_for(r.rows.len()),
        panel_size: panel_size_for(r.rows.len()),
        panels,
    }
}

/// Requests seen per entry request at each hop, per mode (log scale), with each mode's
/// figure at the service.
pub(crate) fn chain(r: &ChainReport) -> Figure {
    let Some(first) = r.rows.first() else {
        return empty("chain: no rows");
    };
    let hops = first.amplification_per_layer.len();
    let names = (0..hops)
        .map(|k| match k {
            0 => "entry".to_string(),
            k if k + 1 == hops => "service".to_string(),
            k => format!("layer {}", k + 1),
        })
        .collect();
    let top = r
        .rows
        .iter()
        .flat_map(|row| row.amplification_per_layer.iter().copied())
        .fold(1.0, f64::max);
    let series = r
        .rows
        .iter()
        .enumerate()
        .map(|(i, row)| Series {
            name: row.label.into(),
            points: row
                .amplification_per_layer
                .iter()
                .enumerate()
                .map(|(k, &a)| (k as f64, a))
                .collect(),
            style: Style::Points,
            colour: i,
        })
        .collect();
    let notes = r
        .rows
        .iter()
        .enumerate()
        .filter_map(|(i, row)| {
            let last = *row.amplification_per_layer.last()?;
            Some(Note {
                at: ((hops - 1) as f64, last),
                text: format!("{}x", number(last)),
                colour: i,
            })
        })
        .collect();
    let p = &first.parameters;
    Figure {
        title: "Requests per entry request at each hop of the chain".into(),
        note: format!(
            "Log scale. {} layers, the service fails {} % of attempts: retries multiply down \
             the chain unless one layer retries or every layer is budgeted.",
            p.layers,
            number(p.fail_prob * 100.0)
        ),
        panels: vec![Panel {
            title: String::new(),
            x: Axis::names("hop (entry first)", names),
            y: Axis::log("requests per entry request", 0.8..round_up(top) * 1.6).with_suffix("x"),
            series,
            notes,
            legend: true,
            ..panel()
        }],
        columns: 1,
        panel_size: (1000, 540),
    }
}

/// Retries per second over time, one panel per budget kind, the success drop marked; each
/// title says how soon the budget refused a retry and where it ends.
pub(crate) fn budget(r: &BudgetReport) -> Figure {
    let Some(first) = r.rows.first() else {
        return empty("budget: no rows");
    };
    let p = &first.parameters;
    let bin = p.bin.as_secs_f64();
    let x_max = p.duration.as_secs_f64();
    let top = r
        .rows
        .iter()
        .flat_map(|row| row.retries_per_s.iter().copied())
        .fold(1.0, f64::max);
    // Unlabelled: a label at the line would sit on the y axis or on the data; the note says
    // what the line is.
    let drop = Rule {
        at: p.step_at.as_secs_f64(),
        vertical: true,
        label: String::new(),
    };
    let panels = r
        .rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let after = number(row.retries_per_s_after.round());
            let title = match row.shutoff_ms {
                Some(ms) => format!(
                    "{}: refuses after {} ms, ends at {after} retries/s",
                    row.label,
                    number(ms)
                ),
                None => format!("{}: never refuses, ends at {after} retries/s", row.label),
            };
            Panel {
                title,
                x: Axis::linear("time (s)", 0.0..x_max),
                y: Axis::linear("retries per second", 0.0..round_up(top) * 1.05),
                series: vec![Series {
                    name: row.label.into(),
                    points: steps(row.retries_per_s.iter().copied(), bin, x_max),
                    style: Style::Line,
                    colour: i,
                }],
                rules: vec![drop.clone()],
                ..panel()
            }
        })
        .collect();
    Figure {
        title: format!(
            "Retries per second when the success rate drops ({} requests/s)",
            number(p.rate)
        ),
        note: format!(
            "Shared axes, one panel per budget kind. Dashed: at {} s success drops from {} % to \
             {} %.",
            number(p.step_at.as_secs_f64()),
            number(p.before * 100.0),
            number(p.after * 100.0)
        ),
        columns: columns_for(r.rows.len()),
        panel_size: panel_size_for(r.rows.len()),
        panels,
    }
}

/// Goodput (thick) and offered load (thin) per protection, the trigger shaded and the
/// capacity dashed; each title says whether and when goodput came back.
pub(crate) fn overload(r: &OverloadReport) -> Figure {
    let Some(first) = r.rows.first() else {
        return empty("overload: no rows");
    };
    let p = &first.parameters;
    let bin = p.bin.as_secs_f64();
    let x_max = p.duration.as_secs_f64();
    let top = r
        .rows
        .iter()
        .flat_map(|row| row.series.iter().map(|s| s.offered.max(s.goodput)))
        .fold(p.capacity, f64::max);
    let trigger = match p.trigger {
        Trigger::Outage => "outage".to_string(),
        Trigger::CapacityDrop => format!("capacity x {}", number(p.drop_to)),
        Trigger::Spike => format!("spike +{}/s", number(p.spike)),
    };
    let start = p.trigger_at.as_secs_f64();
    let span = Span {
        from: start,
        to: start + p.trigger_for.as_secs_f64(),
        label: trigger.clone(),
    };
    let capacity = Rule {
        at: p.capacity,
        vertical: false,
        label: format!("capacity {}/s", number(p.capacity)),
    };
    let panels = r
        .rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let verdict = match (row.recovered, row.recovery_s) {
                (true, Some(s)) if s >= bin => {
                    format!("recovers {} s after the {trigger} ends", number(s))
                }
                (true, _) => format!("recovers as soon as the {trigger} ends"),
                (false, _) => format!(
                    "stuck: goodput {}/s, offered {}/s at the end",
                    number(row.goodput_after.round()),
                    number(row.offered_after.round())
                ),
            };
            let series = |name: &str, style, value: fn(&(f64, f64)) -> f64| Series {
                name: name.into(),
                points: steps(
                    row.series.iter().map(|s| value(&(s.goodput, s.offered))),
                    bin,
                    x_max,
                ),
                style,
                colour: i,
            };
            Panel {
                title: format!("{}: {verdict}", row.label),
                x: Axis::linear("time (s)", 0.0..x_max),
                y: Axis::linear("requests per second", 0.0..round_up(top) * 1.05),
                series: vec![
                    series("offered load", Style::Thin, |v| v.1),
                    series("goodput", Style::Line, |v| v.0),
                ],
                spans: vec![span.clone()],
                rules: vec![capacity.clone()],
                legend: i == 0,
                ..panel()
            }
        })
        .collect();
    Figure {
        title: format!("Goodput around the {trigger}, per protection"),
        note: "Thick: goodput. Thin: load offered to the server. Shaded: the trigger. Dashed: \
               capacity."
            .into(),
        columns: 1,
        panel_size: (1000, 220),
        panels,
    }
}

/// The limit (thick) and the requests in flight (thin) per limit algorithm, the change
/// marked; each title says when the round trip was short again.
pub(crate) fn converge(r: &ConvergeReport) -> Figure {
    let Some(first) = r.rows.first() else {
        return empty("converge: no rows");
    };
    let p = &first.parameters;
    let bin = p.bin.as_secs_f64();
    let x_max = p.duration.as_secs_f64();
    let top = r
        .rows
        .iter()
        .flat_map(|row| row.series.iter().map(|s| s.limit.max(s.in_flight)))
        .fold(p.workers, u32::max);
    let change = Rule {
        at: p.change_at.as_secs_f64(),
        vertical: true,
        label: String::new(),
    };
    let workers = Rule {
        at: f64::from(p.workers),
        vertical: false,
        label: format!("{} workers", p.workers),
    };
    let panels = r
        .rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let verdict = match row.converged_s {
                Some(s) if s >= bin => format!("converged {} s after the change", number(s)),
                Some(_) => "converged within a bin of the change".to_string(),
                None => "never converged".to_string(),
            };
            let series = |name: &str, style, value: fn(&ConvergePoint) -> u32| Series {
                name: name.into(),
                points: steps(row.series.iter().map(|s| f64::from(value(s))), bin, x_max),
                style,
                colour: i,
            };
            Panel {
                title: format!(
                    "{}: {verdict}; goodput {} % before, {} % after",
                    row.label,
                    number((row.goodput_before * 100.0).round()),
                    number((row.goodput_after * 100.0).round())
                ),
                x: Axis::linear("time (s)", 0.0..x_max),
                y: Axis::log("requests", 1.0..round_up(f64::from(top)) * 1.2),
                series: vec![
                    series("in flight", Style::Thin, |s| s.in_flight.max(1)),
                    series("limit", Style::Line, |s| s.limit.max(1)),
                ],
                rules: vec![change.clone(), workers.clone()],
                legend: i == 0,
                ..panel()
            }
        })
        .collect();
    Figure {
        title: format!(
            "The adaptive limit when the handler gets {}x slower",
            number(p.slowdown)
        ),
        note: format!(
            "Thick: the limit. Thin: requests in flight (queued or in service). Dashed: the \
             change at {} s, and the workers. {}x the first capacity offered.",
            number(p.change_at.as_secs_f64()),
            number(p.load)
        ),
        columns: 1,
        panel_size: (1000, 220),
        panels,
    }
}

/// Writes to the contended row and time to finish, per strategy: bars for one number of
/// clients, lines over several.
pub(crate) fn occ(r: &OccReport) -> Figure {
    let Some(first) = r.rows.first() else {
        return empty("occ: no rows");
    };
    let p = &first.parameters;
    let mut strategies = Vec::new();
    for row in &r.rows {
        if !strategies.contains(&row.strategy) {
            strategies.push(row.strategy);
        }
    }
    let one = p.clients.len() == 1;
    let measure = |label: &str, value: fn(f64, f64) -> f64| {
        let top = r
            .rows
            .iter()
            .map(|row| value(row.calls, row.completion_ms))
            .fold(0.0, f64::max);
        let mut series: Vec<Series> = Vec::new();
        let mut notes = Vec::new();
        for row in &r.rows {
            let colour = strategies
                .iter()
                .position(|s| *s == row.strategy)
                .unwrap_or(0);
            let v = value(row.calls, row.completion_ms);
            let x = if one {
                notes.push(Note {
                    at: (colour as f64 - 0.3, v),
                    text: number(if v >= 10.0 {
                        v.round()
                    } else {
                        (v * 10.0).round() / 10.0
                    }),
                    colour,
                });
                colour as f64
            } else {
                f64::from(row.clients)
            };
            match series.iter_mut().find(|s| s.colour == colour) {
                Some(s) => s.points.push((x, v)),
                None => series.push(Series {
                    name: row.label.into(),
                    points: vec![(x, v)],
                    style: if one { Style::Bars } else { Style::Points },
                    colour,
                }),
            }
        }
        let x = if one {
            Axis::names(
                "strategy",
                strategies.iter().map(|s| s.name().to_string()).collect(),
            )
        } else {
            let (lo, hi) = r.rows.iter().fold((f64::MAX, 0.0f64), |(lo, hi), row| {
                let c = f64::from(row.clients);
                (lo.min(c), hi.max(c))
            });
            Axis::linear("clients", 0.0..round_up(hi.max(lo + 1.0)))
        };
        Panel {
            title: label.to_string(),
            x,
            y: Axis::linear(label, 0.0..round_up(top) * 1.1),
            series,
            notes,
            legend: !one,
            ..panel()
        }
    };
    let clients = match p.clients.as_slice() {
        [n] => format!("{n} clients"),
        _ => "by number of clients".to_string(),
    };
    Figure {
        title: format!("Clients updating one optimistically locked row, {clients}"),
        note: format!(
            "Mean of {} runs. Fewer writes means less work for the contended row; an earlier \
             finish means less waiting.",
            p.runs
        ),
        panels: vec![
            measure("writes per run", |calls, _| calls),
            measure("time to finish (s)", |_, ms| ms / 1e3),
        ],
        columns: 2,
        panel_size: (550, 420),
    }
}

/// An empty panel to fill in.
/// `simulate policy`: one panel per service, requests arriving per second over time for
/// each graph version (thick: the graph, thin: `--against`), the faults shaded; each title
/// gives the amplification and when the service recovers.
pub(crate) fn whatif(reports: &[WhatIfReport]) -> Figure {
    let Some(first) = reports.first() else {
        return empty("policy: no report");
    };
    let p = &first.parameters;
    let bin = p.bin.as_secs_f64();
    let x_max = p.duration.as_secs_f64();
    let spans: Vec<Span> = p
        .injections
        .iter()
        .map(|i| Span {
            from: i.start.as_secs_f64(),
            to: i.end().as_secs_f64().min(x_max),
            label: i.to_string(),
        })
        .collect();
    let panels: Vec<Panel> = first
        .services
        .iter()
        .map(|row| {
            let versions: Vec<(&WhatIfReport, &ServiceRow)> = reports
                .iter()
                .filter_map(|r| r.service(&row.service).map(|s| (r, s)))
                .collect();
            let top = versions
                .iter()
                .map(|(_, s)| s.peak_per_sec)
                .fold(1.0, f64::max);
            let verdicts: Vec<String> = versions
                .iter()
                .map(|(r, s)| {
                    let recovery = match (p.injections.is_empty(), s.recover_s) {
                        (true, _) => String::new(),
                        (false, Some(secs)) => format!(", back after {} s", number(secs)),
                        (false, None) => ", never back".to_string(),
                    };
                    format!("{} {}x{recovery}", r.version, number(s.amplification))
                })
                .collect();
            let series = versions
                .iter()
                .enumerate()
                .map(|(i, (r, s))| Series {
                    name: format!("{} arriving", r.version),
                    points: steps(s.offered_series.iter().map(|&c| c as f64 / bin), bin, x_max),
                    style: if i == 0 { Style::Line } else { Style::Thin },
                    colour: i,
                })
                .collect();
            Panel {
                title: format!("{}: {}", row.service, verdicts.join("; ")),
                x: Axis::linear("time (s)", 0.0..x_max),
                y: Axis::linear("requests per second", 0.0..round_up(top) * 1.05),
                series,
                spans: spans.clone(),
                legend: reports.len() > 1,
                ..panel()
            }
        })
        .collect();
    let n = panels.len();
    Figure {
        title: "Load at each service around the faults".into(),
        note: "Requests arriving per second (thick: --graph, thin: --against). Shaded: the injected faults."
            .into(),
        columns: columns_for(n),
        panel_size: panel_size_for(n),
        panels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stormguard_sim::progress::NoProgress;
    use stormguard_sim::scenario::{budget, chain, converge, occ, overload, storm};

    #[test]
    fn the_storm_has_a_panel_per_strategy_on_shared_axes_cut_where_the_retries_end() {
        let report =
            storm::run(&storm::StormConfig::default(), &mut NoProgress).expect("default runs");
        let figure = super::storm(&report);
        assert_eq!(figure.panels.len(), 6);
        let y = &figure.panels[0].y;
        assert!(y.log);
        assert!(
            figure
                .panels
                .iter()
                .all(|p| p.y == *y && p.x == figure.panels[0].x)
        );
        // Decorrelated jitter's last retry is near 62 s; the axis stops well before, where
        // 95 % of every strategy's retries are sent (exponential's 1000 at 15 s included).
        let x_end = figure.panels[0].x.range.end;
        assert!((15.0..=40.0).contains(&x_end), "{x_end}");
        assert_eq!(figure.panels[0].series[0].style, Style::Bins(0.1));
        assert!(
            figure.panels[5].title.contains("last retry"),
            "{}",
            figure.panels[5].title
        );
        assert!(figure.panels[0].title.contains("peak 1000"));
    }

    #[test]
    fn every_default_figure_answers_in_its_titles() {
        let chain = super::chain(
            &chain::run(&chain::ChainConfig::default(), &mut NoProgress).expect("runs"),
        );
        assert_eq!(
            chain.panels[0].x.names.first().map(String::as_str),
            Some("entry")
        );
        assert!(chain.panels[0].notes.iter().any(|n| n.text == "27x"));
        let budget = super::budget(
            &budget::run(&budget::BudgetConfig::default(), &mut NoProgress).expect("runs"),
        );
        assert!(
            budget
                .panels
                .iter()
                .any(|p| p.title.contains("refuses after"))
        );
        assert!(budget.panels.iter().all(|p| p.rules.len() == 1));
        let overload = super::overload(
            &overload::run(&overload::OverloadConfig::default(), &mut NoProgress).expect("runs"),
        );
        assert!(
            overload.panels[0].title.contains("stuck"),
            "{}",
            overload.panels[0].title
        );
        assert!(overload.panels[1].title.contains("recovers"));
        assert!(overload.panels.iter().all(|p| p.spans.len() == 1));
        let occ = super::occ(&occ::run(&occ::OccConfig::default(), &mut NoProgress).expect("runs"));
        assert_eq!(occ.panels[0].series[0].style, Style::Bars);
        assert_eq!(occ.panels[0].x.names.len(), 4);
        let converge = super::converge(
            &converge::run(&converge::ConvergeConfig::default(), &mut NoProgress).expect("runs"),
        );
        assert!(
            converge.panels[0].title.starts_with("vegas: converged"),
            "{}",
            converge.panels[0].title
        );
        assert!(converge.panels[1].title.contains("never converged"));
        assert!(converge.panels.iter().all(|p| p.rules[0].vertical));
    }
}
