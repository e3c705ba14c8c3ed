//! Timeouts set from data: latency percentiles per endpoint, the seeds' timeout rule, the P99
//! alarm, and the result as a policy patch.
//!
//! # Why
//!
//! A timeout set by feel is either too short (a share of healthy calls time out and are
//! retried: load for nothing) or too long (a slow downstream holds every caller's threads).
//! The seeds set it from measured latency (003 §2.2):
//!
//! 1. a baseline: the endpoint's latency over a quiet period (7 days); its P999 anchors the
//!    timeout — "a search endpoint's P999 is 1200 ms, so the initial timeout can be 1500 ms"
//!    ([`INITIAL_FACTOR`] × P999);
//! 2. a stress run at 120 % of peak: its P999 rises (2500 ms), and the final timeout is
//!    **0.7 × normal P999 + 0.3 × stress P999 + 200 ms** ([`seeds_timeout`]);
//! 3. an alarm when the P99 stays above 80 % of the timeout ([`ALARM_SHARE`]) for 5 minutes:
//!    with timestamped data, [`timed`] evaluates it window by window as monitoring would;
//! 4. (the seeds' payment callback) a looser timeout for the hours the P99 peaks every day,
//!    as a policy time window: [`peak`] finds the hours, [`advise_window`] the timeout, and
//!    [`advise_timed`] puts the three together for an endpoint with timestamped data.
//!
//! [`advise`] applies this to the [`Percentiles`] of each endpoint, from whatever source
//! (a CSV of latencies: [`csv`]; a Prometheus text exposition snapshot: [`prometheus`];
//! a Prometheus server's `histogram_quantile`, queried by the CLI), and [`patch`] turns the
//! advice into a [`PolicyFile`] that `policy diff` and `policy lint` read like any other.
//!
//! ```
//! use std::time::Duration;
//! use stormguard::advise::{Percentiles, advise};
//!
//! let ms = Duration::from_millis;
//! let normal = Percentiles { p50: ms(80), p90: ms(300), p99: ms(900), p999: ms(1200) };
//! assert_eq!(advise(&normal, None).timeout, ms(1500));
//! let stress = Percentiles { p999: ms(2500), ..normal };
//! assert_eq!(advise(&normal, Some(&stress)).timeout, ms(1790));
//! ```

pub mod csv;
mod error;
pub mod peak;
pub mod prometheus;
pub mod timed;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::policy::{EndpointPolicy, PolicyError, PolicyFile, Schedule};
use crate::retry::RetryPolicy;

pub use error::AdviseError;
pub use peak::Peak;

/// The initial timeout from a baseline alone is this × its P999 (the seeds' 1200 ms → 1500 ms).
pub const INITIAL_FACTOR: f64 = 1.25;
/// The weight of the normal P999 in the seeds' rule.
pub const NORMAL_WEIGHT: f64 = 0.7;
/// The weight of the stress P999 in the seeds' rule.
pub const STRESS_WEIGHT: f64 = 0.3;
/// The safety margin of the seeds' rule.
pub const MARGIN: Duration = Duration::from_millis(200);
/// The P99 alarm fires above this share of the timeout.
pub const ALARM_SHARE: f64 = 0.8;
/// Advised timeouts are rounded up to a multiple of this.
pub const ROUND_TO: Duration = Duration::from_millis(10);
/// The largest latency read from any input, in seconds (about 31 years): a larger value is
/// unusable, not a latency, and would overflow the arithmetic of the rule.
pub const MAX_LATENCY_SECS: f64 = 1e9;

/// Latency percentiles of one endpoint over one window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Percentiles {
    /// The median.
    #[serde(with = "crate::duration::serde_duration")]
    pub p50: Duration,
    /// The 90th percentile.
    #[serde(with = "crate::duration::serde_duration")]
    pub p90: Duration,
    /// The 99th percentile.
    #[serde(with = "crate::duration::serde_duration")]
    pub p99: Duration,
    /// The 99.9th percentile.
    #[serde(with = "crate::duration::serde_duration")]
    pub p999: Duration,
}

impl Percentiles {
    /// The percentiles of `samples` by nearest rank (the smallest sample with at least
    /// q × n samples at or below it); `None` for no samples.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::advise::Percentiles;
    /// let samples: Vec<Duration> = (1..=1000).map(Duration::from_millis).collect();
    /// let p = Percentiles::of_samples(&samples).unwrap();
    /// assert_eq!((p.p50, p.p999), (Duration::from_millis(500), Duration::from_millis(999)));
    /// ```
    pub fn of_samples(samples: &[Duration]) -> Option<Percentiles> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let at = |q: f64| {
            #[allow(
                clippy::cast_precision_loss,
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss
            )]
            let rank = (q * sorted.len() as f64).ceil() as usize;
            sorted[rank.clamp(1, sorted.len()) - 1]
        };
        Some(Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            p999: at(0.999),
        })
    }
}

/// The advice for one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Advice {
    /// The baseline window's percentiles.
    pub normal: Percentiles,
    /// The stress window's, when given.
    pub stress: Option<Percentiles>,
    /// The advised timeout, rounded up to [`ROUND_TO`].
    #[serde(with = "crate::duration::serde_duration")]
    pub timeout: Duration,
    /// Which rule gave it: `"initial"` (1.25 × normal P999) or `"0.7/0.3"` (the seeds' rule).
    pub rule: &'static str,
    /// The P99 above which the alarm fires: [`ALARM_SHARE`] × the timeout.
    #[serde(with = "crate::duration::serde_duration")]
    pub alarm_above: Duration,
    /// Whether a window's P99 already is above it (the stress window's when given).
    pub alarm: bool,
}

/// 0.7 × `normal_p999` + 0.3 × `stress_p999` + 200 ms, the seeds' rule, unrounded.
pub fn seeds_timeout(normal_p999: Duration, stress_p999: Duration) -> Duration {
    normal_p999
        .mul_f64(NORMAL_WEIGHT)
        .saturating_add(stress_p999.mul_f64(STRESS_WEIGHT))
        .saturating_add(MARGIN)
}

/// The advice from a baseline window and, when there is one, a stress window.
pub fn advise(normal: &Percentiles, stress: Option<&Percentiles>) -> Advice {
    let (raw, rule) = match stress {
        None => (normal.p999.mul_f64(INITIAL_FACTOR), "initial"),
        Some(s) => (seeds_timeout(normal.p999, s.p999), "0.7/0.3"),
    };
    let timeout = round_up(raw);
    let alarm_above = timeout.mul_f64(ALARM_SHARE);
    let p99 = stress.map_or(normal.p99, |s| s.p99);
    Advice {
        normal: *normal,
        stress: stress.copied(),
        timeout,
        rule,
        alarm_above,
        alarm: p99 > alarm_above,
    }
}

/// A daily peak and the advice for its hours: a policy time window to suggest.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowAdvice {
    /// The peak.
    #[serde(flatten)]
    pub peak: Peak,
    /// The advice from the peak hours' percentiles (and the stress window's, when given).
    pub advice: Advice,
    /// Whether [`patch`] writes the window: its timeout is above the endpoint's all-day one
    /// (else the all-day timeout already covers the peak).
    pub suggested: bool,
}

/// The advice for a daily peak's window: the same rule as [`advise`], from the peak hours'
/// percentiles; suggested when its timeout is above `all_day`'s.
pub fn advise_window(peak: Peak, stress: Option<&Percentiles>, all_day: &Advice) -> WindowAdvice {
    let advice = advise(&peak.percentiles, stress);
    WindowAdvice {
        suggested: advice.timeout > all_day.timeout,
        peak,
        advice,
    }
}

/// Everything advised for one endpoint from timestamped data.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TimedAdvice {
    /// The endpoint's own advice: from the hours outside its suggested windows when there
    /// are some, else from all its data.
    pub advice: Advice,
    /// The daily peaks found, each with its advice.
    pub windows: Vec<WindowAdvice>,
    /// The days the peak search judged (0: less than a day of data).
    pub peak_days: usize,
    /// The P99 alarm window by window, each judged against the policy in force then.
    pub alarm: timed::Alarm,
}

/// The advice for an endpoint with timestamped data: `whole` (all of it), `series` (the
/// P99 of each alarm window of `window_len`) and `peaks` (its daily peak search).
///
/// With daily peaks whose timeout (from the peak hours) is above the one from the other
/// hours, the endpoint's timeout is set from the other hours and each such peak is a
/// suggested window; else the endpoint's timeout is set from all the data, as [`advise`].
pub fn advise_timed(
    whole: &Percentiles,
    stress: Option<&Percentiles>,
    series: &[timed::WindowP99],
    window_len: Duration,
    peaks: peak::PeakSearch,
) -> TimedAdvice {
    let off_peak = peaks.off_peak.map(|p| advise(&p, stress));
    let all_day = advise(whole, stress);
    let judge = |base: &Advice| -> Vec<WindowAdvice> {
        peaks
            .peaks
            .iter()
            .map(|p| advise_window(p.clone(), stress, base))
            .collect()
    };
    let off_peak = off_peak.map(|off| {
        let windows = judge(&off);
        (off, windows)
    });
    let (advice, windows) = match off_peak {
        Some((off, windows)) if windows.iter().any(|w| w.suggested) => (off, windows),
        _ => {
            let windows = judge(&all_day);
            (all_day, windows)
        }
    };
    let in_force: Vec<(Schedule, Duration)> = windows
        .iter()
        .filter(|w| w.suggested)
        .filter_map(|w| {
            let s = Schedule::daily(&w.peak.start, &w.peak.end, &w.peak.time_zone).ok()?;
            Some((s, w.advice.alarm_above))
        })
        .collect();
    let alarm = timed::alarm(series, window_len, |at| {
        in_force
            .iter()
            .find(|(s, _)| s.is_active(at))
            .map_or(advice.alarm_above, |(_, above)| *above)
    });
    TimedAdvice {
        advice,
        windows,
        peak_days: peaks.days,
        alarm,
    }
}

fn round_up(d: Duration) -> Duration {
    // Nanosecond float error (1.2 s × 1.25) must not push a whole step up.
    let step = ROUND_TO.as_nanos();
    let nanos = d.as_nanos().saturating_sub(1_000);
    let rounded = nanos.div_ceil(step).saturating_mul(step);
    Duration::from_nanos(u64::try_from(rounded).unwrap_or(u64::MAX))
}

/// The advice as a policy file: each advised endpoint's policy from `base` (or a policy of
/// one attempt when `base` has none) with its attempt timeout set — the per-try timeout when
/// the policy has one, else the overall timeout. The patch is validated like any policy
/// file; an error names the endpoint and field the advice could not be set in (a per-try
/// timeout above the overall one, say).
///
/// Each suggested [`WindowAdvice`] of an endpoint in `windows` is added to it as a time
/// window whose overrides set the same attempt timeout to the window's advice (the base's
/// own windows are kept; a suggested one that overlaps them is refused by the loader, named).
pub fn patch(
    advice: &BTreeMap<String, Advice>,
    windows: &BTreeMap<String, Vec<WindowAdvice>>,
    base: Option<&PolicyFile>,
) -> Result<PolicyFile, PolicyError> {
    let mut endpoints = BTreeMap::new();
    for (name, a) in advice {
        let base_policy = base
            .and_then(|b| b.endpoint(name))
            .cloned()
            .unwrap_or_else(|| EndpointPolicy::new(RetryPolicy::new(1)));
        let mut policy = with_attempt_timeout(base_policy, a.timeout);
        for w in windows.get(name).into_iter().flatten() {
            if !w.suggested {
                continue;
            }
            let schedule = Schedule::daily(&w.peak.start, &w.peak.end, &w.peak.time_zone)?;
            let during = with_attempt_timeout(policy.clone().without_windows(), w.advice.timeout);
            policy = policy.with_window(schedule, during);
        }
        endpoints.insert(name.clone(), policy);
    }
    let file = PolicyFile::new(endpoints);
    // Read back through the loader: every rule is checked and errors name the field.
    PolicyFile::from_toml(&file.to_toml())
}

/// `policy` with its attempt timeout set to `timeout`: the per-try timeout when it has one,
/// else the overall timeout.
fn with_attempt_timeout(policy: EndpointPolicy, timeout: Duration) -> EndpointPolicy {
    if policy.retry().per_try_timeout().is_some() {
        let retry = policy.retry().with_per_try_timeout(timeout);
        policy.with_retry(retry)
    } else {
        policy.with_overall_timeout(timeout)
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_timed;
