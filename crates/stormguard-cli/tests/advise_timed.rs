//! `stormguard advise timeouts` with timestamped data: the P99 alarm over 5-minute windows,
//! the daily peak suggested as a policy time window (and read back by the real loader,
//! `policy lint` and `policy diff`), and what an input without time says.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use stormguard::policy::PolicyFile;

#[path = "support/run.rs"]
mod run;
use run::{json_rows as json, stormguard};

/// 2026-03-01T00:00:00Z.
const MIDNIGHT: u64 = 1_772_323_200;

fn temp(name: &str) -> PathBuf {
    run::temp_path("advise-timed", name)
}

/// A seeded linear congruential stream in `lo..hi`.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        lo + (self.0 >> 33) % (hi - lo)
    }
}

/// Two days from [`MIDNIGHT`], one request every 6 s: 20–100 ms; with `peak`, 100–200 ms
/// from 19:00 to 21:00 UTC; with `burst`, every tenth request of day one's 10:00–10:05 takes
/// 1500 ms. (seconds since MIDNIGHT, ms).
fn days(seed: u64, peak: bool, burst: bool) -> Vec<(u64, u64)> {
    let mut rng = Lcg(seed);
    (0..48 * 600)
        .map(|i| {
            let offset = i * 6;
            let hour = offset / 3600 % 24;
            let ms = if burst && (36_000..36_300).contains(&offset) && i % 10 == 0 {
                1500
            } else if peak && (19..21).contains(&hour) {
                rng.next(100, 200)
            } else {
                rng.next(20, 100)
            };
            (offset, ms)
        })
        .collect()
}

/// `rows` as a CSV with timestamps, alternating RFC 3339 and Unix seconds.
fn timed_csv(name: &str, endpoint: &str, rows: &[(u64, u64)]) -> PathBuf {
    let mut text = String::from("timestamp,endpoint,latency_ms\n");
    for (i, (offset, ms)) in rows.iter().enumerate() {
        let t = MIDNIGHT + offset;
        if i % 2 == 0 {
            text.push_str(&format!("{t},{endpoint},{ms}\n"));
        } else {
            let (h, m, s) = (offset / 3600 % 24, offset / 60 % 60, offset % 60);
            let day = 1 + offset / 86_400;
            text.push_str(&format!(
                "2026-03-{day:02}T{h:02}:{m:02}:{s:02}Z,{endpoint},{ms}\n"
            ));
        }
    }
    let path = temp(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A stress run without timestamps: 10,000 latencies of P999 exactly 300 ms.
fn stress_csv(endpoint: &str) -> PathBuf {
    let mut rng = Lcg(99);
    let mut text = String::from("endpoint,latency_ms\n");
    for _ in 0..9_989 {
        text.push_str(&format!("{endpoint},{}\n", rng.next(20, 250)));
    }
    text.push_str(&format!("{endpoint},300\n"));
    for _ in 0..10 {
        text.push_str(&format!("{endpoint},{}\n", rng.next(301, 900)));
    }
    let path = temp(&format!("stress-{}.csv", endpoint.len()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_daily_peak_and_a_burst_in_a_timestamped_csv() {
    let normal = timed_csv("peak.csv", "GET /search", &days(1, true, true));
    let stress = stress_csv("GET /search");
    let (n, s) = (normal.to_str().unwrap(), stress.to_str().unwrap());
    let rows = json(&[
        "advise", "timeouts", "--normal", n, "--stress", s, "--format", "json",
    ]);
    let row = &rows[0];
    assert!(row.get("time_series").is_none(), "{row}");
    let windows = row["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 1, "{row}");
    let w = &windows[0];
    assert_eq!(
        (&w["start"], &w["end"], &w["time_zone"], &w["suggested"]),
        (
            &Value::from("19:00"),
            &Value::from("21:00"),
            &Value::from("UTC"),
            &Value::from(true)
        )
    );
    let alarm = &row["alarm_windows"];
    assert_eq!(alarm["window"], "5m");
    assert_eq!(alarm["windows"], 576);
    assert_eq!(alarm["firing"], 1, "{alarm}");
    assert_eq!(alarm["first"]["start"], "2026-03-01T10:00:00Z");
    assert_eq!(alarm["first"]["p99"], "1500ms");
    assert_eq!(alarm["worst"], alarm["first"]);
    let rules = row["alert_rules"].as_array().unwrap();
    assert_eq!(rules.len(), 2, "the endpoint's and the window's");
    let base = rules[0]["expr"].as_str().unwrap();
    assert!(
        base.starts_with("histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket{endpoint=\"GET /search\"}[300s])))"),
        "{base}"
    );
    assert!(base.ends_with("unless on() (hour() >= 19 < 21)"), "{base}");
    assert!(
        rules[1]["expr"]
            .as_str()
            .unwrap()
            .ends_with("and on() (hour() >= 19 < 21)")
    );

    let table = stormguard(&["advise", "timeouts", "--normal", n, "--stress", s]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains("would fire"), "{table}");
    assert!(table.contains("19:00-21:00 UTC"), "{table}");
    assert!(table.contains("2026-03-01T10:00:00Z P99 1500ms"), "{table}");
    assert!(table.contains("hours outside it"), "{table}");

    // A 10-minute alarm window halves the windows; the burst still fires one.
    let ten = json(&[
        "advise",
        "timeouts",
        "--normal",
        n,
        "--stress",
        s,
        "--alarm-window",
        "10m",
        "--format",
        "json",
    ]);
    assert_eq!(ten[0]["alarm_windows"]["windows"], 288);
    assert_eq!(ten[0]["alarm_windows"]["firing"], 1);
    // In Shanghai's hours the window is 03:00-05:00.
    let shanghai = json(&[
        "advise",
        "timeouts",
        "--normal",
        n,
        "--stress",
        s,
        "--time-zone",
        "Asia/Shanghai",
        "--format",
        "json",
    ]);
    assert_eq!(shanghai[0]["windows"][0]["start"], "03:00");
    let bad = stormguard(&[
        "advise",
        "timeouts",
        "--normal",
        n,
        "--time-zone",
        "Nowhere/X",
    ]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn flat_data_yields_no_window_and_no_alarm() {
    let normal = timed_csv("flat.csv", "GET /flat", &days(2, false, false));
    let stress = stress_csv("GET /flat");
    let rows = json(&[
        "advise",
        "timeouts",
        "--normal",
        normal.to_str().unwrap(),
        "--stress",
        stress.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(rows[0]["peak_days"], 2);
    assert_eq!(rows[0]["windows"], Value::Array(Vec::new()));
    assert_eq!(rows[0]["alarm_windows"]["windows"], 576);
    assert_eq!(rows[0]["alarm_windows"]["firing"], 0);
    assert_eq!(rows[0]["alarm_windows"]["first"], Value::Null);
    assert_eq!(rows[0]["alert_rules"].as_array().unwrap().len(), 1);
}

#[test]
fn the_patched_window_is_read_by_the_loader_lint_and_diff() {
    let normal = timed_csv("pay.csv", "POST /pay", &days(3, true, false));
    let stress = stress_csv("POST /pay");
    let base = temp("base.toml");
    std::fs::write(
        &base,
        "[endpoints.\"POST /pay\"]\ntimeouts = { per_try = \"100ms\", overall = \"2s\" }\nretry = { max_attempts = 3 }\nbudget = { kind = \"grpc\", max_tokens = 10, token_ratio = 0.1 }\n",
    )
    .unwrap();
    let patch = temp("patched.toml");
    let o = stormguard(&[
        "advise",
        "timeouts",
        "--normal",
        normal.to_str().unwrap(),
        "--stress",
        stress.to_str().unwrap(),
        "--base",
        base.to_str().unwrap(),
        "--patch",
        patch.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let row: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let (timeout, window_timeout) = (
        row[0]["timeout"].as_str().unwrap().to_owned(),
        row[0]["windows"][0]["advice"]["timeout"]
            .as_str()
            .unwrap()
            .to_owned(),
    );

    let file = PolicyFile::load(&patch).unwrap();
    let policy = file.endpoint("POST /pay").unwrap();
    assert_eq!(policy.windows().len(), 1);
    let window = &policy.windows()[0];
    assert_eq!(window.schedule().to_string(), "19:00-21:00 UTC daily");
    let per_try = |p: &stormguard::policy::EndpointPolicy| {
        stormguard::duration::format_duration(p.retry().per_try_timeout().unwrap())
    };
    assert_eq!(per_try(policy), timeout);
    assert_eq!(per_try(window.policy()), window_timeout);
    assert_eq!(
        window.policy().overall_timeout(),
        Some(Duration::from_secs(2))
    );

    let lint = stormguard(&["policy", "lint", patch.to_str().unwrap()]);
    assert_eq!(
        lint.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&lint.stdout)
    );
    let diff = stormguard(&[
        "policy",
        "diff",
        base.to_str().unwrap(),
        patch.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(diff.status.success() || diff.status.code() == Some(1));
    let review: Value = serde_json::from_slice(&diff.stdout).unwrap();
    let text = review["diff"].to_string();
    assert!(text.contains("timeouts.per_try"), "{text}");
    assert!(text.contains("windows"), "{text}");
}

#[test]
fn a_snapshot_says_it_has_no_time_series() {
    let prom = temp("snap.prom");
    std::fs::write(
        &prom,
        "lat_bucket{endpoint=\"GET /\",le=\"0.1\"} 90\nlat_bucket{endpoint=\"GET /\",le=\"1\"} 100\nlat_bucket{endpoint=\"GET /\",le=\"+Inf\"} 100\n",
    )
    .unwrap();
    let p = prom.to_str().unwrap();
    let rows = json(&[
        "advise", "timeouts", "--normal", p, "--metric", "lat", "--format", "json",
    ]);
    assert_eq!(rows[0]["time_series"], "no time series in this input");
    assert_eq!(rows[0]["alarm_windows"], Value::Null);
    let table = stormguard(&["advise", "timeouts", "--normal", p, "--metric", "lat"]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains("no time series in this input"), "{table}");
    // The old two-column CSV reads as before, without time.
    let csv = temp("old.csv");
    std::fs::write(&csv, "endpoint,latency_ms\na,10\na,20\n").unwrap();
    let rows = json(&[
        "advise",
        "timeouts",
        "--normal",
        csv.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(rows[0]["time_series"], "no time series in this input");
}

/// An HdrHistogram log with a `StartTime`: one 5-minute interval per row of `days` grouped.
fn hdr_log(rows: &[(u64, u64)]) -> Vec<u8> {
    use hdrhistogram::Histogram;
    use hdrhistogram::serialization::V2DeflateSerializer;
    use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
    let mut out = Vec::new();
    let mut serializer = V2DeflateSerializer::new();
    let mut writer = IntervalLogWriterBuilder::new()
        .with_start_time(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(MIDNIGHT))
        .begin_log_with(&mut out, &mut serializer)
        .unwrap();
    for chunk in rows.chunk_by(|a, b| a.0 / 300 == b.0 / 300) {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for (_, ms) in chunk {
            h.record(*ms).unwrap();
        }
        writer
            .write_histogram(
                &h,
                Duration::from_secs(chunk[0].0 / 300 * 300),
                Duration::from_secs(300),
                Tag::new("GET_/search"),
            )
            .unwrap();
    }
    drop(writer);
    out
}

#[test]
fn an_hdr_log_with_a_start_time_gives_the_same_window_and_alarm() {
    let log = temp("peak.hlog");
    std::fs::write(&log, hdr_log(&days(1, true, true))).unwrap();
    let stress = stress_csv("GET /search");
    let rows = json(&[
        "advise",
        "timeouts",
        "--normal",
        log.to_str().unwrap(),
        "--stress",
        stress.to_str().unwrap(),
        "--hdr-unit",
        "ms",
        "--format",
        "json",
    ]);
    let row = &rows[0];
    assert_eq!(row["endpoint"], "GET /search");
    assert_eq!(row["windows"][0]["start"], "19:00", "{row}");
    assert_eq!(row["windows"][0]["end"], "21:00");
    assert_eq!(row["alarm_windows"]["firing"], 1);
    assert_eq!(
        row["alarm_windows"]["first"]["start"],
        "2026-03-01T10:00:00Z"
    );
}
