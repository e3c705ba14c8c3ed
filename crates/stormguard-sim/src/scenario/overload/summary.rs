//! The figures of one protection's run, from its per-bin counters.

use super::world::World;
use super::{OverloadConfig, OverloadPoint, OverloadRow, Protection};
use crate::bins::Bins;
use crate::report::round;
use crate::time::{nanos, seconds};

pub(super) fn summarise(
    cfg: &OverloadConfig,
    protection: Protection,
    w: &World<'_>,
) -> OverloadRow {
    let bin = nanos(cfg.bin);
    let per_sec = 1.0 / seconds(bin);
    let bins = usize::try_from(nanos(cfg.duration) / bin).unwrap_or(0);
    let at = usize::try_from(nanos(cfg.trigger_at) / bin).unwrap_or(0);
    let end = usize::try_from(cfg.trigger_end().div_ceil(bin)).unwrap_or(0);
    let tail_bins = usize::try_from((10 * 1_000_000_000u64 / bin).max(1))
        .unwrap_or(1)
        .min((bins.saturating_sub(end) / 2).max(1));
    let tail = bins.saturating_sub(tail_bins);
    let s = &w.series;
    let mean = |b: &Bins, from: usize, to: usize| {
        round(
            b.sum(from, to) as f64 * per_sec / to.saturating_sub(from).max(1) as f64,
            2,
        )
    };
    let latency = |from: usize, to: usize| {
        let n = s.goodput.sum(from, to);
        (n > 0).then(|| round(s.latency_us.sum(from, to) as f64 / n as f64 / 1e3, 2))
    };
    let goodput_before = mean(&s.goodput, 1, at);
    let goodput_after = mean(&s.goodput, tail, bins);
    let good = |i: usize| s.goodput.sum(i, i + 1) as f64 * per_sec >= 0.95 * goodput_before;
    let recovery_s = (end..bins).find(|&i| (i..bins).all(good)).map(|i| {
        round(
            seconds((i as u64 * bin).saturating_sub(cfg.trigger_end())),
            3,
        )
    });
    let series = (0..bins)
        .map(|i| OverloadPoint {
            t_s: round(seconds(i as u64 * bin), 6),
            offered: mean(&s.offered, i, i + 1),
            goodput: mean(&s.goodput, i, i + 1),
            latency_ms: latency(i, i + 1),
        })
        .collect();
    OverloadRow {
        scenario: "overload",
        strategy: protection,
        label: protection.label(),
        parameters: cfg.clone(),
        goodput_before,
        offered_before: mean(&s.offered, 1, at),
        offered_peak: (at..bins)
            .map(|i| mean(&s.offered, i, i + 1))
            .fold(0.0, f64::max),
        after_window_s: round(seconds(tail_bins as u64 * bin), 6),
        goodput_after,
        offered_after: mean(&s.offered, tail, bins),
        latency_after_ms: latency(tail, bins),
        recovered: goodput_after >= 0.95 * goodput_before,
        recovery_s,
        wasted: w.wasted,
        expired: w.server.expired,
        shed: w.server.shed,
        series,
    }
}
