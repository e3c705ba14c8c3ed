//! Daily peaks: the hours of the day whose P99 is markedly above the day's typical, as a
//! policy time window to suggest.
//!
//! # Why
//!
//! One timeout all day is set by the worst hour: the seeds' payment callback had its P99
//! climb every night while its bank ran maintenance, and a timeout wide enough for that hour
//! lets every other hour's failures hang longer. A policy file can give that hour its own
//! timeout ([`Schedule`](crate::policy::Schedule)); this finds the hour in the data.
//!
//! # The rule
//!
//! The data (at least a day of it) is cut into the local hours of one time zone. An hour is
//! judged when it holds at least [`MIN_HOUR_COUNT`] observations, a day when it has at least
//! [`MIN_DAY_HOURS`] judged hours. On a judged day, an hour *peaks* when its P99 is above
//! [`PEAK_FACTOR`] × the median of that day's hourly P99s. An hour of the day is a peak hour
//! when it peaks on more than half the judged days that judged it (every one, with one or
//! two: the data's first and last days may not reach that hour), and
//! consecutive peak hours (across midnight too) make one [`Peak`] window. The window's
//! percentiles are those of all its hours' data on the judged days, so the timeout for it is
//! set by the same rule as the endpoint's (see [`advise`](super::advise)).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use serde::Serialize;

use super::timed::{Interval, Latencies};
use super::{AdviseError, Percentiles};

/// An hour peaks when its P99 is above this × the median hourly P99 of its day.
pub const PEAK_FACTOR: f64 = 1.5;
/// An hour with fewer observations is not judged (its P99 would be its maximum or near it).
pub const MIN_HOUR_COUNT: u64 = 100;
/// A day with fewer judged hours is not judged.
pub const MIN_DAY_HOURS: usize = 12;

/// A daily window where the P99 peaks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Peak {
    /// Its first hour, local time (`"19:00"`).
    pub start: String,
    /// The end of its last hour, local time (`"21:00"`).
    pub end: String,
    /// The time zone of `start` and `end`.
    pub time_zone: String,
    /// The median over the judged days of each day's median hourly P99.
    #[serde(with = "crate::duration::serde_duration")]
    pub typical_p99: Duration,
    /// The percentiles of the window's hours on the judged days, together.
    pub percentiles: Percentiles,
}

/// What the search for daily peaks found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeakSearch {
    /// The days judged (0: less than a day of data, or too sparse).
    pub days: usize,
    /// The peak windows, by start hour.
    pub peaks: Vec<Peak>,
    /// With peaks: the percentiles of every hour outside them, which the endpoint's own
    /// timeout is then set from (the peak hours get theirs in the window).
    pub off_peak: Option<Percentiles>,
}

/// The daily peaks of `intervals`, in the local hours of `time_zone` (an IANA name); an
/// error names a time zone that is not one.
pub fn daily_peaks<L: Latencies>(
    intervals: impl IntoIterator<Item = Interval<L>>,
    time_zone: &str,
) -> Result<PeakSearch, AdviseError> {
    let zone = TimeZone::get(time_zone).map_err(|_| {
        AdviseError::at(
            0,
            format!("{time_zone:?} is not a time zone of the IANA database"),
        )
    })?;
    let mut hours: BTreeMap<(Date, i8), L> = BTreeMap::new();
    for interval in intervals {
        let Ok(at) = jiff::Timestamp::try_from(interval.start) else {
            continue;
        };
        let local = zone.to_datetime(at);
        match hours.get_mut(&(local.date(), local.hour())) {
            Some(hour) => hour.merge(&interval.latencies),
            None => {
                hours.insert((local.date(), local.hour()), interval.latencies);
            }
        }
    }
    // The judged hours' P99s, by day.
    let mut days: BTreeMap<Date, Vec<(i8, Duration)>> = BTreeMap::new();
    for ((date, hour), l) in &hours {
        if let Some(p) = l.percentiles().filter(|_| l.count() >= MIN_HOUR_COUNT) {
            days.entry(*date).or_default().push((*hour, p.p99));
        }
    }
    days.retain(|_, h| h.len() >= MIN_DAY_HOURS);
    let judged_hours: usize = days.values().map(Vec::len).sum();
    if days.is_empty() || judged_hours < 24 {
        return Ok(PeakSearch {
            days: 0,
            peaks: Vec::new(),
            off_peak: None,
        });
    }
    let (mut peaked, mut judged) = ([0usize; 24], [0usize; 24]);
    let mut medians = Vec::with_capacity(days.len());
    for day in days.values() {
        let median = median(day.iter().map(|(_, p)| *p).collect());
        medians.push(median);
        for (hour, p99) in day {
            judged[hour_index(*hour)] += 1;
            if p99.as_secs_f64() > PEAK_FACTOR * median.as_secs_f64() {
                peaked[hour_index(*hour)] += 1;
            }
        }
    }
    let typical_p99 = median(medians);
    let is_peak: [bool; 24] = std::array::from_fn(|h| peaked[h] * 2 > judged[h]);
    let mut peaks = Vec::new();
    let mut off_peak: Option<L> = None;
    if is_peak.contains(&true) {
        for ((_, hour), l) in &hours {
            if !is_peak[hour_index(*hour)] {
                merge_into(&mut off_peak, l);
            }
        }
    }
    for (start, len) in runs(&is_peak) {
        let in_window = |hour: i8| (hour_index(hour) + 24 - start) % 24 < len;
        let mut merged: Option<L> = None;
        for ((date, hour), l) in &hours {
            if days.contains_key(date) && in_window(*hour) {
                merge_into(&mut merged, l);
            }
        }
        if let Some(percentiles) = merged.and_then(|m| m.percentiles()) {
            peaks.push(Peak {
                start: format!("{start:02}:00"),
                end: format!("{:02}:00", (start + len) % 24),
                time_zone: time_zone.to_owned(),
                typical_p99,
                percentiles,
            });
        }
    }
    peaks.sort_by(|a, b| a.start.cmp(&b.start));
    Ok(PeakSearch {
        days: days.len(),
        off_peak: off_peak
            .and_then(|l| l.percentiles())
            .filter(|_| !peaks.is_empty()),
        peaks,
    })
}

fn merge_into<L: Latencies>(total: &mut Option<L>, l: &L) {
    match total {
        Some(t) => t.merge(l),
        None => *total = Some(l.clone()),
    }
}

fn hour_index(hour: i8) -> usize {
    usize::try_from(hour).unwrap_or(0) % 24
}

/// The lower median (nearest rank) of `values`; zero for none.
fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values
        .get(values.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or_default()
}

/// The runs of `true` hours as (first hour, length), a run through midnight as one.
fn runs(is_peak: &[bool; 24]) -> Vec<(usize, usize)> {
    // Every hour peaking is no window: the day has no quieter hours to compare with.
    let Some(quiet) = is_peak.iter().position(|p| !p) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut run: Option<(usize, usize)> = None;
    for step in 1..=24 {
        let hour = (quiet + step) % 24;
        match (is_peak[hour], &mut run) {
            (true, Some((_, len))) => *len += 1,
            (true, None) => run = Some((hour, 1)),
            (false, r) => out.extend(r.take()),
        }
    }
    out.extend(run);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_across_midnight() {
        let mut h = [false; 24];
        for i in [23, 0, 1, 19, 20] {
            h[i] = true;
        }
        let mut r = runs(&h);
        r.sort_unstable();
        assert_eq!(r, vec![(19, 2), (23, 3)]);
        assert!(runs(&[false; 24]).is_empty());
    }
}
