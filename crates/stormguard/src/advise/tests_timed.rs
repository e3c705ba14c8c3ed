//! The alarm over 5-minute windows and the daily peak search, on generated two-day data.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::peak::daily_peaks;
use super::timed::{ALARM_WINDOW, Interval, window_p99s};
use super::*;

const MS: fn(u64) -> Duration = Duration::from_millis;
/// 2026-03-01T00:00:00Z.
const MIDNIGHT: u64 = 1_772_323_200;

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// What the generated days hold besides the flat 20–100 ms.
#[derive(Clone, Copy)]
struct Shape {
    /// 19:00–21:00 UTC every day: 100–200 ms.
    peak: bool,
    /// Day one 10:00–10:05 UTC: every tenth request takes 1500 ms.
    burst: bool,
}

/// `hours` of one request every 6 s from [`MIDNIGHT`], seeded.
fn generated(seed: u64, hours: u64, shape: Shape) -> Vec<(SystemTime, Duration)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..hours * 600)
        .map(|i| {
            let offset = i * 6;
            let hour = offset / 3600 % 24;
            let burst = (36_000..36_300).contains(&offset) && i % 10 == 0;
            let latency = if shape.burst && burst {
                1500
            } else if shape.peak && (19..21).contains(&hour) {
                rng.random_range(100..200)
            } else {
                rng.random_range(20..100)
            };
            (at(MIDNIGHT + offset), MS(latency))
        })
        .collect()
}

fn intervals(rows: &[(SystemTime, Duration)]) -> impl Iterator<Item = Interval<Vec<Duration>>> {
    rows.iter().map(|&(start, l)| Interval {
        start,
        latencies: vec![l],
    })
}

fn timed(rows: &[(SystemTime, Duration)], zone: &str) -> TimedAdvice {
    let whole: Vec<Duration> = rows.iter().map(|r| r.1).collect();
    let whole = Percentiles::of_samples(&whole).unwrap();
    let stress = Percentiles {
        p999: MS(300),
        ..whole
    };
    let series = window_p99s(intervals(rows), ALARM_WINDOW);
    let peaks = daily_peaks(intervals(rows), zone).unwrap();
    advise_timed(&whole, Some(&stress), &series, ALARM_WINDOW, peaks)
}

const BOTH: Shape = Shape {
    peak: true,
    burst: true,
};
const FLAT: Shape = Shape {
    peak: false,
    burst: false,
};

#[test]
fn a_daily_peak_is_found_as_a_window_in_the_zone_asked() {
    let rows = generated(7, 48, BOTH);
    let utc = daily_peaks(intervals(&rows), "UTC").unwrap();
    assert_eq!(utc.days, 2);
    assert_eq!(utc.peaks.len(), 1, "{utc:?}");
    let peak = &utc.peaks[0];
    assert_eq!((peak.start.as_str(), peak.end.as_str()), ("19:00", "21:00"));
    assert!(peak.typical_p99 < MS(100), "{peak:?}");
    assert!(peak.percentiles.p99 >= MS(190), "{peak:?}");
    assert!(utc.off_peak.unwrap().p999 < MS(100));
    // 19:00-21:00 UTC is 03:00-05:00 in Shanghai (UTC+8; the days there are cut elsewhere).
    let shanghai = daily_peaks(intervals(&rows), "Asia/Shanghai").unwrap();
    let p = &shanghai.peaks[0];
    assert_eq!(
        (p.start.as_str(), p.end.as_str(), p.time_zone.as_str()),
        ("03:00", "05:00", "Asia/Shanghai")
    );
    assert!(daily_peaks(intervals(&rows), "Mars/Olympus").is_err());
}

#[test]
fn the_alarm_fires_on_the_burst_window_alone() {
    let rows = generated(7, 48, BOTH);
    let t = timed(&rows, "UTC");
    // Off-peak: 0.7 x P999 (under 100 ms) + 0.3 x 300 ms + 200 ms; the peak's window: its own.
    assert!(t.advice.timeout <= MS(360), "{:?}", t.advice);
    assert_eq!(t.windows.len(), 1);
    assert!(t.windows[0].suggested);
    assert!(t.windows[0].advice.timeout > t.advice.timeout);
    assert_eq!(t.alarm.windows, 48 * 12);
    assert_eq!(t.alarm.firing, 1, "{:?}", t.alarm);
    let first = t.alarm.first.unwrap();
    assert_eq!(first, t.alarm.worst.unwrap());
    assert_eq!((first.start, first.p99), (at(MIDNIGHT + 36_000), MS(1500)));
    assert!(t.alarm.would_fire());
    // Without a stress run the margins are thin: the peak's 5-minute P99s (up to 199 ms) are
    // above the endpoint's off-peak threshold, and each is judged against its window's.
    let rows_only: Vec<Duration> = rows.iter().map(|r| r.1).collect();
    let whole = Percentiles::of_samples(&rows_only).unwrap();
    let series = window_p99s(intervals(&rows), ALARM_WINDOW);
    let peaks = daily_peaks(intervals(&rows), "UTC").unwrap();
    let bare = advise_timed(&whole, None, &series, ALARM_WINDOW, peaks);
    assert_eq!(bare.advice.alarm_above, MS(104), "0.8 x 130 ms");
    assert_eq!(bare.windows[0].advice.alarm_above, MS(200), "0.8 x 250 ms");
    let above_base = series
        .iter()
        .filter(|w| w.p99 > bare.advice.alarm_above)
        .count();
    assert!(above_base > 40, "{above_base} windows above 104 ms");
    assert_eq!(bare.alarm.firing, 1, "{:?}", bare.alarm);
}

#[test]
fn a_flat_data_set_yields_no_window_and_no_alarm() {
    let rows = generated(8, 48, FLAT);
    let t = timed(&rows, "UTC");
    assert_eq!(t.peak_days, 2);
    assert!(t.windows.is_empty());
    assert_eq!((t.alarm.windows, t.alarm.firing), (576, 0));
    assert_eq!((t.alarm.first, t.alarm.worst), (None, None));
    assert!(!t.alarm.would_fire());
    // The burst alone fires, and does not make a peak hour.
    let burst = timed(
        &generated(
            8,
            48,
            Shape {
                peak: false,
                burst: true,
            },
        ),
        "UTC",
    );
    assert!(burst.windows.is_empty());
    assert_eq!(burst.alarm.firing, 1);
}

#[test]
fn less_than_a_day_is_not_searched_for_peaks() {
    let rows = generated(9, 20, BOTH);
    let search = daily_peaks(intervals(&rows), "UTC").unwrap();
    assert_eq!((search.days, search.peaks.len()), (0, 0));
    assert_eq!(search.off_peak, None);
}

#[test]
fn the_patch_writes_the_peak_as_a_policy_window() {
    let rows = generated(7, 48, BOTH);
    let t = timed(&rows, "UTC");
    let advice: BTreeMap<String, Advice> = [("GET /search".to_owned(), t.advice)].into();
    let windows: BTreeMap<String, Vec<WindowAdvice>> =
        [("GET /search".to_owned(), t.windows.clone())].into();
    let base = PolicyFile::from_toml(
        "[endpoints.\"GET /search\"]\nretry = { max_attempts = 2 }\ntimeouts = { per_try = \"100ms\", overall = \"2s\" }",
    )
    .unwrap();
    let file = patch(&advice, &windows, Some(&base)).unwrap();
    // Read back as a file, as `policy lint` would.
    let file = PolicyFile::from_toml(&file.to_toml()).unwrap();
    let policy = file.endpoint("GET /search").unwrap();
    assert_eq!(policy.windows().len(), 1);
    let schedule = policy.windows()[0].schedule();
    assert_eq!(
        (schedule.start(), schedule.end(), schedule.time_zone()),
        ("19:00".to_owned(), "21:00".to_owned(), "UTC")
    );
    let per_try = |secs| {
        policy
            .in_force_at(at(MIDNIGHT + secs))
            .policy
            .retry()
            .per_try_timeout()
    };
    assert_eq!(per_try(19 * 3600 + 1800), Some(t.windows[0].advice.timeout));
    assert_eq!(per_try(12 * 3600), Some(t.advice.timeout));
    assert_eq!(policy.overall_timeout(), Some(MS(2000)));

    // A base window over the same hours: the loader refuses the patch, naming the field.
    let busy = PolicyFile::from_toml(
        "[endpoints.\"GET /search\"]\ntimeouts = { overall = \"2s\" }\n[[endpoints.\"GET /search\".windows]]\nstart = \"20:00\"\nend = \"22:00\"\ntime_zone = \"UTC\"\noverrides = { timeouts = { overall = \"3s\" } }",
    )
    .unwrap();
    let err = patch(&advice, &windows, Some(&busy)).unwrap_err();
    assert!(err.to_string().contains("windows"), "{err}");
}

#[test]
fn csv_timestamps_are_rfc3339_or_unix_seconds() {
    let text = "endpoint,timestamp,latency_ms\n\
        a,2026-03-01T19:00:00Z,10\n\
        a,2026-03-02T03:00:00+08:00,20\n\
        b,1772391600.5,30\n";
    let rows = csv::parse_timed(text).unwrap().unwrap();
    assert_eq!(rows["a"][0], (at(MIDNIGHT + 19 * 3600), MS(10)));
    assert_eq!(rows["a"][1].0, at(MIDNIGHT + 19 * 3600));
    assert_eq!(
        rows["b"][0].0,
        at(1_772_391_600) + Duration::from_millis(500)
    );
    // The old two-column format reads as before, without times.
    assert_eq!(csv::parse(text).unwrap()["a"], vec![MS(10), MS(20)]);
    assert!(
        csv::parse_timed("endpoint,latency_ms\na,1\n")
            .unwrap()
            .is_none()
    );
    for (bad, line) in [
        ("timestamp,endpoint,latency_ms\nyesterday,a,1\n", 2),
        ("timestamp,endpoint,latency_ms\n1,a,1\n,a,2\n", 3),
        ("timestamp,endpoint,latency_ms\n1e300,a,1\n", 2),
    ] {
        let err = csv::parse_timed(bad).unwrap_err();
        assert_eq!(err.line, line, "{bad:?}: {err}");
        assert!(err.message.contains("timestamp"), "{err}");
    }
}

#[test]
fn histograms_merge_into_windows_as_samples_do() {
    use super::prometheus::Histogram;
    let h = |fast: f64, slow: f64| {
        Histogram::new([
            (0.1, fast),
            (1.0, fast + slow),
            (f64::INFINITY, fast + slow),
        ])
    };
    let steps = [
        (0, h(100.0, 0.0)),
        (60, h(100.0, 0.0)),
        (300, h(90.0, 10.0)),
    ]
    .map(|(s, latencies)| Interval {
        start: at(MIDNIGHT + s),
        latencies,
    });
    let p99s = window_p99s(steps, ALARM_WINDOW);
    assert_eq!(p99s.len(), 2);
    assert!(p99s[0].p99 <= MS(100));
    assert!(p99s[1].p99 > MS(900), "{p99s:?}");
}

proptest! {
    #[test]
    fn timestamped_csv_never_panics(body in "([0-9TZ:+.\\-]{0,25},[a-z]{0,3},[0-9.]{0,5}\n){0,8}") {
        let _ = csv::parse_timed(&format!("timestamp,endpoint,latency_ms\n{body}"));
    }
}
