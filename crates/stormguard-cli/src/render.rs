//! Human-readable tables for each scenario's report.
//!
//! Tables are built with comfy-table without terminal detection (no width probing, no
//! colour), so the bytes printed depend on the report alone: the same seed prints the same
//! output in a terminal, a pipe or a test.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, Table};
use stormguard::duration::format_duration;
use stormguard_sim::scenario::budget::BudgetReport;
use stormguard_sim::scenario::chain::ChainReport;
use stormguard_sim::scenario::converge::ConvergeReport;
use stormguard_sim::scenario::occ::OccReport;
use stormguard_sim::scenario::overload::OverloadReport;
use stormguard_sim::scenario::storm::StormReport;
use stormguard_sim::scenario::whatif::{ServiceRow, WhatIfReport};

/// At most this many rows in a printed time series; longer series are averaged down.
const MAX_TIMELINE_ROWS: usize = 30;

fn table(header: Vec<String>) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    let columns = header.len();
    t.set_header(header);
    for i in 1..columns {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

fn strings<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|s| (*s).to_string()).collect()
}

/// `27x`, `1.331x`.
fn times(x: f64) -> String {
    if (x - x.round()).abs() < 1e-9 {
        format!("{x:.0}x")
    } else {
        format!("{x:.3}x")
    }
}

fn percent(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// Averages a series down to at most [`MAX_TIMELINE_ROWS`] rows: `(first index, step)`.
fn timeline_step(len: usize) -> usize {
    len.div_ceil(MAX_TIMELINE_ROWS).max(1)
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// The storm table, in the seeds' layout.
pub(crate) fn storm(r: &StormReport) -> String {
    let Some(first) = r.rows.first() else {
        return String::new();
    };
    let p = &first.parameters;
    let mut t = table(vec![
        "strategy".into(),
        "total retries".into(),
        format!("peak / {}", format_duration(p.bin)),
        "peak at".into(),
        "last retry".into(),
    ]);
    for row in &r.rows {
        t.add_row(vec![
            row.label.to_string(),
            row.total_retries.to_string(),
            row.peak_per_bin.to_string(),
            format!("{:.1} s", row.peak_at_s),
            format!("{:.1} s", row.last_retry_s),
        ]);
    }
    format!(
        "storm: {} clients fail at t = 0 and retry {} times each; base {}, cap {}, seed {}\n{t}\n",
        p.clients,
        p.retries,
        format_duration(p.base),
        format_duration(p.cap),
        p.seed
    )
}

/// The chain table: requests per layer per entry request.
pub(crate) fn chain(r: &ChainReport) -> String {
    let Some(first) = r.rows.first() else {
        return String::new();
    };
    let p = &first.parameters;
    let mut header = vec!["mode".to_string()];
    header.extend((1..=p.layers).map(|i| format!("layer {i}")));
    header.extend(["service".to_string(), "success".to_string()]);
    let mut t = table(header);
    for row in &r.rows {
        let mut cells = vec![row.label.to_string()];
        cells.extend(row.amplification_per_layer.iter().map(|&x| times(x)));
        cells.push(percent(row.success_rate));
        t.add_row(cells);
    }
    let retries: Vec<String> = p.retries.iter().map(u32::to_string).collect();
    format!(
        "chain: {} layers retrying {} time(s) each over a service failing {} of attempts; \
         {} entry requests/s for {}; requests per entry request\n{t}\n",
        p.layers,
        retries.join(","),
        percent(p.fail_prob),
        p.rate,
        format_duration(p.duration)
    )
}

/// The budget summary, then retries per second over time, one column per budget kind.
pub(crate) fn budget(r: &BudgetReport) -> String {
    let Some(first) = r.rows.first() else {
        return String::new();
    };
    let p = &first.parameters;
    let mut t = table(strings([
        "budget",
        "shut off after",
        "retries/s before",
        "retries/s after",
        "retries / requests",
        "attempts / request",
        "success after",
        "refused",
    ]));
    for row in &r.rows {
        t.add_row(vec![
            row.label.to_string(),
            row.shutoff_ms
                .map_or_else(|| "never".to_string(), |ms| format!("{ms:.1} ms")),
            format!("{:.0}", row.retries_per_s_before),
            format!("{:.0}", row.retries_per_s_after),
            percent(row.retry_share_after),
            format!("{:.3}", row.load_after),
            percent(row.success_after),
            row.refused.to_string(),
        ]);
    }
    let mut header = vec!["t".to_string()];
    header.extend(r.rows.iter().map(|row| row.strategy.name().to_string()));
    let mut series = table(header);
    let len = first.retries_per_s.len();
    let step = timeline_step(len);
    let bin = p.bin.as_secs_f64() * step as f64;
    for start in (0..len).step_by(step) {
        let mut cells = vec![format!("{:.2} s", start as f64 * p.bin.as_secs_f64())];
        for row in &r.rows {
            let v = mean(row.retries_per_s.iter().skip(start).take(step).copied());
            cells.push(format!("{v:.0}"));
        }
        series.add_row(cells);
    }
    format!(
        "budget: {} requests/s, success {} until {} then {}; {} retries per request; \
         after = the last second\n{t}\n\nretries per second, {} bins\n{series}\n",
        p.rate,
        percent(p.before),
        format_duration(p.step_at),
        percent(p.after),
        p.retries,
        format_duration(std::time::Duration::from_secs_f64(bin)),
    )
}

/// The overload summary, then goodput and offered load side by side over time.
pub(crate) fn overload(r: &OverloadReport) -> String {
    let Some(first) = r.rows.first() else {
        return String::new();
    };
    let p = &first.parameters;
    let mut t = table(strings([
        "protection",
        "goodput before",
        "peak offered",
        "goodput after",
        "offered after",
        "latency after",
        "recovered",
        "recovery",
    ]));
    for row in &r.rows {
        t.add_row(vec![
            row.label.to_string(),
            format!("{:.0}/s", row.goodput_before),
            format!("{:.0}/s", row.offered_peak),
            format!("{:.0}/s", row.goodput_after),
            format!("{:.0}/s", row.offered_after),
            row.latency_after_ms
                .map_or_else(|| "-".to_string(), |ms| format!("{ms:.1} ms")),
            if row.recovered { "yes" } else { "no" }.to_string(),
            row.recovery_s
                .map_or_else(|| "never".to_string(), |s| format!("{s:.0} s")),
        ]);
    }
    let mut header = vec!["t".to_string()];
    for row in &r.rows {
        header.push(format!("{} offered", row.strategy.name()));
        header.push(format!("{} goodput", row.strategy.name()));
    }
    let mut series = table(header);
    let len = first.series.len();
    let step = timeline_step(len);
    for start in (0..len).step_by(step) {
        let t_s = first.series.get(start).map_or(0.0, |pt| pt.t_s);
        let mut cells = vec![format!("{t_s:.0} s")];
        for row in &r.rows {
            let window = || row.series.iter().skip(start).take(step);
            cells.push(format!("{:.0}", mean(window().map(|pt| pt.offered))));
            cells.push(format!("{:.0}", mean(window().map(|pt| pt.goodput))));
        }
        series.add_row(cells);
    }
    let trigger = match p.trigger {
        stormguard_sim::scenario::overload::Trigger::Outage => "outage".to_string(),
        stormguard_sim::scenario::overload::Trigger::CapacityDrop => {
            format!("capacity x {}", p.drop_to)
        }
        stormguard_sim::scenario::overload::Trigger::Spike => format!("+{} requests/s", p.spike),
    };
    format!(
        "overload: {} requests/s against capacity {}/s ({}x slower above), timeout {}, \
         {} retry; trigger: {} from {} for {}; after = the last {} s\n{t}\n\n\
         requests per second (offered, goodput)\n{series}\n",
        p.rate,
        p.capacity,
        p.slowdown,
        format_duration(p.timeout),
        p.retries,
        trigger,
        format_duration(p.trigger_at),
        format_duration(p.trigger_for),
        first.after_window_s,
    )
}

/// The OCC table.
pub(crate) fn occ(r: &OccReport) -> String {
    let Some(first) = r.rows.first() else {
        return String::new();
    };
    let p = &first.parameters;
    let mut t = table(strings(["strategy", "clients", "calls", "completion"]));
    for row in &r.rows {
        t.add_row(vec![
            row.label.to_string(),
            row.clients.to_string(),
            format!("{:.0}", row.calls),
            format!("{:.0} ms", row.completion_ms),
        ]);
    }
    format!(
        "occ: clients contending on one row, network |N({}, {})|, backoff base {}, cap {}; \
         mean of {} runs\n{t}\n",
        format_duration(p.delay),
        format_duration(p.delay_sd),
        format_duration(p.base),
        format_duration(p.cap),
        p.runs
    )
}

/// The convergence table.
pub(crate) fn converge(r: &ConvergeReport) -> String {
    let Some(first) = r.rows.first() else {
        return String::new();
    };
    let p = &first.parameters;
    let mut t = table(strings([
        "limit",
        "limit before",
        "limit after",
        "goodput before",
        "goodput after",
        "RTT after",
        "converged",
        "shed",
        "timed out",
    ]));
    for row in &r.rows {
        t.add_row(vec![
            row.label.to_string(),
            format!("{:.1}", row.limit_before),
            format!("{:.1}", row.limit_after),
            percent(row.goodput_before),
            percent(row.goodput_after),
            row.rtt_after_ms
                .map_or_else(|| "-".into(), |ms| format!("{ms:.1} ms")),
            row.converged_s
                .map_or_else(|| "never".into(), |s| format!("{s} s")),
            row.shed.to_string(),
            row.timed_out.to_string(),
        ]);
    }
    format!(
        "converge: {} workers, {} of work per request, {}x slower from {}; {}x the first \
         capacity ({:.0}/s) offered, timeout {}\n{t}\n",
        p.workers,
        format_duration(p.service),
        p.slowdown,
        format_duration(p.change_at),
        p.load,
        p.load * p.capacity_before(),
        format_duration(p.timeout),
    )
}

/// `simulate policy`: one row per service; with `--against`, each cell reads
/// `graph | against`.
pub(crate) fn whatif(reports: &[WhatIfReport]) -> String {
    let Some(first) = reports.first() else {
        return String::new();
    };
    let p = &first.parameters;
    let mut t = table(strings([
        "service",
        "offered/s",
        "peak/s",
        "amplification",
        "success",
        "served",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "queue peak/end",
        "recovers after",
    ]));
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
    for row in &first.services {
        let cell = |f: &dyn Fn(&ServiceRow) -> String| {
            reports
                .iter()
                .map(|r| r.service(&row.service).map_or_else(|| "-".to_string(), f))
                .collect::<Vec<_>>()
                .join(" | ")
        };
        t.add_row(vec![
            row.service.clone(),
            cell(&|s| format!("{:.0}", s.offered_per_sec)),
            cell(&|s| format!("{:.0}", s.peak_per_sec)),
            cell(&|s| times(s.amplification)),
            cell(&|s| percent(s.success_rate)),
            cell(&|s| percent(s.served)),
            cell(&|s| ms(s.p50_ms)),
            cell(&|s| ms(s.p99_ms)),
            cell(&|s| ms(s.p999_ms)),
            cell(&|s| format!("{}/{}", s.queue_peak, s.queue_at_end)),
            cell(&|s| match (p.injections.is_empty(), s.recover_s) {
                (true, _) => "-".to_string(),
                (false, Some(secs)) => format!("{secs} s"),
                (false, None) => "never".to_string(),
            }),
        ]);
    }
    let faults: Vec<String> = p.injections.iter().map(ToString::to_string).collect();
    let versions: Vec<String> = reports
        .iter()
        .map(|r| {
            format!(
                "{}: {} entry requests, {} succeeded",
                r.version,
                r.entry_requests,
                percent(r.entry_success_rate)
            )
        })
        .collect();
    format!(
        "policy: {} for {}{}; faults: {}\n{}\n{t}\n",
        if reports.len() > 1 {
            "graph | against"
        } else {
            "graph"
        },
        format_duration(p.duration),
        p.rate
            .map_or_else(String::new, |r| format!(" at {r} entry requests/s")),
        if faults.is_empty() {
            "none".to_string()
        } else {
            faults.join(", ")
        },
        versions.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipliers_print_whole_numbers_plainly() {
        assert_eq!(times(27.0), "27x");
        assert_eq!(times(1.331), "1.331x");
        assert_eq!(timeline_step(60), 2);
        assert_eq!(timeline_step(20), 1);
        assert_eq!(mean([1.0, 3.0].into_iter()), 2.0);
    }
}
