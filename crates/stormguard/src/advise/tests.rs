#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::prometheus::Histogram;
use super::*;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// 10,000 latencies whose P999 (nearest rank 9,990) is exactly `p999_ms`: 9,989 below it,
/// that one, and 10 above it.
pub(super) fn generated(seed: u64, p999_ms: u64) -> Vec<Duration> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out: Vec<Duration> = (0..9_989)
        .map(|_| MS(rng.random_range(5..p999_ms * 9 / 10)))
        .collect();
    out.push(MS(p999_ms));
    out.extend((0..10).map(|_| MS(rng.random_range(p999_ms + 1..p999_ms * 3))));
    out
}

#[test]
fn the_seeds_worked_figures_from_generated_data() {
    let normal = Percentiles::of_samples(&generated(1, 1200)).unwrap();
    assert_eq!(normal.p999, MS(1200));
    let initial = advise(&normal, None);
    assert_eq!((initial.timeout, initial.rule), (MS(1500), "initial"));
    let stress = Percentiles::of_samples(&generated(2, 2500)).unwrap();
    let fin = advise(&normal, Some(&stress));
    // 0.7 x 1200 + 0.3 x 2500 + 200 = 840 + 750 + 200
    assert_eq!((fin.timeout, fin.rule), (MS(1790), "0.7/0.3"));
    assert_eq!(fin.alarm_above, MS(1432));
}

#[test]
fn the_p99_alarm_fires_above_80_percent_of_the_timeout() {
    let p = |p99, p999| Percentiles {
        p50: MS(10),
        p90: MS(20),
        p99: MS(p99),
        p999: MS(p999),
    };
    assert!(!advise(&p(1000, 1200), None).alarm, "1000 < 0.8 x 1500");
    assert!(advise(&p(1250, 1200), None).alarm);
    assert!(
        advise(&p(100, 1200), Some(&p(1500, 2500))).alarm,
        "the stress P99 is judged"
    );
}

#[test]
fn csv_and_prometheus_snapshots_give_the_same_advice_as_the_samples() {
    let samples = generated(3, 1200);
    let mut csv_text = String::from("endpoint,latency_ms\n");
    for s in &samples {
        csv_text.push_str(&format!("GET /search,{}\n", s.as_millis()));
    }
    let from_csv = csv::parse(&csv_text).unwrap();
    let csv_p = Percentiles::of_samples(&from_csv["GET /search"]).unwrap();
    assert_eq!(csv_p.p999, MS(1200));

    // Buckets with a bound at 1.2 s: the rank of P999 falls on it exactly.
    let bounds = [0.1, 0.25, 0.5, 1.0, 1.2, 2.5, 5.0];
    let mut text = String::from("# TYPE lat histogram\n");
    for le in bounds {
        let count = samples.iter().filter(|s| s.as_secs_f64() <= le).count();
        text.push_str(&format!(
            "lat_bucket{{endpoint=\"GET /search\",le=\"{le}\"}} {count}\n"
        ));
    }
    text.push_str(&format!(
        "lat_bucket{{endpoint=\"GET /search\",le=\"+Inf\"}} {}\n",
        samples.len()
    ));
    let hist = &prometheus::parse(&text, "lat", "endpoint").unwrap()["GET /search"];
    let prom_p = hist.percentiles().unwrap();
    assert_eq!(prom_p.p999, MS(1200));
    assert_eq!(advise(&prom_p, None).timeout, advise(&csv_p, None).timeout);
}

#[test]
fn histogram_quantile_matches_prometheus() {
    let h = Histogram::new([
        (0.1, 10.0),
        (0.5, 60.0),
        (1.0, 100.0),
        (f64::INFINITY, 100.0),
    ]);
    assert_eq!(h.quantile(0.05), Some(0.05));
    assert_eq!(h.quantile(0.35), Some(0.1 + 0.4 * 25.0 / 50.0));
    let overflow = Histogram::new([(0.1, 10.0), (f64::INFINITY, 20.0)]);
    assert_eq!(
        overflow.quantile(0.99),
        Some(0.1),
        "a rank in +Inf is the highest finite bound"
    );
    assert_eq!(
        Histogram::new([(0.1, 10.0)]).quantile(0.5),
        None,
        "no +Inf bucket"
    );
    assert_eq!(
        Histogram::new([(0.1, 0.0), (f64::INFINITY, 0.0)]).quantile(0.5),
        None
    );
}

#[test]
fn prometheus_text_sums_other_labels_and_skips_other_series() {
    let text = r#"
# HELP lat Latency.
lat_bucket{endpoint="a",instance="1",le="1"} 1
lat_bucket{endpoint="a",instance="2",le="1"} 1
lat_bucket{endpoint="a",instance="1",le="+Inf"} 2
lat_bucket{endpoint="a",instance="2",le="+Inf"} 2
lat_count{endpoint="a"} 4
other_bucket{endpoint="b",le="1"} 1
lat_bucket{endpoint="quote \"q\"",le="+Inf"} 1 1700000000000
"#;
    let h = prometheus::parse(text, "lat", "endpoint").unwrap();
    assert_eq!(h.len(), 2);
    assert_eq!(h["a"].quantile(0.5), Some(1.0));
    assert!(h.contains_key("quote \"q\""));
    for (bad, what) in [
        ("lat_bucket{endpoint=\"a\",le=\"1\"} x", "is not a number"),
        (
            "lat_bucket{endpoint=\"a\",le=\"1\"} -1",
            "not a bucket count",
        ),
        ("lat_bucket{endpoint=\"a\"} 1", "without `le`"),
        ("lat_bucket{le=\"1\"} 1", "without the `endpoint` label"),
        ("lat_bucket{endpoint=\"a} 1", "no closing quote"),
        ("other{endpoint=a} 1", "expected =\"value\""),
    ] {
        let err = prometheus::parse(bad, "lat", "endpoint").unwrap_err();
        assert_eq!(err.line, 1);
        assert!(err.message.contains(what), "{bad}: {err}");
    }
}

#[test]
fn csv_errors_name_the_line() {
    for (bad, line, what) in [
        ("", 0, "empty"),
        ("endpoint,ms\n", 1, "latency_ms"),
        ("endpoint,latency_ms\na,1\na,-3\n", 3, "not a number"),
        ("endpoint,latency_ms\na,1,2\n", 2, "3 fields"),
        ("endpoint,latency_ms\n\"a,1\n", 2, "not closed"),
    ] {
        let err = csv::parse(bad).unwrap_err();
        assert_eq!(err.line, line, "{bad:?}: {err}");
        assert!(err.message.contains(what), "{bad:?}: {err}");
    }
}

#[test]
fn the_patch_sets_the_attempt_timeout_and_reads_back() {
    let base = PolicyFile::from_toml(
        r#"[endpoints."GET /search"]
        timeouts = { per_try = "300ms", overall = "5s" }
        [endpoints."POST /pay"]
        timeouts = { overall = "1s" }"#,
    )
    .unwrap();
    let p = |p999| Percentiles {
        p50: MS(10),
        p90: MS(20),
        p99: MS(30),
        p999: MS(p999),
    };
    let advice: BTreeMap<String, Advice> = [
        ("GET /search".to_owned(), advise(&p(1200), None)),
        ("POST /pay".to_owned(), advise(&p(800), None)),
        ("GET /new".to_owned(), advise(&p(400), None)),
    ]
    .into_iter()
    .collect();
    let file = patch(&advice, &BTreeMap::new(), Some(&base)).unwrap();
    assert_eq!(
        file.endpoint("GET /search")
            .unwrap()
            .retry()
            .per_try_timeout(),
        Some(MS(1500))
    );
    assert_eq!(
        file.endpoint("GET /search").unwrap().overall_timeout(),
        Some(MS(5000))
    );
    assert_eq!(
        file.endpoint("POST /pay").unwrap().overall_timeout(),
        Some(MS(1000))
    );
    assert_eq!(
        file.endpoint("GET /new").unwrap().overall_timeout(),
        Some(MS(500))
    );
    // A per-try timeout that no longer fits the overall one is refused, naming the field.
    let tight = PolicyFile::from_toml(
        "[endpoints.\"GET /search\"]\ntimeouts = { per_try = \"300ms\", overall = \"1s\" }",
    )
    .unwrap();
    let err = patch(&advice, &BTreeMap::new(), Some(&tight)).unwrap_err();
    assert!(err.to_string().contains("timeouts.per_try"), "{err}");
}

proptest! {
    #[test]
    fn the_csv_parser_never_panics(text in "(?s).{0,300}") {
        let _ = csv::parse(&text);
    }

    #[test]
    fn the_prometheus_parser_never_panics(text in "(lat_bucket\\{[a-z\"=,\\\\+Inf0-9. ]{0,40}\\}? ?[0-9.a-z+]{0,6}\n){0,6}") {
        if let Ok(map) = prometheus::parse(&text, "lat", "endpoint") {
            for h in map.values() {
                let _ = h.percentiles();
            }
        }
    }

    #[test]
    fn csv_rows_round_trip(rows in proptest::collection::vec(("[a-zA-Z /,\"]{1,12}", 0u32..100_000), 1..20)) {
        let mut text = String::from("latency_ms,endpoint\n");
        for (name, ms) in &rows {
            text.push_str(&format!("{ms},\"{}\"\n", name.replace('"', "\"\"")));
        }
        let parsed = csv::parse(&text).unwrap();
        let total: usize = parsed.values().map(Vec::len).sum();
        prop_assert_eq!(total, rows.len());
        for (name, ms) in &rows {
            prop_assert!(parsed[name].contains(&MS(u64::from(*ms))));
        }
    }
}

/// A bucket bound beyond any latency (`le="1e300"`) makes the percentiles that fall in it
/// unusable — no advice — instead of overflowing a `Duration`.
#[test]
fn an_absurd_bucket_bound_gives_no_percentiles_instead_of_a_panic() {
    let hist = Histogram::new([(0.1, 10.0), (1e300, 1000.0), (f64::INFINITY, 1000.0)]);
    assert_eq!(hist.percentiles(), None);
}
