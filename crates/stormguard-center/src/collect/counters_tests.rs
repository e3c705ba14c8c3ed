#![allow(clippy::unwrap_used)]

use stormguard::rules::Series;

use super::*;
use stormguard::advise::prometheus::exposition::parse;

fn counters(text: &str) -> Counters {
    Counters::read(&parse(text).unwrap())
}

fn round_of(increases: &[(Increase, f64)]) -> crate::collect::Round {
    reading(increases).into_round(0, 1.0, increases.len(), Vec::new(), 0)
}

const BEFORE: &str = r#"
stormguard_requests_total{endpoint="img",outcome="succeeded"} 10
stormguard_attempts_total{endpoint="img"} 10
stormguard_responses_total{endpoint="img",code="200"} 10
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="0.1"} 10
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="1"} 10
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="+Inf"} 10
process_cpu_seconds_total 5
process_cpu_allowance_cores 2
process_resident_memory_bytes 1000
process_start_time_seconds 1700000000
"#;

const AFTER: &str = r#"
stormguard_requests_total{endpoint="img",outcome="succeeded"} 10
stormguard_requests_total{endpoint="img",outcome="attempts_exhausted"} 10
stormguard_attempts_total{endpoint="img"} 40
stormguard_responses_total{endpoint="img",code="200"} 10
stormguard_responses_total{endpoint="img",code="504"} 30
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="0.1"} 10
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="1"} 40
stormguard_attempt_duration_seconds_bucket{endpoint="img",le="+Inf"} 40
process_cpu_seconds_total 6
process_cpu_allowance_cores 2
process_resident_memory_bytes 2000
process_start_time_seconds 1700000000
"#;

#[test]
fn increases_between_scrapes_make_the_series() {
    let delta = counters(AFTER).since(&counters(BEFORE)).unwrap();
    let round = reading(&[(delta, 2.0)]).into_round(0, 2.0, 1, Vec::new(), 0);
    let seen = &round.observations;
    assert_eq!(seen.get(Some("img"), Series::ErrorRatio), Some(1.0));
    assert_eq!(
        seen.get(Some("img"), Series::ErrorRatioCode(504)),
        Some(1.0)
    );
    assert_eq!(
        seen.get(Some("img"), Series::ErrorRatioCode(200)),
        Some(0.0)
    );
    assert_eq!(round.attempts_per_request("img"), Some(3.0));
    assert_eq!(round.endpoints["img"].requests_per_second, 5.0);
    let p99 = seen.get(Some("img"), Series::P99).unwrap();
    assert!(p99 > 0.1 && p99 <= 1.0, "{p99}");
    assert_eq!(seen.get(None, Series::Memory), Some(2000.0));
}

#[test]
fn cpu_is_a_fraction_of_the_cores_the_instance_may_use() {
    // One CPU-second over two seconds on two cores: a quarter of the allowance.
    let delta = counters(AFTER).since(&counters(BEFORE)).unwrap();
    let round = reading(&[(delta, 2.0)]).into_round(0, 2.0, 1, Vec::new(), 0);
    assert_eq!(round.observations.get(None, Series::Cpu), Some(0.25));
    // Without the allowance the fraction is unknown: no CPU series.
    let strip = |t: &str| t.replace("process_cpu_allowance_cores 2\n", "");
    let delta = counters(&strip(AFTER))
        .since(&counters(&strip(BEFORE)))
        .unwrap();
    let round = reading(&[(delta, 2.0)]).into_round(0, 2.0, 1, Vec::new(), 0);
    assert_eq!(round.observations.get(None, Series::Cpu), None);
}

#[test]
fn a_restart_is_a_new_baseline_even_when_the_sums_grew() {
    // The restarted process already made more calls than the old one had: the sum of the
    // request counters grew, but the succeeded series went down.
    let before = counters(
        "stormguard_requests_total{endpoint=\"img\",outcome=\"succeeded\"} 100\n\
         stormguard_requests_total{endpoint=\"img\",outcome=\"attempts_exhausted\"} 0\n",
    );
    let after = counters(
        "stormguard_requests_total{endpoint=\"img\",outcome=\"succeeded\"} 10\n\
         stormguard_requests_total{endpoint=\"img\",outcome=\"attempts_exhausted\"} 200\n",
    );
    assert_eq!(after.since(&before), None);
    // A new start time is a restart whatever the counters say.
    let restarted = AFTER.replace("1700000000", "1700000100");
    assert_eq!(counters(&restarted).since(&counters(BEFORE)), None);
    // The same process: an increase.
    assert!(counters(AFTER).since(&counters(BEFORE)).is_some());
}

#[test]
fn instances_are_summed_and_their_gauges_maxed() {
    let one = counters(AFTER).since(&counters(BEFORE)).unwrap();
    // Ten good calls since an empty page.
    let two = counters(BEFORE).since(&Counters::default()).unwrap();
    let round = round_of(&[(one, 1.0), (two, 1.0)]);
    assert_eq!(round.error_ratio("img"), Some(0.5));
    assert_eq!(round.observations.get(None, Series::Memory), Some(2000.0));
}

#[test]
fn buckets_of_several_series_are_summed_and_summaries_maxed() {
    // Two series of one endpoint (another label tells them apart): 90 fast attempts in one,
    // 10 slow ones in the other. Overwriting one with the other would give 0.1 or 1.
    let page = "\
        stormguard_responses_total{endpoint=\"img\",code=\"200\"} 100\n\
        stormguard_attempt_duration_seconds_bucket{endpoint=\"img\",host=\"a\",le=\"0.1\"} 90\n\
        stormguard_attempt_duration_seconds_bucket{endpoint=\"img\",host=\"a\",le=\"1\"} 90\n\
        stormguard_attempt_duration_seconds_bucket{endpoint=\"img\",host=\"a\",le=\"+Inf\"} 90\n\
        stormguard_attempt_duration_seconds_bucket{endpoint=\"img\",host=\"b\",le=\"0.1\"} 0\n\
        stormguard_attempt_duration_seconds_bucket{endpoint=\"img\",host=\"b\",le=\"1\"} 10\n\
        stormguard_attempt_duration_seconds_bucket{endpoint=\"img\",host=\"b\",le=\"+Inf\"} 10\n";
    let delta = counters(page).since(&Counters::default()).unwrap();
    let p99 = round_of(&[(delta, 1.0)]).p99_seconds("img").unwrap();
    // Rank 99 of 100: 9 of the 10 attempts between 0.1 and 1.
    assert!((p99 - (0.1 + 0.9 * 0.9)).abs() < 1e-9, "{p99}");

    let summary = "\
        stormguard_responses_total{endpoint=\"img\",code=\"200\"} 100\n\
        stormguard_attempt_duration_seconds{endpoint=\"img\",host=\"a\",quantile=\"0.99\"} 0.7\n\
        stormguard_attempt_duration_seconds{endpoint=\"img\",host=\"b\",quantile=\"0.99\"} 0.2\n";
    let delta = counters(summary).since(&Counters::default()).unwrap();
    assert_eq!(round_of(&[(delta, 1.0)]).p99_seconds("img"), Some(0.7));
}

#[test]
fn a_summary_p99_without_attempts_in_the_round_is_not_a_reading() {
    // The exporter's summary still says 0 (its window emptied) while nothing was called:
    // no evidence for a rule either way.
    let page = "\
        stormguard_responses_total{endpoint=\"img\",code=\"200\"} 100\n\
        stormguard_attempt_duration_seconds{endpoint=\"img\",quantile=\"0.99\"} 0\n";
    let delta = counters(page).since(&counters(page)).unwrap();
    let round = round_of(&[(delta, 1.0)]);
    assert!(round.endpoints.contains_key("img"));
    assert_eq!(round.p99_seconds("img"), None);
}

#[test]
fn endpoints_past_the_limit_are_counted_not_kept() {
    let page: String = (0..MAX_ENDPOINTS + 3)
        .map(|i| format!("stormguard_attempts_total{{endpoint=\"e{i:04}\"}} 1\n"))
        .collect();
    let read = counters(&page);
    assert_eq!(read.dropped_endpoints(), 3);
    let delta = read.since(&Counters::default()).unwrap();
    assert_eq!(delta.endpoints.len(), MAX_ENDPOINTS);
    assert!(
        !delta
            .endpoints
            .contains_key(&format!("e{MAX_ENDPOINTS:04}"))
    );
}
