//! Properties of the policy parsers: a valid policy written as TOML or JSON reads back equal;
//! any bytes, and any damage to a good file, give a policy or a bounded error, never a panic.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::backoff::{Backoff, Jitter};
use crate::health::HealthConfig;

fn ms(range: std::ops::Range<u64>) -> impl Strategy<Value = Duration> {
    range.prop_map(Duration::from_millis)
}

fn backoff() -> impl Strategy<Value = Backoff> {
    (0u8..5, ms(0..1000), ms(1000..60_000), 0u8..3, 1.0f64..10.0).prop_map(
        |(kind, base, cap, jitter, multiplier)| {
            let jitter = [Jitter::None, Jitter::Full, Jitter::Equal][usize::from(jitter)];
            match kind {
                0 => Backoff::fixed(base).with_jitter(jitter),
                1 => Backoff::linear(base).with_jitter(jitter),
                2 => Backoff::fixed(base)
                    .with_growth(crate::backoff::Growth::Exponential { multiplier })
                    .with_jitter(jitter),
                3 => Backoff::envoy(base, cap).with_jitter(jitter),
                _ => Backoff::decorrelated(base, cap),
            }
            .with_cap(cap)
        },
    )
}

fn budget() -> impl Strategy<Value = Option<BudgetSpec>> {
    prop_oneof![
        Just(None),
        Just(Some(BudgetSpec::AwsStandard)),
        (1u32..=1000, 1u32..=1000).prop_map(|(max_tokens, milli)| Some(BudgetSpec::Grpc {
            max_tokens,
            token_ratio: f64::from(milli) / 1000.0
        })),
        (0u32..=100, 1u64..=60, 0u32..=1000).prop_map(|(pct, ttl, min)| Some(BudgetSpec::Ratio {
            retry_ratio: f64::from(pct) / 100.0,
            ttl: Duration::from_secs(ttl),
            min_retries_per_sec: min,
        })),
        (0u32..=100, 0u32..=1000).prop_map(|(pct, min)| Some(BudgetSpec::Concurrency {
            budget_percent: f64::from(pct),
            min_retry_concurrency: min,
        })),
    ]
}

fn breaker() -> impl Strategy<Value = Option<crate::breaker::BreakerConfig>> {
    prop_oneof![
        Just(None),
        (1u32..500, 0u32..=100, ms(1..60_000), 0u32..=10).prop_map(
            |(calls, ratio, open, probes)| Some(
                crate::breaker::BreakerConfig::new(HealthConfig::count(calls))
                    .with_minimum_throughput(calls.div_ceil(2))
                    .with_failure_ratio(f64::from(ratio) / 100.0)
                    .with_open_duration(open)
                    .with_permitted_probes(probes.max(1))
            )
        ),
        (1u64..60, 1u32..=10).prop_map(|(secs, buckets)| Some(crate::breaker::BreakerConfig::new(
            HealthConfig::time(Duration::from_secs(secs), buckets)
        ))),
    ]
}

fn endpoint() -> impl Strategy<Value = EndpointPolicy> {
    (
        (1u32..=10, backoff(), any::<bool>(), ms(0..100)),
        (
            proptest::option::of(ms(1..2000)),
            proptest::option::of(ms(2000..10_000)),
        ),
        budget(),
        breaker(),
        proptest::option::of((1.0f64..10.0).prop_map(crate::throttle::ThrottleConfig::new)),
        prop_oneof![
            Just(Fallback::Never),
            Just(Fallback::OnGiveUp),
            Just(Fallback::Always)
        ],
        window(),
    )
        .prop_filter_map(
            "valid policies only",
            |(
                (attempts, backoff, idempotent, min_call),
                (per_try, overall),
                budget,
                breaker,
                throttle,
                fallback,
                window,
            )| {
                let mut retry = crate::retry::RetryPolicy::new(attempts)
                    .with_backoff(backoff)
                    .with_idempotent(idempotent)
                    .with_min_call(min_call);
                if let Some(per_try) = per_try {
                    retry = retry.with_per_try_timeout(per_try);
                }
                let mut policy = EndpointPolicy::new(retry).with_fallback(fallback);
                if let Some(overall) = overall {
                    policy = policy.with_overall_timeout(overall);
                }
                if let Some(budget) = budget {
                    policy = policy.with_budget(budget);
                }
                if let Some(breaker) = breaker {
                    policy = policy.with_breaker(breaker);
                }
                if let Some(throttle) = throttle {
                    policy = policy.with_throttle(throttle);
                }
                if let Some((schedule, attempts)) = window {
                    let r = policy.retry();
                    let mut during_retry = crate::retry::RetryPolicy::new(attempts)
                        .with_backoff(*r.backoff())
                        .with_min_call(r.min_call())
                        .with_idempotent(r.idempotent());
                    if let Some(per_try) = r.per_try_timeout() {
                        during_retry = during_retry.with_per_try_timeout(per_try);
                    }
                    let during = policy.clone().with_retry(during_retry);
                    policy = policy.with_window(schedule, during);
                }
                policy.validate().ok().map(|()| policy)
            },
        )
}

/// A daily window in one of a few zones (one with DST, one without, UTC), and the attempts
/// in force during it.
fn window() -> impl Strategy<Value = Option<(Schedule, u32)>> {
    proptest::option::of(
        (0u32..1440, 1u32..1440, 0usize..3, 0u32..60, 1u32..=10).prop_map(
            |(start, length, zone, second, attempts)| {
                let clock = |minutes: u32, second: u32| {
                    let (h, m) = ((minutes / 60) % 24, minutes % 60);
                    if second == 0 {
                        format!("{h:02}:{m:02}")
                    } else {
                        format!("{h:02}:{m:02}:{second:02}")
                    }
                };
                let zone = ["Asia/Shanghai", "America/New_York", "UTC"][zone];
                let schedule =
                    Schedule::daily(&clock(start, second), &clock(start + length, 0), zone)
                        .expect("a valid schedule");
                (schedule, attempts)
            },
        ),
    )
}

fn file() -> impl Strategy<Value = PolicyFile> {
    proptest::collection::btree_map("[a-zA-Z /*\"\\\\.\u{e9}]{1,24}", endpoint(), 0..4).prop_map(
        |map: BTreeMap<String, EndpointPolicy>| {
            PolicyFile::new(
                map.into_iter()
                    .filter(|(name, _)| !name.trim().is_empty())
                    .collect(),
            )
        },
    )
}

/// The most any error message may take, whatever the input: the message, a field path with
/// a cut endpoint name, a location.
const MAX_ERROR_BYTES: usize = 4 * super::error::MAX_MESSAGE;

const GOOD: &str = r#"
[endpoints."POST /pay"]
idempotency = "key"
timeouts = { connect = "100ms", per_try = "300ms", overall = "1s" }
retry = { max_attempts = 3, min_call = "50ms" }
backoff = { kind = "exponential", base = "100ms", cap = "2s", jitter = "full" }
budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
breaker = { count = 20, failure_ratio = 0.5, minimum_throughput = 10, open = "5s" }

[[endpoints."POST /pay".windows]]
start = "03:00"
end = "04:00"
time_zone = "Asia/Shanghai"
overrides = { timeouts = { per_try = "900ms", overall = "3s" }, budget = { kind = "aws_standard" } }
"#;

#[test]
fn the_good_file_that_the_damage_starts_from_is_good() {
    let file = PolicyFile::from_toml(GOOD).expect("the good file");
    assert_eq!(
        file.endpoint("POST /pay").expect("present").windows().len(),
        1
    );
}

proptest! {
    #[test]
    fn a_valid_policy_reads_back_equal_from_toml_and_json(file in file()) {
        prop_assert_eq!(PolicyFile::from_toml(&file.to_toml()), Ok(file.clone()));
        prop_assert_eq!(PolicyFile::from_json(&file.to_json()), Ok(file));
    }

    #[test]
    fn any_bytes_give_a_policy_or_a_bounded_error(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let text = String::from_utf8_lossy(&bytes);
        for result in [PolicyFile::from_toml(&text), PolicyFile::from_json(&text)] {
            if let Err(error) = result {
                prop_assert!(error.to_string().len() <= MAX_ERROR_BYTES);
            }
        }
    }

    #[test]
    fn a_damaged_good_file_gives_a_policy_or_a_bounded_error(
        at in 0usize..GOOD.len(),
        cut in 0usize..40,
        junk in "[\\PC\"{}\\[\\]=,.0-9a-z_ ]{0,40}",
    ) {
        let valid_json = PolicyFile::from_toml(GOOD).map(|f| f.to_json()).unwrap_or_default();
        for (text, parse) in [
            (GOOD.to_owned(), PolicyFile::from_toml as fn(&str) -> _),
            (valid_json, PolicyFile::from_json),
        ] {
            let mut text = text;
            let start = (0..=at.min(text.len())).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
            let end = (start + cut).min(text.len());
            let end = (end..=text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
            text.replace_range(start..end, &junk);
            if let Err(error) = parse(&text) {
                prop_assert!(error.to_string().len() <= MAX_ERROR_BYTES);
            }
        }
    }
}
