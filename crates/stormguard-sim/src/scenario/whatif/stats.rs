//! What each service saw: counts per time bin, latencies, queue lengths — and the figures
//! the report derives from them (percentiles, time to recover).

use hdrhistogram::Histogram;

use super::latency::Latencies;
use crate::error::InvalidParam;
use crate::time::{NANOS_PER_SEC, Nanos};

/// The longest latency recorded exactly (longer ones are recorded as this): a day.
const MAX_LATENCY: u64 = 86_400 * NANOS_PER_SEC;

/// Bins averaged when judging recovery.
pub(super) const RECOVERY_WINDOW: usize = 5;

/// How far below its level before the fault a service's success rate may stay and still
/// count as recovered.
pub(super) const RECOVERY_SLACK: f64 = 0.05;

/// What one service saw in one time bin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    /// Requests arriving.
    pub(super) arrivals: u64,
    /// Requests answered with success.
    pub(super) ok: u64,
    /// Requests answered with a failure (refused, 503, a failed call).
    pub(super) failed: u64,
    /// Requests that got a worker.
    pub(super) admitted: u64,
}

/// One service's counters: one [`Counts`] per bin. The event loop counts into the bin it
/// is in ([`now`](ServiceStats::now): a field, not an index, several times per request)
/// and closes it when time moves past it ([`close`](ServiceStats::close)).
pub(super) struct ServiceStats {
    bins: Vec<Counts>,
    /// The counts of the bin the event loop is in, not yet added to `bins`.
    current: Counts,
    /// Requests given up: dropped from the queue or stopped at their deadline.
    pub(super) abandoned: u64,
    /// An empty histogram of the latencies' bounds, filled from `latencies` for the report.
    latency: Histogram<u64>,
    /// Latency of successful answers, arrival to answer, in nanoseconds.
    latencies: Latencies,
    pub(super) queue_peak: usize,
}

impl ServiceStats {
    pub(super) fn new(bins: usize) -> Result<ServiceStats, InvalidParam> {
        let latency = Histogram::new_with_bounds(1, MAX_LATENCY, 2)
            .map_err(|e| InvalidParam::new("duration", e.to_string()))?;
        Ok(ServiceStats {
            // One more than the run's: what happens after the run, while the requests in
            // flight finish, is counted in the last (it adds to the totals, not the series).
            bins: vec![Counts::default(); bins.saturating_add(1)],
            current: Counts::default(),
            abandoned: 0,
            latency,
            latencies: Latencies::default(),
            queue_peak: 0,
        })
    }

    /// The counts of the bin the event loop is in.
    #[inline(always)]
    pub(super) fn now(&mut self) -> &mut Counts {
        &mut self.current
    }

    /// Adds the counts of the bin the event loop was in, `bin`, to the series (every bin
    /// past the run's is the one after its last) and starts the next one from zero. The
    /// event loop calls it whenever it leaves a bin, and once at the end.
    pub(super) fn close(&mut self, bin: usize) {
        let c = std::mem::take(&mut self.current);
        let last = self.bins.len().saturating_sub(1);
        if let Some(b) = self.bins.get_mut(bin.min(last)) {
            b.arrivals += c.arrivals;
            b.ok += c.ok;
            b.failed += c.failed;
            b.admitted += c.admitted;
        }
    }

    /// Every bin's value of `field`, the first `bins` bins.
    pub(super) fn series(&self, bins: usize, field: fn(&Counts) -> u64) -> Vec<u64> {
        self.bins.iter().take(bins).map(field).collect()
    }

    /// The sum of `field` over bins `[from, to)`; `None` for `to`: every bin.
    pub(super) fn sum(&self, from: usize, to: Option<usize>, field: fn(&Counts) -> u64) -> u64 {
        let to = to.unwrap_or(self.bins.len()).min(self.bins.len());
        self.bins
            .get(from..to)
            .map_or(0, |b| b.iter().map(field).sum())
    }

    #[inline(always)]
    pub(super) fn record_latency(&mut self, took: Nanos) {
        self.latencies.record(took.clamp(1, MAX_LATENCY));
    }

    /// The latency at each quantile of `qs` in milliseconds, when anything succeeded.
    pub(super) fn latency_ms<const N: usize>(&self, qs: [f64; N]) -> [Option<f64>; N] {
        if self.latencies.is_empty() {
            return [None; N];
        }
        let mut histogram = self.latency.clone();
        self.latencies.fill(&mut histogram);
        qs.map(|q| Some(histogram.value_at_quantile(q) as f64 / 1e6))
    }
}

/// The success share of bins `range` (answered requests only; `None` when none was
/// answered).
fn success_share(stats: &ServiceStats, from: usize, to: usize) -> Option<f64> {
    let ok = stats.sum(from, Some(to), |c| c.ok);
    let answered = ok + stats.sum(from, Some(to), |c| c.failed);
    (answered > 0).then(|| ok as f64 / answered as f64)
}

/// The time from `end` (a bin index: the first bin after the faults) to the first bin from
/// which on the service is back to its level before the faults (bins before `start`): for
/// every window of [`RECOVERY_WINDOW`] bins up to the end of the run (`bins`), a success share at most
/// [`RECOVERY_SLACK`] below it (1.0 when nothing came before the faults) and an offered load
/// at most 25 % (plus 2 requests per bin) above it. `None`: it never got back.
pub(super) fn recovery_bins(
    stats: &ServiceStats,
    start: usize,
    end: usize,
    bins: usize,
) -> Option<usize> {
    let bins = bins.min(stats.bins.len());
    if end >= bins {
        return None;
    }
    let base_share = success_share(stats, 0, start).unwrap_or(1.0);
    let base_load =
        (start > 0).then(|| stats.sum(0, Some(start), |c| c.arrivals) as f64 / start as f64);
    let healthy = |from: usize| {
        let to = (from + RECOVERY_WINDOW).min(bins);
        let share_ok =
            success_share(stats, from, to).is_none_or(|s| s >= base_share - RECOVERY_SLACK);
        let load_ok = base_load.is_none_or(|base| {
            let load = stats.sum(from, Some(to), |c| c.arrivals) as f64 / (to - from) as f64;
            load <= 1.25 * base + 2.0
        });
        share_ok && load_ok
    };
    // The first bin from which every later window is healthy: walk back from the end.
    let mut first = None;
    for from in (end..bins).rev() {
        if healthy(from) {
            first = Some(from);
        } else {
            break;
        }
    }
    first.map(|b| b - end)
}
