//! `stormguard advise timeouts` from files, and from a real Prometheus server scraping a test
//! service: the seeds' worked figures, the same advice both ways, a patch that `policy diff`
//! and `policy lint` read.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "support/run.rs"]
mod run;
use run::{json_rows as advice, stormguard};

fn temp(name: &str) -> PathBuf {
    run::temp_path("advise", name)
}

/// 10,000 latencies in ms whose P999 (nearest rank 9,990) is exactly `p999`: a seeded
/// linear congruential stream below it, that one, and 10 above.
fn generated(seed: u64, p999: u64) -> Vec<u64> {
    let mut x = seed;
    let mut next = |lo: u64, hi: u64| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        lo + (x >> 33) % (hi - lo)
    };
    let mut out: Vec<u64> = (0..9_989).map(|_| next(5, p999 * 9 / 10)).collect();
    out.push(p999);
    out.extend((0..10).map(|_| next(p999 + 1, p999 * 3)));
    out
}

const BOUNDS: [f64; 8] = [0.05, 0.1, 0.25, 0.5, 1.0, 1.2, 2.5, 5.0];

/// The Prometheus text exposition of `samples` (ms) as histogram `lat`, with `labels`.
fn exposition(samples: &[u64], labels: &str, scale: u64) -> String {
    let mut text = String::from("# TYPE lat histogram\n");
    for le in BOUNDS {
        #[allow(clippy::cast_precision_loss)]
        let count = samples
            .iter()
            .filter(|ms| **ms as f64 / 1000.0 <= le)
            .count() as u64;
        text.push_str(&format!(
            "lat_bucket{{{labels}le=\"{le}\"}} {}\n",
            count * scale
        ));
    }
    text.push_str(&format!(
        "lat_bucket{{{labels}le=\"+Inf\"}} {}\n",
        samples.len() as u64 * scale
    ));
    text
}

#[test]
fn the_seeds_figures_from_csv_and_a_snapshot() {
    let normal = generated(1, 1200);
    let csv = temp("normal.csv");
    let mut text = String::from("endpoint,latency_ms\n");
    for ms in &normal {
        text.push_str(&format!("GET /search,{ms}\n"));
    }
    std::fs::write(&csv, text).unwrap();
    let from_csv = advice(&[
        "advise",
        "timeouts",
        "--normal",
        csv.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(from_csv[0]["endpoint"], "GET /search");
    assert_eq!(from_csv[0]["normal"]["p999"], "1200ms");
    assert_eq!(from_csv[0]["timeout"], "1500ms");
    assert_eq!(from_csv[0]["rule"], "initial");

    let prom = temp("normal.prom");
    std::fs::write(&prom, exposition(&normal, "endpoint=\"GET /search\",", 1)).unwrap();
    let stress = temp("stress.prom");
    std::fs::write(
        &stress,
        exposition(&generated(2, 2500), "endpoint=\"GET /search\",", 1),
    )
    .unwrap();
    let both = advice(&[
        "advise",
        "timeouts",
        "--normal",
        prom.to_str().unwrap(),
        "--stress",
        stress.to_str().unwrap(),
        "--metric",
        "lat",
        "--format",
        "json",
    ]);
    assert_eq!(both[0]["normal"]["p999"], "1200ms");
    assert_eq!(both[0]["stress"]["p999"], "2500ms");
    // 0.7 x 1200 + 0.3 x 2500 + 200 ms
    assert_eq!(both[0]["timeout"], "1790ms");
    assert_eq!(both[0]["rule"], "0.7/0.3");
}

/// An HdrHistogram interval log of `samples` (ms) times `scale`, in two intervals tagged
/// `GET_/search`.
fn hdr_log(samples: &[u64], scale: u64) -> Vec<u8> {
    use hdrhistogram::Histogram;
    use hdrhistogram::serialization::V2DeflateSerializer;
    use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
    let mut out = Vec::new();
    let mut serializer = V2DeflateSerializer::new();
    let mut writer = IntervalLogWriterBuilder::new()
        .begin_log_with(&mut out, &mut serializer)
        .unwrap();
    let (first, second) = samples.split_at(samples.len() / 2);
    for (i, part) in [first, second].into_iter().enumerate() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for ms in part {
            h.record(ms * scale).unwrap();
        }
        let start = Duration::from_secs(60 * i as u64);
        writer
            .write_histogram(&h, start, Duration::from_secs(60), Tag::new("GET_/search"))
            .unwrap();
    }
    drop(writer);
    out
}

#[test]
fn an_hdr_histogram_log_gives_the_seeds_figures_as_the_csv_does() {
    let normal = temp("normal.hlog");
    std::fs::write(&normal, hdr_log(&generated(1, 1200), 1)).unwrap();
    let stress = temp("stress.hlog");
    std::fs::write(&stress, hdr_log(&generated(2, 2500), 1)).unwrap();
    let ms = advice(&[
        "advise",
        "timeouts",
        "--normal",
        normal.to_str().unwrap(),
        "--hdr-unit",
        "ms",
        "--format",
        "json",
    ]);
    assert_eq!(ms[0]["endpoint"], "GET /search");
    assert_eq!(ms[0]["normal"]["p999"], "1200ms");
    assert_eq!(ms[0]["timeout"], "1500ms");
    let both = advice(&[
        "advise",
        "timeouts",
        "--normal",
        normal.to_str().unwrap(),
        "--stress",
        stress.to_str().unwrap(),
        "--hdr-unit",
        "ms",
        "--format",
        "json",
    ]);
    assert_eq!(both[0]["timeout"], "1790ms");
    // Microseconds (the default unit): the histogram's three significant digits move the
    // P999 by under 0.1 %, not the advice.
    let micros = temp("normal-us.hlog");
    std::fs::write(&micros, hdr_log(&generated(1, 1200), 1000)).unwrap();
    let us = advice(&[
        "advise",
        "timeouts",
        "--normal",
        micros.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(us[0]["timeout"], "1500ms");
    // Garbage in a log is named, exit 2.
    let broken = temp("broken.hlog");
    std::fs::write(&broken, "Tag=GET_/x,0.000,1.000,5.000,!!!\n").unwrap();
    let o = stormguard(&["advise", "timeouts", "--normal", broken.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("broken.hlog"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn the_patch_is_read_by_diff_and_lint() {
    let csv = temp("pay.csv");
    let mut text = String::from("endpoint,latency_ms\n");
    for ms in generated(3, 1200) {
        text.push_str(&format!("POST /pay,{ms}\n"));
    }
    std::fs::write(&csv, text).unwrap();
    let base = temp("base.toml");
    std::fs::write(
        &base,
        "[endpoints.\"POST /pay\"]\ntimeouts = { overall = \"1s\" }\nretry = { max_attempts = 2 }\nbudget = { kind = \"grpc\", max_tokens = 10, token_ratio = 0.1 }\n",
    )
    .unwrap();
    let patch = temp("patched.toml");
    let o = stormguard(&[
        "advise",
        "timeouts",
        "--normal",
        csv.to_str().unwrap(),
        "--base",
        base.to_str().unwrap(),
        "--patch",
        patch.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8(o.stdout).unwrap().contains("1500ms"));
    let diff = stormguard(&[
        "policy",
        "diff",
        base.to_str().unwrap(),
        patch.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let review: Value = serde_json::from_slice(&diff.stdout).unwrap();
    let field = &review["diff"]["endpoints"][0]["fields"][0];
    assert_eq!(
        (
            field["field"].as_str(),
            field["old"].as_str(),
            field["new"].as_str()
        ),
        (Some("timeouts.overall"), Some("1s"), Some("1500ms"))
    );
    let lint = stormguard(&["policy", "lint", patch.to_str().unwrap()]);
    assert_eq!(
        lint.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&lint.stdout)
    );
}

#[test]
fn bad_latency_files_exit_2() {
    let csv = temp("bad.csv");
    std::fs::write(&csv, "endpoint,latency_ms\na,-1\n").unwrap();
    let o = stormguard(&["advise", "timeouts", "--normal", csv.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("line 2"));
    assert_eq!(stormguard(&["advise", "timeouts"]).status.code(), Some(2));
}

/// The Prometheus server of .ci/stores.sh (Debian's `prometheus`), scraping
/// STORMGUARD_TEST_PROMETHEUS_TARGET every second; without it this test says SKIPPED, and
/// fails when STORMGUARD_REQUIRE_ALL_STORES=1.
#[test]
fn a_prometheus_server_gives_the_same_advice_as_the_snapshot() {
    let (Ok(url), Ok(target)) = (
        std::env::var("STORMGUARD_TEST_PROMETHEUS_URL"),
        std::env::var("STORMGUARD_TEST_PROMETHEUS_TARGET"),
    ) else {
        assert!(
            std::env::var("STORMGUARD_REQUIRE_ALL_STORES").as_deref() != Ok("1"),
            "STORMGUARD_TEST_PROMETHEUS_URL/_TARGET are not set but STORMGUARD_REQUIRE_ALL_STORES=1"
        );
        eprintln!(
            "SKIPPED a_prometheus_server_gives_the_same_advice_as_the_snapshot: STORMGUARD_TEST_PROMETHEUS_URL and _TARGET are not set (source .ci/stores.sh)"
        );
        return;
    };
    let run = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let labels = format!("endpoint=\"GET /search\",run=\"{run}\",");
    let samples = generated(4, 1200);
    // Scrapes served so far, signalled to the waiting test on each one.
    let scrapes = Arc::new((Mutex::new(0usize), Condvar::new()));

    // The test service: zero counts on the first scrape, and the snapshot's counts once more
    // on each one after it, so the increase between any two scrapes is a multiple of the
    // snapshot's counts (the same quantiles), wherever the clock's 5-minute windows fall
    // between them (a window edge between the first two scrapes once left the day's query
    // with no window that saw an increase).
    let served_samples = samples.clone();
    let served_labels = labels.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&target))
        .unwrap();
    let served = scrapes.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (count, scraped) = &*served;
            let mut n = count.lock().unwrap();
            let body = exposition(&served_samples, &served_labels, *n as u64);
            *n += 1;
            scraped.notify_all();
            async move { body }
        }),
    );
    runtime.spawn(async move { axum::serve(listener, app).await });

    let snapshot = temp("server-snapshot.prom");
    std::fs::write(&snapshot, exposition(&samples, &labels, 1)).unwrap();
    let from_file = advice(&[
        "advise",
        "timeouts",
        "--normal",
        snapshot.to_str().unwrap(),
        "--metric",
        "lat",
        "--format",
        "json",
    ]);
    assert_eq!(from_file[0]["timeout"], "1500ms");

    // Waits on the scrapes themselves (Prometheus scrapes on its own 1 s clock): from the
    // third on, the server has both samples; each "no data yet" answer waits for the next
    // scrape. Bounded at 90 s.
    let selector = format!("run=\"{run}\"");
    let give_up = Instant::now() + Duration::from_secs(90);
    let (count, scraped) = &*scrapes;
    let mut seen = 2;
    let from_server = loop {
        let mut n = count.lock().unwrap();
        while *n <= seen {
            let left = give_up.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "Prometheus at {url} did not scrape {target} in 90 s ({} scrapes)",
                *n
            );
            n = scraped.wait_timeout(n, left).unwrap().0;
        }
        seen = *n;
        drop(n);
        let o = stormguard(&[
            "advise",
            "timeouts",
            "--prometheus",
            &url,
            "--normal-range",
            "5m",
            "--selector",
            &selector,
            "--metric",
            "lat",
            "--format",
            "json",
        ]);
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        if o.status.success() {
            break serde_json::from_slice::<Vec<Value>>(&o.stdout).unwrap();
        }
        // Until the samples are in, the server has no answer for this run's series.
        assert!(stderr.contains("no latency data"), "{stderr}");
    };
    assert_eq!(from_server[0]["endpoint"], "GET /search");
    assert_eq!(from_server[0]["timeout"], from_file[0]["timeout"]);
    assert_eq!(from_server[0]["normal"]["p999"], "1200ms");
    assert_eq!(
        from_server[0]["normal"]["p50"],
        from_file[0]["normal"]["p50"]
    );
    // The server has time: the alarm's 5-minute window P99 comes from a range query (one
    // window in a 5-minute range), about 1.18 s here, under 80 % of 1500 ms; the snapshot
    // says it has none.
    let alarm = &from_server[0]["alarm_windows"];
    assert!(alarm["windows"].as_u64().unwrap() <= 1, "{alarm}");
    assert_eq!(alarm["firing"], 0, "{alarm}");
    assert!(from_server[0].get("time_series").is_none());
    assert_eq!(from_file[0]["time_series"], "no time series in this input");
    let expr = from_server[0]["alert_rules"][0]["expr"].as_str().unwrap();
    assert!(
        expr.contains(&format!(
            "lat_bucket{{endpoint=\"GET /search\",{selector}}}[300s]"
        )) && expr.ends_with("> 1.2"),
        "{expr}"
    );
    // Over a day, the hourly histograms of the daily peak search are queried too: seconds of
    // data are no day to judge, so no peak and no window.
    let day = advice(&[
        "advise",
        "timeouts",
        "--prometheus",
        &url,
        "--normal-range",
        "1d",
        "--selector",
        &selector,
        "--metric",
        "lat",
        "--format",
        "json",
    ]);
    assert_eq!(day[0]["peak_days"], 0);
    assert_eq!(day[0]["windows"], Value::Array(Vec::new()));
    assert!(day[0]["alarm_windows"]["windows"].as_u64().unwrap() >= 1);
}
