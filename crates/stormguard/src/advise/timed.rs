//! Latency over time: the P99 alarm as monitoring evaluates it, window after window.
//!
//! # Why windows and not the whole period
//!
//! The seeds' alarm is "P99 above 80 % of the timeout for 5 minutes". A week's P99 can sit
//! well below that line while one bad five minutes crosses it: the whole-period figure
//! averages the burst away, and the alarm an operator would have received never shows. So
//! the data is cut into consecutive windows of [`ALARM_WINDOW`] (aligned to the clock:
//! multiples of the window since the Unix epoch; the CLI rounds its Prometheus range queries
//! to the same multiples), each window's P99 is computed on its own
//! ([`window_p99s`]), and [`alarm`] reports the windows whose P99 is above the threshold:
//! how many, what share, the first and the worst. Any source with timestamps gives the same
//! [`Interval`]s (a CSV row is an interval of one latency, an HdrHistogram log interval is
//! one histogram, a Prometheus range query step is one histogram) and they are merged by the
//! [`Latencies`] of their kind.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::Percentiles;

/// The alarm's default window: the seeds' "for 5 minutes".
pub const ALARM_WINDOW: Duration = Duration::from_secs(300);

/// Latency data that can be merged and read as percentiles: raw samples (`Vec<Duration>`),
/// a Prometheus histogram, an HdrHistogram.
pub trait Latencies: Clone {
    /// Adds `other`'s observations to these.
    fn merge(&mut self, other: &Self);
    /// How many observations there are.
    fn count(&self) -> u64;
    /// Their percentiles; `None` without observations.
    fn percentiles(&self) -> Option<Percentiles>;
}

impl Latencies for Vec<Duration> {
    fn merge(&mut self, other: &Self) {
        self.extend_from_slice(other);
    }

    fn count(&self) -> u64 {
        self.len() as u64
    }

    fn percentiles(&self) -> Option<Percentiles> {
        Percentiles::of_samples(self)
    }
}

/// Latencies observed from `start` on (one request, or one recording interval).
#[derive(Clone, Debug, PartialEq)]
pub struct Interval<L> {
    /// When the interval starts.
    pub start: SystemTime,
    /// What was observed in it.
    pub latencies: L,
}

/// One window's P99.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WindowP99 {
    /// The window's start, written RFC 3339 in UTC.
    #[serde(serialize_with = "serialize_time")]
    pub start: SystemTime,
    /// Its P99.
    #[serde(with = "crate::duration::serde_duration")]
    pub p99: Duration,
}

/// The intervals merged into consecutive windows of `len` aligned to the Unix epoch, by
/// window start (Unix seconds); an interval belongs to the window its start falls in.
/// Intervals before the epoch are dropped.
pub fn windows<L: Latencies>(
    intervals: impl IntoIterator<Item = Interval<L>>,
    len: Duration,
) -> BTreeMap<u64, L> {
    let len = len.as_secs().max(1);
    let mut out: BTreeMap<u64, L> = BTreeMap::new();
    for interval in intervals {
        let Ok(since) = interval.start.duration_since(SystemTime::UNIX_EPOCH) else {
            continue;
        };
        let key = since.as_secs() / len * len;
        match out.get_mut(&key) {
            Some(window) => window.merge(&interval.latencies),
            None => {
                out.insert(key, interval.latencies);
            }
        }
    }
    out
}

/// The P99 of each window of `len` that holds data, in time order (see [`windows`]).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use stormguard::advise::timed::{Interval, window_p99s};
///
/// let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
/// let ms = Duration::from_millis;
/// let rows = [(10, 20), (100, 40), (400, 900)].map(|(s, l)| Interval { start: at(s), latencies: vec![ms(l)] });
/// let p99s = window_p99s(rows, Duration::from_secs(300));
/// assert_eq!(p99s.len(), 2);
/// assert_eq!((p99s[0].p99, p99s[1].start), (ms(40), at(300)));
/// ```
pub fn window_p99s<L: Latencies>(
    intervals: impl IntoIterator<Item = Interval<L>>,
    len: Duration,
) -> Vec<WindowP99> {
    windows(intervals, len)
        .into_iter()
        .filter_map(|(start, l)| {
            Some(WindowP99 {
                start: SystemTime::UNIX_EPOCH + Duration::from_secs(start),
                p99: l.percentiles()?.p99,
            })
        })
        .collect()
}

/// What the P99 alarm would have done over a series of windows.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Alarm {
    /// The window length.
    #[serde(with = "crate::duration::serde_duration")]
    pub window: Duration,
    /// Windows with data.
    pub windows: usize,
    /// Windows whose P99 is above the threshold in force at their start.
    pub firing: usize,
    /// `firing / windows` (0 without windows).
    pub share: f64,
    /// The first firing window.
    pub first: Option<WindowP99>,
    /// The firing window with the highest P99 (the earliest of equals).
    pub worst: Option<WindowP99>,
}

impl Alarm {
    /// Whether the alarm would have fired at least once.
    pub fn would_fire(&self) -> bool {
        self.firing > 0
    }
}

/// The alarm over `series` (windows of `window`): the windows whose P99 is above
/// `above(start)`, the threshold in force at the window's start (80 % of the timeout of the
/// policy in force then: a time window's, or the endpoint's).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use stormguard::advise::timed::{WindowP99, alarm};
///
/// let ms = Duration::from_millis;
/// let w = |m: u64, p99| WindowP99 { start: SystemTime::UNIX_EPOCH + Duration::from_secs(m * 60), p99: ms(p99) };
/// let a = alarm(&[w(0, 90), w(5, 500), w(10, 700), w(15, 80)], Duration::from_secs(300), |_| ms(400));
/// assert_eq!((a.windows, a.firing, a.share), (4, 2, 0.5));
/// assert_eq!((a.first.unwrap().p99, a.worst.unwrap().p99), (ms(500), ms(700)));
/// assert!(a.would_fire());
/// ```
pub fn alarm(
    series: &[WindowP99],
    window: Duration,
    above: impl Fn(SystemTime) -> Duration,
) -> Alarm {
    let mut firing = series.iter().filter(|w| w.p99 > above(w.start));
    let first = firing.clone().next().copied();
    let worst = firing
        .clone()
        .fold(None::<WindowP99>, |worst, w| match worst {
            Some(v) if v.p99 >= w.p99 => Some(v),
            _ => Some(*w),
        });
    let count = firing.by_ref().count();
    #[allow(clippy::cast_precision_loss)]
    let share = if series.is_empty() {
        0.0
    } else {
        count as f64 / series.len() as f64
    };
    Alarm {
        window,
        windows: series.len(),
        firing: count,
        share,
        first,
        worst,
    }
}

/// `t` as RFC 3339 in UTC (`2026-03-01T19:00:00Z`).
pub fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t).map_or_else(|_| format!("{t:?}"), |ts| ts.to_string())
}

fn serialize_time<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*t))
}
