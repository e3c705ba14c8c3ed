//! A run read back: per-second bins, the instants that tell the story, and the table.

use std::time::Duration;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{CellAlignment, Table};
use serde::Serialize;
use stormguard_center::Version;

use super::scenario::Run;
use super::timeline::{Answer, Mark, Record, Request};

/// The goal for the time from the first 504 to every client running the rule's version.
pub(crate) const SWITCH_GOAL: Duration = Duration::from_secs(10);

/// One second of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Bin {
    /// Its start, in seconds from the run's start.
    pub(crate) t: f64,
    /// User requests that started in it.
    pub(crate) requests: u32,
    /// Of those, the ones whose user saw an error.
    pub(crate) errors: u32,
    /// Of those, the ones answered by the backup source.
    pub(crate) from_backup: u32,
    /// Attempts the client stacks sent for those requests.
    pub(crate) attempts: u32,
    /// The most attempts sent for one of them.
    pub(crate) max_attempts: u32,
    /// 504s the CDN answered in it.
    pub(crate) cdn_504s: u32,
    /// The lowest center version the instances ran at its end.
    pub(crate) version_min: Option<u64>,
    /// The highest.
    pub(crate) version_max: Option<u64>,
}

impl Bin {
    /// Errors / requests.
    pub(crate) fn error_rate(&self) -> f64 {
        ratio(self.errors, self.requests)
    }

    /// Attempts / requests (0 without requests).
    pub(crate) fn attempts_per_request(&self) -> f64 {
        ratio(self.attempts, self.requests)
    }
}

fn ratio(a: u32, b: u32) -> f64 {
    if b == 0 {
        0.0
    } else {
        f64::from(a) / f64::from(b)
    }
}

/// A version a rule published, and when the clients ran it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Published {
    /// The version.
    pub(crate) version: u64,
    /// Its message (`rule cdn-failing fired: retry.max_attempts 4 -> 1, …`).
    pub(crate) message: String,
    /// When the first instance ran it, in seconds.
    pub(crate) first_applied_s: Option<f64>,
    /// When every instance ran it, in seconds.
    pub(crate) all_applied_s: Option<f64>,
}

/// The instants and counts that tell the story.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Summary {
    /// When the CDN was switched to 504, in seconds.
    pub(crate) outage_at_s: Option<f64>,
    /// When it answered its first 504.
    pub(crate) first_504_s: Option<f64>,
    /// The rule's firing.
    pub(crate) fired: Option<Published>,
    /// From the first 504 to every instance running the fired version: the switch time.
    pub(crate) switch_s: Option<f64>,
    /// Whether the switch time is within [`SWITCH_GOAL`].
    pub(crate) within_goal: bool,
    /// Most attempts for one request started during the outage on a version before the
    /// rule's.
    pub(crate) max_attempts_before: u32,
    /// Most attempts for one request started on the rule's version.
    pub(crate) max_attempts_switched: u32,
    /// User errors of requests started during the outage.
    pub(crate) errors: u32,
    /// User errors of requests started on an instance already running the fired version.
    pub(crate) errors_after_switch: u32,
    /// Requests the backup source answered.
    pub(crate) from_backup: u32,
    /// When the last user error's request started.
    pub(crate) last_error_s: Option<f64>,
    /// When the CDN was switched back to serving.
    pub(crate) recovered_at_s: Option<f64>,
    /// The rule's revert.
    pub(crate) reverted: Option<Published>,
    /// Every version the center holds, in order, with its author.
    pub(crate) versions: Vec<(u64, String)>,
}

/// The bins and the summary of `run`.
pub(crate) fn read(run: &Run) -> (Vec<Bin>, Summary) {
    let r = &run.record;
    let clients = run.config.clients;
    let fired = rule_version(&run.versions, " fired:", 0);
    let reverted = fired
        .as_ref()
        .and_then(|f| rule_version(&run.versions, " reverted:", f.version));
    let published = |v: &Version| Published {
        version: v.version,
        message: v.message.clone(),
        first_applied_s: r
            .first(|m| matches!(m, Mark::Applied { version, .. } if *version == v.version))
            .map(secs),
        all_applied_s: r.all_applied(clients, v.version).map(secs),
    };
    let first_504 = r.first(|m| *m == Mark::First504);
    let all_switched = fired
        .as_ref()
        .and_then(|f| r.all_applied(clients, f.version));
    let switch = first_504
        .zip(all_switched)
        .map(|(a, b)| b.saturating_sub(a));
    let on_fired = |req: &&Request| {
        fired
            .as_ref()
            .is_some_and(|f| req.version == Some(f.version))
    };
    let errors: Vec<_> = r
        .requests
        .iter()
        .filter(|q| q.answer == Answer::Error)
        .collect();
    let before_fired = |q: &&Request| {
        q.version
            .is_some_and(|v| fired.as_ref().is_none_or(|f| v < f.version))
    };
    let outage_at = r.first(|m| *m == Mark::CdnFailing);
    let during = |at: Duration| outage_at.is_some_and(|o| at >= o);
    let summary = Summary {
        outage_at_s: outage_at.map(secs),
        first_504_s: first_504.map(secs),
        fired: fired.as_ref().map(published),
        switch_s: switch.map(secs),
        within_goal: switch.is_some_and(|s| s <= SWITCH_GOAL),
        max_attempts_before: r
            .requests
            .iter()
            .filter(|q| during(q.at) && before_fired(q))
            .map(|q| q.attempts)
            .max()
            .unwrap_or(0),
        max_attempts_switched: r
            .requests
            .iter()
            .filter(|q| on_fired(q))
            .map(|q| q.attempts)
            .max()
            .unwrap_or(0),
        errors: errors.iter().filter(|q| during(q.at)).count() as u32,
        errors_after_switch: errors.iter().filter(|q| on_fired(q)).count() as u32,
        from_backup: r
            .requests
            .iter()
            .filter(|q| q.answer == Answer::Backup)
            .count() as u32,
        last_error_s: errors.iter().map(|q| q.at).max().map(secs),
        recovered_at_s: r.first(|m| *m == Mark::CdnRecovered).map(secs),
        reverted: reverted.as_ref().map(published),
        versions: run
            .versions
            .iter()
            .map(|v| (v.version, v.author.clone()))
            .collect(),
    };
    (bins(r, clients, run.config.duration), summary)
}

/// The first version after `after` written by a rule whose message says `verb`.
fn rule_version(versions: &[Version], verb: &str, after: u64) -> Option<Version> {
    versions
        .iter()
        .find(|v| v.version > after && v.author.starts_with("rule:") && v.message.contains(verb))
        .cloned()
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

fn bins(r: &Record, clients: usize, duration: Duration) -> Vec<Bin> {
    let n = duration.as_secs().max(1) as usize;
    let mut bins: Vec<Bin> = (0..n)
        .map(|i| Bin {
            t: i as f64,
            ..Bin::default()
        })
        .collect();
    let index = |at: Duration| (at.as_secs() as usize).min(n - 1);
    for q in &r.requests {
        let bin = &mut bins[index(q.at)];
        bin.requests += 1;
        bin.attempts += q.attempts;
        bin.max_attempts = bin.max_attempts.max(q.attempts);
        match q.answer {
            Answer::Error => bin.errors += 1,
            Answer::Backup => bin.from_backup += 1,
            Answer::Cdn => {}
        }
    }
    for at in &r.cdn_504s {
        bins[index(*at)].cdn_504s += 1;
    }
    for bin in &mut bins {
        let end = Duration::from_secs_f64(bin.t + 1.0);
        let versions: Vec<_> = (0..clients).filter_map(|i| r.version_at(i, end)).collect();
        bin.version_min = versions.iter().copied().min();
        bin.version_max = versions.iter().copied().max();
    }
    bins
}

/// The table: the run in steps of a few seconds, then the story's instants.
pub(crate) fn table(bins: &[Bin], summary: &Summary) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "t (s)",
        "requests",
        "user errors",
        "from backup",
        "attempts/request",
        "max attempts",
        "CDN 504s",
        "policy version",
    ]);
    for i in 1..8 {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    let step = bins.len().div_ceil(36).max(1);
    for group in bins.chunks(step) {
        let sum = |f: fn(&Bin) -> u32| group.iter().map(f).sum::<u32>();
        let (requests, errors) = (sum(|b| b.requests), sum(|b| b.errors));
        let version = match (
            group.last().and_then(|b| b.version_min),
            group.last().and_then(|b| b.version_max),
        ) {
            (Some(lo), Some(hi)) if lo == hi => lo.to_string(),
            (Some(lo), Some(hi)) => format!("{lo}-{hi}"),
            _ => "-".to_owned(),
        };
        t.add_row(vec![
            format!("{:.0}", group[0].t),
            requests.to_string(),
            percent(ratio(errors, requests)),
            percent(ratio(sum(|b| b.from_backup), requests)),
            format!("{:.2}", ratio(sum(|b| b.attempts), requests)),
            group
                .iter()
                .map(|b| b.max_attempts)
                .max()
                .unwrap_or(0)
                .to_string(),
            sum(|b| b.cdn_504s).to_string(),
            version,
        ]);
    }
    format!("{t}\n{}", story(summary))
}

fn percent(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

fn at(s: Option<f64>) -> String {
    s.map_or_else(|| "never".to_owned(), |s| format!("{s:.1} s"))
}

/// The instants, one per line.
fn story(s: &Summary) -> String {
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!("CDN switched to 504 at      {}", at(s.outage_at_s)));
    line(format!("first 504 at                {}", at(s.first_504_s)));
    match &s.fired {
        Some(f) => line(format!(
            "rule fired: version {} ({}); first client at {}, all clients at {}",
            f.version,
            f.message,
            at(f.first_applied_s),
            at(f.all_applied_s)
        )),
        None => line("rule fired: never".to_owned()),
    }
    line(format!(
        "switch time (first 504 -> all clients switched): {} (goal <= {} s; the seeds: 30 s){}",
        at(s.switch_s),
        SWITCH_GOAL.as_secs(),
        if s.within_goal { "" } else { "  NOT MET" }
    ));
    line(format!(
        "attempts per request: up to {} before the switch, up to {} after it",
        s.max_attempts_before, s.max_attempts_switched
    ));
    line(format!(
        "user errors: {} during the outage, the last in a request started at {}; {} after the switch",
        s.errors,
        at(s.last_error_s),
        s.errors_after_switch
    ));
    line(format!("answered by the backup source: {}", s.from_backup));
    line(format!(
        "CDN recovered at            {}",
        at(s.recovered_at_s)
    ));
    match &s.reverted {
        Some(r) => line(format!(
            "rule reverted: version {} ({}); all clients at {}",
            r.version,
            r.message,
            at(r.all_applied_s)
        )),
        None => line("rule reverted: never".to_owned()),
    }
    out
}

/// Whether the run told the story: the rule fired, every client switched within the goal,
/// the switched calls sent one attempt, no user saw an error after the switch, and the rule
/// reverted after the CDN recovered. The error names the first part that did not hold.
pub(crate) fn verdict(s: &Summary) -> Result<(), String> {
    let fired = s.fired.as_ref().ok_or("the rule never fired")?;
    let switch = s
        .switch_s
        .ok_or_else(|| format!("not every client ran the rule's version {}", fired.version))?;
    if !s.within_goal {
        return Err(format!(
            "the switch took {switch:.1} s, more than the goal of {} s",
            SWITCH_GOAL.as_secs()
        ));
    }
    if s.max_attempts_switched > 1 {
        return Err(format!(
            "requests under the rule's version were sent up to {} times, not once",
            s.max_attempts_switched
        ));
    }
    if s.errors_after_switch > 0 {
        return Err(format!(
            "{} user errors after the switch",
            s.errors_after_switch
        ));
    }
    let reverted = s.reverted.as_ref().ok_or("the rule never reverted")?;
    if reverted.all_applied_s.is_none() {
        return Err(format!(
            "not every client ran the revert's version {}",
            reverted.version
        ));
    }
    Ok(())
}
