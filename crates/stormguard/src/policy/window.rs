//! Time windows: a policy that changes on a daily schedule, in a named time zone.
//!
//! A downstream is not the same all day. The seeds' payment callback saw its P99 climb every
//! night at 3 a.m.: the bank behind it ran its maintenance then, and the fix was a looser
//! timeout for that hour alone — not a looser timeout all day (which lets every other hour's
//! failures hang for longer), and not an operator changing the file twice a night. A
//! [`PolicyWindow`] says exactly that: from `03:00` to `04:00` `Asia/Shanghai`, every day,
//! these fields are different.
//!
//! ```toml
//! [endpoints."POST /callback"]
//! timeouts = { per_try = "300ms", overall = "1s" }
//!
//! [[endpoints."POST /callback".windows]]
//! start = "03:00"
//! end = "04:00"
//! time_zone = "Asia/Shanghai"
//! overrides = { timeouts = { per_try = "2s", overall = "5s" } }
//! ```
//!
//! A window's `overrides` are written like the endpoint itself and merged into it field by
//! field (a `budget` is replaced whole: its kind decides its fields). The policy in force
//! during the window is checked by every rule the endpoint's own policy is, when the file is
//! read, so a window cannot smuggle in what the base could not hold.
//!
//! When a window is in force on the days clocks change is told at [`Schedule`].

use std::fmt;
use std::time::SystemTime;

use jiff::civil::{Date, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, ToSpan};

use super::limits::MAX_WINDOWS;
use super::{EndpointPolicy, FieldPath, PolicyError};
use crate::duration::{MAX_QUOTED, cut};

/// A daily schedule: from `start` to `end`, local time in one IANA time zone.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use stormguard::policy::Schedule;
///
/// let maintenance = Schedule::daily("03:00", "04:00", "Asia/Shanghai")?;
/// // 2026-03-01 19:30 UTC is 03:30 in Shanghai.
/// let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_772_393_400);
/// assert!(maintenance.is_active(at));
/// assert_eq!(maintenance.to_string(), "03:00-04:00 Asia/Shanghai daily");
/// # Ok::<(), stormguard::policy::PolicyError>(())
/// ```
///
/// # When a window is in force
///
/// Times are local wall-clock times of the window's zone (an IANA name), `HH:MM` or
/// `HH:MM:SS`. A window whose end is not after its start runs past midnight (`23:00`–`01:00`).
/// Each edge is **the first instant at which the zone's wall clock reads that time or later**
/// on that day. On the days a zone changes its clocks, this means:
///
/// - **spring forward** (a gap: `02:00`–`03:00` does not exist in `America/New_York` on its
///   spring day): an edge inside the gap falls on the instant the clock jumps (`03:00` new
///   time). A window `02:30`–`04:00` runs `03:00`–`04:00` that day; a window entirely inside
///   the gap (`02:00`–`03:00`) does not run that day at all.
/// - **fall back** (a fold: `01:00`–`02:00` happens twice): an edge inside the fold falls on
///   its first occurrence. A window `01:00`–`01:30` runs once, during the first `01:00`–`01:30`
///   (not again when the hour repeats); a window `01:30`–`02:30` runs from the first `01:30`
///   to `02:30`, two hours of real time that day.
///
/// Because every edge is the *first* instant its time is reached, the edges of one day keep
/// their order in real time, so windows that do not overlap on the clock never overlap in
/// time. The windows of one endpoint are written in one time zone, and may not overlap.
#[derive(Clone, Debug)]
pub struct Schedule {
    start: Time,
    end: Time,
    zone_name: String,
    zone: TimeZone,
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.start == other.start && self.end == other.end && self.zone_name == other.zone_name
    }
}

impl Schedule {
    /// Every day from `start` to `end` (`"03:00"`, `"23:30:00"`) in `time_zone` (an IANA
    /// name such as `"Asia/Shanghai"`, or `"UTC"`). An error names `start`, `end` or
    /// `time_zone`.
    pub fn daily(start: &str, end: &str, time_zone: &str) -> Result<Schedule, PolicyError> {
        Schedule::parse(start, end, time_zone, &FieldPath::root(""))
    }

    pub(super) fn parse(
        start: &str,
        end: &str,
        time_zone: &str,
        at: &FieldPath,
    ) -> Result<Schedule, PolicyError> {
        let start = clock_time(start).map_err(|e| at.field("start").invalid(e))?;
        let end = clock_time(end).map_err(|e| at.field("end").invalid(e))?;
        if start == end {
            return Err(at.field("end").invalid(format!(
                "the window is empty: it ends when it starts ({})",
                HhMm(start)
            )));
        }
        let zone = TimeZone::get(time_zone).map_err(|_| {
            at.field("time_zone").invalid(format!(
                "{:?} is not a time zone of the IANA database (write a name such as \"Asia/Shanghai\" or \"UTC\")",
                cut(time_zone, MAX_QUOTED)
            ))
        })?;
        Ok(Schedule {
            start,
            end,
            zone_name: time_zone.to_owned(),
            zone,
        })
    }

    /// The IANA name of the time zone, as written.
    pub fn time_zone(&self) -> &str {
        &self.zone_name
    }

    /// The start, local time, as `HH:MM` (or `HH:MM:SS`).
    pub fn start(&self) -> String {
        HhMm(self.start).to_string()
    }

    /// The end, local time, as `HH:MM` (or `HH:MM:SS`).
    pub fn end(&self) -> String {
        HhMm(self.end).to_string()
    }

    /// Whether the window is in force at `at`.
    pub fn is_active(&self, at: SystemTime) -> bool {
        timestamp(at).is_some_and(|at| self.state(at).0)
    }

    /// The first edge (a start or an end) after `at`.
    pub fn next_edge(&self, at: SystemTime) -> Option<SystemTime> {
        timestamp(at)
            .and_then(|at| self.state(at).1)
            .and_then(system_time)
    }

    /// Whether the window is in force at `at`, and its next edge after `at`.
    fn state(&self, at: Timestamp) -> (bool, Option<Timestamp>) {
        let today = self.zone.to_datetime(at).date();
        let mut active = false;
        let mut next: Option<Timestamp> = None;
        for days in -1i32..=2 {
            let Some((start, end)) = today
                .checked_add(days.days())
                .ok()
                .and_then(|date| self.occurrence(date))
            else {
                continue;
            };
            active |= start <= at && at < end;
            for edge in [start, end] {
                if edge > at && next.is_none_or(|n| edge < n) {
                    next = Some(edge);
                }
            }
        }
        (active, next)
    }

    /// The window that starts on local `date`: `None` when it does not run that day (it lies
    /// in a gap) or the date is out of range.
    fn occurrence(&self, date: Date) -> Option<(Timestamp, Timestamp)> {
        let start = self.edge(date, self.start)?;
        let end_date = if self.end <= self.start {
            date.tomorrow().ok()?
        } else {
            date
        };
        let end = self.edge(end_date, self.end)?;
        (start < end).then_some((start, end))
    }

    /// The first instant at which the zone's wall clock reads `date` `time` or later.
    fn edge(&self, date: Date, time: Time) -> Option<Timestamp> {
        let ambiguous = self.zone.to_ambiguous_timestamp(date.to_datetime(time));
        match ambiguous.offset() {
            // Before the gap's instant the clock reads less; after it, more: the edge is the
            // instant of the jump.
            // (`earlier` reads the time with the offset after the jump: an instant before it.)
            AmbiguousOffset::Gap { .. } => {
                let before_jump = ambiguous.earlier().ok()?;
                self.zone
                    .following(before_jump)
                    .next()
                    .map(|transition| transition.timestamp())
            }
            // A time that happens twice: its first occurrence.
            AmbiguousOffset::Unambiguous { .. } | AmbiguousOffset::Fold { .. } => {
                ambiguous.earlier().ok()
            }
        }
    }

    /// The parts of a day (seconds since local midnight) the window covers on the clock.
    fn spans(&self) -> Vec<(i32, i32)> {
        let (start, end) = (seconds(self.start), seconds(self.end));
        if start < end {
            vec![(start, end)]
        } else {
            vec![(start, 86_400), (0, end)]
        }
    }

    fn overlaps(&self, other: &Schedule) -> bool {
        self.spans()
            .iter()
            .any(|&(a0, a1)| other.spans().iter().any(|&(b0, b1)| a0 < b1 && b0 < a1))
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{} {} daily",
            HhMm(self.start),
            HhMm(self.end),
            self.zone_name
        )
    }
}

/// A schedule and the policy in force while it runs: the endpoint's policy with the window's
/// overrides applied, checked by every rule the endpoint's own policy is.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyWindow {
    pub(super) schedule: Schedule,
    pub(super) policy: EndpointPolicy,
}

impl PolicyWindow {
    /// When the window runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The policy in force while it runs.
    pub fn policy(&self) -> &EndpointPolicy {
        &self.policy
    }
}

/// The policy in force at one instant, and until when (see [`EndpointPolicy::in_force_at`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InForce<'a> {
    /// The policy to use: a window's, or the endpoint's own.
    pub policy: &'a EndpointPolicy,
    /// The index of the window in force, if one is.
    pub window: Option<usize>,
    /// The next window edge, after which the policy in force may change; `None` when the
    /// endpoint has no windows.
    pub until: Option<SystemTime>,
}

impl EndpointPolicy {
    /// During `schedule`, calls are made by `policy` instead (checked, with the windows'
    /// own rules, by [`validate`](EndpointPolicy::validate)): `policy` may change any field
    /// but not remove one this policy sets, holds no windows of its own, and the windows of
    /// one endpoint share a time zone and do not overlap.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::policy::{EndpointPolicy, Schedule};
    /// use stormguard::retry::RetryPolicy;
    ///
    /// let normal = EndpointPolicy::new(RetryPolicy::new(3).with_per_try_timeout(Duration::from_millis(300)))
    ///     .with_overall_timeout(Duration::from_secs(1));
    /// let maintenance = normal.clone()
    ///     .with_retry(RetryPolicy::new(3).with_per_try_timeout(Duration::from_secs(2)))
    ///     .with_overall_timeout(Duration::from_secs(5));
    /// let policy = normal
    ///     .with_window(Schedule::daily("03:00", "04:00", "Asia/Shanghai")?, maintenance);
    /// policy.validate()?;
    /// assert_eq!(policy.windows().len(), 1);
    /// # Ok::<(), stormguard::policy::PolicyError>(())
    /// ```
    pub fn with_window(mut self, schedule: Schedule, policy: EndpointPolicy) -> Self {
        self.windows.push(PolicyWindow { schedule, policy });
        self
    }

    /// This policy without its time windows (the policy in force outside them).
    pub fn without_windows(mut self) -> Self {
        self.windows.clear();
        self
    }

    /// The time windows, in the order written.
    pub fn windows(&self) -> &[PolicyWindow] {
        &self.windows
    }

    /// The policy in force at `at`: the policy of the window that runs then, else this one;
    /// and the next window edge, when the answer may change.
    pub fn in_force_at(&self, at: SystemTime) -> InForce<'_> {
        let mut in_force = InForce {
            policy: self,
            window: None,
            until: None,
        };
        let Some(now) = timestamp(at) else {
            return in_force;
        };
        let mut next: Option<Timestamp> = None;
        for (index, window) in self.windows.iter().enumerate() {
            let (active, edge) = window.schedule.state(now);
            if active && in_force.window.is_none() {
                in_force.policy = &window.policy;
                in_force.window = Some(index);
            }
            if let Some(edge) = edge {
                next = Some(next.map_or(edge, |n| n.min(edge)));
            }
        }
        in_force.until = next.and_then(system_time);
        in_force
    }
}

/// Checks the windows of `policy` (the base's own fields are checked by the caller).
pub(super) fn check(policy: &EndpointPolicy, at: &FieldPath) -> Result<(), PolicyError> {
    let windows = &policy.windows;
    if windows.len() > MAX_WINDOWS {
        return Err(at.field("windows").invalid(format!(
            "at most {MAX_WINDOWS} windows, got {}",
            windows.len()
        )));
    }
    for (index, window) in windows.iter().enumerate() {
        let window_at = at.field("windows").index(index);
        let overrides = window_at.field("overrides");
        if !window.policy.windows.is_empty() {
            return Err(overrides
                .field("windows")
                .invalid("a window's policy holds no windows of its own"));
        }
        super::rules::check(&window.policy, &overrides)?;
        match super::overrides::overrides_of(policy, &window.policy) {
            Some(changes) if changes.is_empty() => {
                return Err(overrides
                    .invalid("the window changes nothing: its policy is the endpoint's own"));
            }
            Some(_) => {}
            None => {
                return Err(overrides.invalid(
                    "a window changes fields of the endpoint's policy; it cannot remove one the endpoint sets (a section, an optional timeout)",
                ));
            }
        }
        let first = &windows[0].schedule;
        if window.schedule.zone_name != first.zone_name {
            return Err(window_at.field("time_zone").invalid(format!(
                "the windows of one endpoint share one time zone: {:?} differs from windows[0]'s {:?}",
                cut(&window.schedule.zone_name, MAX_QUOTED),
                cut(&first.zone_name, MAX_QUOTED)
            )));
        }
        if let Some(other) = windows[..index]
            .iter()
            .position(|w| w.schedule.overlaps(&window.schedule))
        {
            return Err(window_at.invalid(format!(
                "{} overlaps windows[{other}] ({})",
                window.schedule, windows[other].schedule
            )));
        }
    }
    Ok(())
}

/// A clock time written `HH:MM` or `HH:MM:SS`, 24-hour.
fn clock_time(text: &str) -> Result<Time, String> {
    let bad = || {
        format!(
            "{:?} is not a time of day (write \"HH:MM\" or \"HH:MM:SS\", 00:00 to 23:59:59)",
            cut(text, MAX_QUOTED)
        )
    };
    let parts: Vec<&str> = text.split(':').collect();
    if !(2..=3).contains(&parts.len())
        || parts
            .iter()
            .any(|p| p.len() != 2 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad());
    }
    let number = |i: usize| parts.get(i).map_or(Ok(0), |p| p.parse::<i8>());
    let (Ok(hour), Ok(minute), Ok(second)) = (number(0), number(1), number(2)) else {
        return Err(bad());
    };
    Time::new(hour, minute, second, 0).map_err(|_| bad())
}

fn seconds(time: Time) -> i32 {
    i32::from(time.hour()) * 3600 + i32::from(time.minute()) * 60 + i32::from(time.second())
}

fn timestamp(at: SystemTime) -> Option<Timestamp> {
    Timestamp::try_from(at).ok()
}

fn system_time(at: Timestamp) -> Option<SystemTime> {
    SystemTime::try_from(at).ok()
}

/// A time as a policy writes it: `HH:MM`, or `HH:MM:SS` when it has seconds.
struct HhMm(Time);

impl fmt::Display for HhMm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.0;
        write!(f, "{:02}:{:02}", t.hour(), t.minute())?;
        if t.second() != 0 {
            write!(f, ":{:02}", t.second())?;
        }
        Ok(())
    }
}
