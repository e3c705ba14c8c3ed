//! Time windows: the seeds' 3 a.m. maintenance window, the days clocks change, and every bad
//! window refused with its field named.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime};

use super::*;

/// The instant written in RFC 3339 (`"2026-03-08T07:00:00Z"`).
fn utc(text: &str) -> SystemTime {
    let ts: jiff::Timestamp = text.parse().expect("a test timestamp");
    SystemTime::try_from(ts).expect("in range")
}

/// The seeds' case: a payment callback whose bank runs maintenance at 3 a.m. Shanghai time.
const SEEDS: &str = r#"
[endpoints."POST /callback"]
idempotency = "key"
timeouts = { per_try = "300ms", overall = "1s" }
retry = { max_attempts = 3, min_call = "50ms" }
budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
breaker = { count = 20, minimum_throughput = 10 }

[[endpoints."POST /callback".windows]]
start = "03:00"
end = "04:00"
time_zone = "Asia/Shanghai"
overrides = { timeouts = { per_try = "2s", overall = "5s" } }
"#;

fn per_try(policy: &EndpointPolicy) -> Option<Duration> {
    policy.retry().per_try_timeout()
}

#[test]
fn the_seeds_maintenance_window_loosens_the_timeout_from_3_to_4_in_shanghai() {
    let file = PolicyFile::from_toml(SEEDS).unwrap();
    let policy = file.endpoint("POST /callback").unwrap();
    let window = &policy.windows()[0];
    assert_eq!(
        window.schedule().to_string(),
        "03:00-04:00 Asia/Shanghai daily"
    );
    // Only the overridden fields differ; the budget and breaker are the endpoint's own.
    assert_eq!(per_try(window.policy()), Some(Duration::from_secs(2)));
    assert_eq!(
        window.policy().overall_timeout(),
        Some(Duration::from_secs(5))
    );
    assert_eq!(window.policy().budget(), policy.budget());
    assert_eq!(window.policy().breaker(), policy.breaker());
    assert_eq!(
        window.policy().retry().min_call(),
        Duration::from_millis(50)
    );

    // Shanghai is UTC+8 all year: 03:00 local is 19:00 UTC the day before.
    let before = policy.in_force_at(utc("2026-06-01T18:59:59Z"));
    assert_eq!(before.window, None);
    assert_eq!(per_try(before.policy), Some(Duration::from_millis(300)));
    assert_eq!(before.until, Some(utc("2026-06-01T19:00:00Z")));

    let during = policy.in_force_at(utc("2026-06-01T19:00:00Z"));
    assert_eq!(during.window, Some(0));
    assert_eq!(per_try(during.policy), Some(Duration::from_secs(2)));
    assert_eq!(during.until, Some(utc("2026-06-01T20:00:00Z")));

    let after = policy.in_force_at(utc("2026-06-01T20:00:00Z"));
    assert_eq!(after.window, None);
    // Every day: the next start is 23 hours later.
    assert_eq!(after.until, Some(utc("2026-06-02T19:00:00Z")));
}

#[test]
fn a_window_reads_back_equal_from_toml_and_json() {
    let file = PolicyFile::from_toml(SEEDS).unwrap();
    assert_eq!(PolicyFile::from_toml(&file.to_toml()).unwrap(), file);
    assert_eq!(PolicyFile::from_json(&file.to_json()).unwrap(), file);
    // Written back, the overrides are what differs, and only that.
    let json: serde_json::Value = serde_json::from_str(&file.to_json()).unwrap();
    assert_eq!(
        json["endpoints"]["POST /callback"]["windows"][0]["overrides"],
        serde_json::json!({ "timeouts": { "per_try": "2s", "overall": "5s" } })
    );
}

#[test]
fn a_window_past_midnight_ends_the_next_day() {
    let policy = EndpointPolicy::new(RetryPolicy::new(3)).with_window(
        Schedule::daily("23:30", "00:30", "UTC").unwrap(),
        EndpointPolicy::new(RetryPolicy::new(1)),
    );
    policy.validate().unwrap();
    assert_eq!(policy.in_force_at(utc("2026-01-01T23:29:59Z")).window, None);
    let late = policy.in_force_at(utc("2026-01-01T23:45:00Z"));
    assert_eq!(late.window, Some(0));
    assert_eq!(late.until, Some(utc("2026-01-02T00:30:00Z")));
    assert_eq!(
        policy.in_force_at(utc("2026-01-02T00:15:00Z")).window,
        Some(0)
    );
    assert_eq!(policy.in_force_at(utc("2026-01-02T00:30:00Z")).window, None);
}

fn new_york(start: &str, end: &str) -> Schedule {
    Schedule::daily(start, end, "America/New_York").unwrap()
}

#[test]
fn spring_forward_an_edge_in_the_skipped_hour_falls_on_the_jump() {
    // 2026-03-08: New York's clocks jump from 02:00 EST (07:00 UTC) to 03:00 EDT.
    let window = new_york("02:30", "04:00");
    assert!(!window.is_active(utc("2026-03-08T06:59:59Z")));
    assert_eq!(
        window.next_edge(utc("2026-03-08T05:00:00Z")),
        Some(utc("2026-03-08T07:00:00Z")),
        "02:30 does not exist that day: the window starts when the clock jumps past it"
    );
    assert!(window.is_active(utc("2026-03-08T07:00:00Z")));
    // 04:00 EDT is 08:00 UTC: one hour of real time.
    assert_eq!(
        window.next_edge(utc("2026-03-08T07:00:00Z")),
        Some(utc("2026-03-08T08:00:00Z"))
    );
    assert!(!window.is_active(utc("2026-03-08T08:00:00Z")));
    // The day before and after, it runs its full 90 minutes (EST, then EDT).
    assert!(window.is_active(utc("2026-03-07T07:30:00Z")));
    assert!(window.is_active(utc("2026-03-09T06:30:00Z")));
}

#[test]
fn spring_forward_a_window_inside_the_skipped_hour_does_not_run_that_day() {
    let window = new_york("02:00", "03:00");
    for minute in ["06:30", "07:00", "07:30"] {
        assert!(!window.is_active(utc(&format!("2026-03-08T{minute}:00Z"))));
    }
    // From before the gap, the next edge is the next day's 02:00 EDT (06:00 UTC).
    assert_eq!(
        window.next_edge(utc("2026-03-08T05:00:00Z")),
        Some(utc("2026-03-09T06:00:00Z"))
    );
}

#[test]
fn fall_back_a_repeated_time_is_an_edge_at_its_first_occurrence() {
    // 2026-11-01: New York's 01:00-02:00 happens twice, first EDT (05:00-06:00 UTC), then
    // EST (06:00-07:00 UTC).
    let inside = new_york("01:00", "01:30");
    assert!(inside.is_active(utc("2026-11-01T05:00:00Z")));
    assert_eq!(
        inside.next_edge(utc("2026-11-01T05:00:00Z")),
        Some(utc("2026-11-01T05:30:00Z"))
    );
    // When the hour repeats, the window does not run again.
    assert!(!inside.is_active(utc("2026-11-01T06:15:00Z")));
    assert_eq!(
        inside.next_edge(utc("2026-11-01T05:30:00Z")),
        Some(utc("2026-11-02T06:00:00Z")),
        "the next start is the next day's 01:00 EST"
    );

    // A window across the repeated hour runs from the first 01:30 to 02:30 EST: two hours.
    let across = new_york("01:30", "02:30");
    assert_eq!(
        across.next_edge(utc("2026-11-01T04:00:00Z")),
        Some(utc("2026-11-01T05:30:00Z"))
    );
    for at in ["05:30", "06:00", "06:15", "07:29"] {
        assert!(
            across.is_active(utc(&format!("2026-11-01T{at}:00Z"))),
            "{at}"
        );
    }
    assert_eq!(
        across.next_edge(utc("2026-11-01T06:00:00Z")),
        Some(utc("2026-11-01T07:30:00Z"))
    );
    assert!(!across.is_active(utc("2026-11-01T07:30:00Z")));
}

#[test]
fn europe_berlin_changes_its_clocks_on_other_days_and_the_same_rules_hold() {
    // 2026-03-29: 02:00 CET (01:00 UTC) jumps to 03:00 CEST. 2026-10-25: 03:00 CEST (01:00
    // UTC) falls back to 02:00 CET.
    let window = Schedule::daily("02:15", "02:45", "Europe/Berlin").unwrap();
    assert!(!window.is_active(utc("2026-03-29T01:20:00Z")));
    assert_eq!(
        window.next_edge(utc("2026-03-29T00:00:00Z")),
        Some(utc("2026-03-30T00:15:00Z")),
        "inside the skipped hour: no window that day"
    );
    assert!(
        window.is_active(utc("2026-10-25T00:15:00Z")),
        "the first 02:15 (CEST)"
    );
    assert!(
        !window.is_active(utc("2026-10-25T01:15:00Z")),
        "not the second (CET)"
    );
    // The same wall-clock window is an hour later in UTC after the change.
    assert!(window.is_active(utc("2026-10-26T01:15:00Z")));
}

#[test]
fn windows_that_do_not_overlap_on_the_clock_do_not_overlap_on_the_fall_back_day() {
    let policy = EndpointPolicy::new(RetryPolicy::new(3))
        .with_window(
            new_york("00:30", "01:30"),
            EndpointPolicy::new(RetryPolicy::new(2)),
        )
        .with_window(
            new_york("01:30", "02:30"),
            EndpointPolicy::new(RetryPolicy::new(1)),
        );
    policy.validate().unwrap();
    let mut at = utc("2026-11-01T04:00:00Z");
    let end = utc("2026-11-01T08:00:00Z");
    let mut seen = Vec::new();
    while at < end {
        let in_force = policy.in_force_at(at);
        let active: Vec<usize> = policy
            .windows()
            .iter()
            .enumerate()
            .filter(|(_, w)| w.schedule().is_active(at))
            .map(|(i, _)| i)
            .collect();
        assert!(active.len() <= 1, "{at:?}: {active:?}");
        seen.push(in_force.window);
        at += Duration::from_secs(300);
    }
    assert!(seen.contains(&Some(0)) && seen.contains(&Some(1)));
}

fn toml_error(text: &str) -> (String, String) {
    match PolicyFile::from_toml(text) {
        Err(PolicyError::Invalid { field, rule, .. }) => (field, rule),
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

fn with_window(window: &str) -> String {
    format!(
        "[endpoints.\"POST /callback\"]\ntimeouts = {{ per_try = \"300ms\", overall = \"1s\" }}\n\n[[endpoints.\"POST /callback\".windows]]\n{window}\n"
    )
}

#[test]
fn every_bad_window_is_refused_with_its_field_named() {
    let at = r#"endpoints."POST /callback".windows[0]"#;
    let cases = [
        (
            "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"Asia/Shangai\"\noverrides = { retry = { max_attempts = 1 } }",
            format!("{at}.time_zone"),
            "IANA",
        ),
        (
            "start = \"3:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = { retry = { max_attempts = 1 } }",
            format!("{at}.start"),
            "HH:MM",
        ),
        (
            "start = \"03:00\"\nend = \"24:00\"\ntime_zone = \"UTC\"\noverrides = { retry = { max_attempts = 1 } }",
            format!("{at}.end"),
            "time of day",
        ),
        (
            "start = \"03:00\"\nend = \"03:00\"\ntime_zone = \"UTC\"\noverrides = { retry = { max_attempts = 1 } }",
            format!("{at}.end"),
            "empty",
        ),
        (
            "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = { timeouts = { overal = \"5s\" } }",
            format!("{at}.overrides.timeouts.overal"),
            "unknown field",
        ),
        (
            "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = { retries = 2 }",
            format!("{at}.overrides.retries"),
            "unknown field",
        ),
        (
            "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = { timeouts = { overall = \"2h\" } }",
            format!("{at}.overrides.timeouts.overall"),
            "1 h maximum",
        ),
        (
            "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = { timeouts = { per_try = \"2s\" } }",
            format!("{at}.overrides.timeouts.per_try"),
            "longer than the overall timeout",
        ),
        (
            "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = { retry = { max_attempts = 50 } }",
            format!("{at}.overrides.retry.max_attempts"),
            "at most 10",
        ),
        (
            "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = { timeouts = { per_try = \"fast\" } }",
            format!("{at}.overrides.timeouts.per_try"),
            "fast",
        ),
        (
            "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = { windows = [] }",
            format!("{at}.overrides.windows"),
            "no windows",
        ),
        (
            "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = {}",
            format!("{at}.overrides"),
            "changes nothing",
        ),
        (
            "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\nrepeat = \"weekly\"\noverrides = { retry = { max_attempts = 1 } }",
            "endpoints.\"POST /callback\".windows[0].repeat".to_owned(),
            "unknown field",
        ),
    ];
    for (window, field, rule) in cases {
        let text = with_window(window);
        let result = PolicyFile::from_toml(&text);
        let error = result.expect_err(window);
        let message = error.to_string();
        assert!(message.contains(&field), "{window}\n  gave: {message}");
        assert!(message.contains(rule), "{window}\n  gave: {message}");
    }
}

#[test]
fn overlapping_windows_and_windows_in_two_time_zones_are_refused() {
    let two = |second_start: &str, second_end: &str, second_zone: &str| {
        format!(
            "[endpoints.x]\nretry = {{ max_attempts = 3 }}\n\
             [[endpoints.x.windows]]\nstart = \"23:00\"\nend = \"01:00\"\ntime_zone = \"UTC\"\noverrides = {{ retry = {{ max_attempts = 1 }} }}\n\
             [[endpoints.x.windows]]\nstart = \"{second_start}\"\nend = \"{second_end}\"\ntime_zone = \"{second_zone}\"\noverrides = {{ retry = {{ max_attempts = 2 }} }}\n"
        )
    };
    let (field, rule) = toml_error(&two("00:30", "02:00", "UTC"));
    assert_eq!(field, r#"endpoints."x".windows[1]"#);
    assert!(rule.contains("overlaps windows[0]"), "{rule}");
    let (field, rule) = toml_error(&two("01:00", "02:00", "Asia/Tokyo"));
    assert_eq!(field, r#"endpoints."x".windows[1].time_zone"#);
    assert!(rule.contains("one time zone"), "{rule}");
    // Back to back is not an overlap.
    PolicyFile::from_toml(&two("01:00", "02:00", "UTC")).unwrap();
}

#[test]
fn a_bad_window_in_json_is_named_the_same_way() {
    let text = r#"{"endpoints": {"x": {"windows": [
        {"start": "03:00", "end": "04:00", "time_zone": "UTC", "overrides": {"timeouts": {"per_try": "0s"}}}
    ]}}}"#;
    let error = PolicyFile::from_json(text).unwrap_err();
    let PolicyError::Invalid { field, at, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(
        field,
        r#"endpoints."x".windows[0].overrides.timeouts.per_try"#
    );
    // Placed at the override that broke the rule: line 2, the `"per_try"` value.
    let at = at.as_ref().expect("located in the text");
    assert_eq!(at.line, 2, "{error}");
    assert_eq!(at.column, 102, "{error}");
    // The same in TOML: the line of the window's `overrides`.
    let (field, _) = toml_error(&with_window(
        "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = { timeouts = { per_try = \"0s\" } }",
    ));
    assert!(
        field.ends_with("windows[0].overrides.timeouts.per_try"),
        "{field}"
    );
    let Err(PolicyError::Invalid { at: Some(at), .. }) = PolicyFile::from_toml(&with_window(
        "start = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = { timeouts = { per_try = \"0s\" } }",
    )) else {
        panic!("not located");
    };
    assert_eq!(at.line, 8);
}

#[test]
fn a_window_built_in_code_is_checked_by_the_same_rules() {
    let base =
        EndpointPolicy::new(RetryPolicy::new(3)).with_overall_timeout(Duration::from_secs(1));
    let utc_3_to_4 = || Schedule::daily("03:00", "04:00", "UTC").unwrap();
    // Removes the overall timeout: no override can say that.
    let error = base
        .clone()
        .with_window(utc_3_to_4(), EndpointPolicy::new(RetryPolicy::new(1)))
        .validate()
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("windows[0].overrides: a window changes fields"),
        "{error}"
    );
    // Changes nothing.
    let error = base
        .clone()
        .with_window(utc_3_to_4(), base.clone())
        .validate()
        .unwrap_err();
    assert!(error.to_string().contains("changes nothing"), "{error}");
    // Breaks a rule of its own: named under the window.
    let error = base
        .clone()
        .with_window(utc_3_to_4(), base.clone().with_retry(RetryPolicy::new(0)))
        .validate()
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("windows[0].overrides.retry.max_attempts"),
        "{error}"
    );
    // Too many windows.
    let mut many = base.clone();
    for hour in 0..=limits::MAX_WINDOWS {
        let start = format!("{:02}:00", hour % 24);
        let end = format!("{:02}:30", hour % 24);
        many = many.with_window(
            Schedule::daily(&start, &end, "UTC").unwrap(),
            base.clone().with_retry(RetryPolicy::new(1)),
        );
    }
    let error = many.validate().unwrap_err();
    assert!(error.to_string().contains("at most 24 windows"), "{error}");
}

#[test]
fn a_window_can_change_the_budget_kind_whole() {
    let text = r#"
        [endpoints.x]
        budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
        [[endpoints.x.windows]]
        start = "03:00"
        end = "04:00"
        time_zone = "UTC"
        overrides = { budget = { kind = "ratio", retry_ratio = 0.5, ttl = "10s" } }
    "#;
    let file = PolicyFile::from_toml(text).unwrap();
    let window = &file.endpoint("x").unwrap().windows()[0];
    assert!(matches!(
        window.policy().budget(),
        Some(BudgetSpec::Ratio { .. })
    ));
    assert_eq!(PolicyFile::from_json(&file.to_json()).unwrap(), file);
}
