use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::clock::Clock;
use crate::deadline::DeadlineHeader;

const GOOD: &str = r#"
    [endpoints."POST /pay"]
    idempotency = "key"
    timeouts = { connect = "100ms", per_try = "300ms", overall = "1s" }
    retry = { max_attempts = 3, min_call = "50ms" }
    backoff = { kind = "exponential", base = "100ms", cap = "2s", jitter = "full" }
    budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
    breaker = { count = 20, failure_ratio = 0.5, minimum_throughput = 10, open = "5s" }
    throttle = { k = 2.0 }
    deadline = { reserve = 0.1, reserve_fixed = "5ms", headers = ["grpc-timeout", "x-request-deadline"] }
    fallback = "never"

    [endpoints."GET /users"]
    idempotency = "idempotent"
    budget = { kind = "ratio", retry_ratio = 0.2, ttl = "10s", min_retries_per_sec = 10 }

    [endpoints."GET /search"]
    idempotency = "idempotent"
    hedge = { max_attempts = 3, percentile = 0.95, fallback = "50ms" }
"#;

fn invalid(text: &str) -> (String, String) {
    match PolicyFile::from_toml(text) {
        Err(PolicyError::Invalid { field, rule, .. }) => (field, rule),
        other => panic!("expected a rule error, got {other:?}"),
    }
}

fn syntax(text: &str) -> String {
    match PolicyFile::from_toml(text) {
        Err(PolicyError::Syntax { field, message, .. }) => format!("{field}: {message}"),
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn a_good_file_becomes_ready_policies() {
    let file = PolicyFile::from_toml(GOOD).expect("valid");
    let pay = file.endpoint("POST /pay").expect("present");
    assert_eq!(pay.retry().max_attempts(), 3);
    assert_eq!(
        pay.retry().per_try_timeout(),
        Some(Duration::from_millis(300))
    );
    assert_eq!(pay.retry().min_call(), Duration::from_millis(50));
    assert!(!pay.retry().idempotent());
    assert_eq!(pay.backoff().cap(), Duration::from_secs(2));
    assert_eq!(pay.overall_timeout(), Some(Duration::from_secs(1)));
    let breaker = pay.breaker().expect("breaker");
    assert_eq!(breaker.minimum_throughput(), 10);
    assert_eq!(breaker.open_duration(), Duration::from_secs(5));
    assert_eq!(pay.throttle().map(|t| t.k()), Some(2.0));
    let propagation = pay.propagation();
    assert_eq!(
        propagation.reserve.kept_from(Duration::from_millis(1000)),
        Duration::from_millis(105)
    );
    assert!(
        propagation
            .headers
            .0
            .contains(DeadlineHeader::RequestDeadline)
    );
    assert_eq!(pay.fallback(), Fallback::Never);

    let users = file.endpoint("GET /users").expect("present");
    assert!(users.retry().idempotent());
    assert!(users.budget().is_some());
    assert_eq!(users.fallback(), Fallback::OnGiveUp);

    let search = file.endpoint("GET /search").expect("present");
    assert_eq!(search.retry().max_attempts(), 1);
    assert_eq!(
        search.hedge(),
        Some(&HedgeSpec {
            max_attempts: 3,
            delay: HedgeDelaySpec::Percentile {
                percentile: 0.95,
                fallback: Duration::from_millis(50)
            }
        })
    );
}

#[test]
fn toml_and_json_round_trip() {
    let file = PolicyFile::from_toml(GOOD).expect("valid");
    assert_eq!(PolicyFile::from_toml(&file.to_toml()), Ok(file.clone()));
    assert_eq!(PolicyFile::from_json(&file.to_json()), Ok(file));
}

#[test]
fn each_broken_rule_names_its_field() {
    let cases = [
        (
            "retry = { max_attempts = 0 }",
            "retry.max_attempts",
            "at least 1",
        ),
        (
            r#"backoff = { base = "2s", cap = "1s" }"#,
            "backoff.cap",
            "below the base",
        ),
        (
            "backoff = { multiplier = nan }",
            "backoff.multiplier",
            "finite",
        ),
        (
            r#"budget = { kind = "grpc", max_tokens = 0, token_ratio = 0.1 }"#,
            "budget.max_tokens",
            "1..=1000",
        ),
        (
            r#"budget = { kind = "grpc", max_tokens = 1001, token_ratio = 0.1 }"#,
            "budget.max_tokens",
            "1..=1000",
        ),
        (
            r#"budget = { kind = "grpc", max_tokens = 10, token_ratio = 1.5 }"#,
            "budget.token_ratio",
            "0.001..=1",
        ),
        (
            r#"budget = { kind = "spend_per_retry", max_tokens = 10, token_ratio = nan }"#,
            "budget.token_ratio",
            "finite",
        ),
        (
            r#"budget = { kind = "ratio", retry_ratio = -0.1, ttl = "10s" }"#,
            "budget.retry_ratio",
            "0..=1",
        ),
        (
            r#"budget = { kind = "ratio", retry_ratio = 0.2, ttl = "500ms" }"#,
            "budget.ttl",
            "between 1 s and 60 s",
        ),
        (
            r#"budget = { kind = "concurrency", budget_percent = 120.0 }"#,
            "budget.budget_percent",
            "0..=100",
        ),
        (
            r#"timeouts = { per_try = "2s", overall = "1s" }"#,
            "timeouts.per_try",
            "longer than the overall",
        ),
        (
            r#"timeouts = { overall = "0s" }"#,
            "timeouts.overall",
            "above zero",
        ),
        (
            r#"hedge = { max_attempts = 9, delay = "10ms" }"#,
            "hedge.max_attempts",
            "2..=5",
        ),
        (
            r#"hedge = { max_attempts = 2, percentile = 1.5, fallback = "10ms" }"#,
            "hedge.percentile",
            "between 0 and 1",
        ),
        (
            r#"hedge = { max_attempts = 2, percentile = 0.9 }"#,
            "hedge.fallback",
            "fallback",
        ),
        ("hedge = { max_attempts = 2 }", "hedge.delay", "either"),
        (
            "retry = { max_attempts = 3 }\nhedge = { max_attempts = 2, delay = \"5ms\" }",
            "retry.max_attempts",
            "either retries or hedges",
        ),
        (
            "breaker = { failure_ratio = 0.5 }",
            "breaker",
            "exactly one window",
        ),
        (
            "breaker = { count = 10, failure_ratio = 2.0 }",
            "breaker.failure_ratio",
            "0..=1",
        ),
        (
            "breaker = { count = 10, minimum_throughput = 11 }",
            "breaker.minimum_throughput",
            "never be reached",
        ),
        (
            r#"breaker = { count = 10, open = "0s" }"#,
            "breaker.open",
            "zero",
        ),
        ("throttle = { k = 0.5 }", "throttle.k", ">= 1"),
        (
            "deadline = { reserve = 1.5 }",
            "deadline.reserve",
            "between 0.0 and 1.0",
        ),
        (
            "deadline = { reserve = 1.0 }",
            "deadline.reserve",
            "keeps all",
        ),
        (
            r#"deadline = { headers = ["x-timeout"] }"#,
            "deadline.headers",
            "not a deadline header",
        ),
        ("deadline = { headers = [] }", "deadline.headers", "empty"),
    ];
    for (body, field, rule) in cases {
        let (got_field, got_rule) = invalid(&format!("[endpoints.x]\n{body}\n"));
        assert_eq!(got_field, format!("endpoints.\"x\".{field}"), "{body}");
        assert!(got_rule.contains(rule), "{body}: {got_rule}");
    }
}

#[test]
fn malformed_values_are_syntax_errors_that_name_the_key() {
    let message = syntax("[endpoints.x]\nretry = { min_call = \"-5ms\" }\n");
    assert!(message.contains("min_call"), "{message}");
    let message = syntax("[endpoints.x]\nbackoff = { base = \"10 parsecs\" }\n");
    assert!(message.contains("base"), "{message}");
    let message = syntax("[endpoints.x]\nretry = { max_attempt = 3 }\n");
    assert!(message.contains("max_attempt"), "{message}");
    let message = syntax("[endpoints.x]\nbudget = { kind = \"leaky\" }\n");
    assert!(message.contains("leaky"), "{message}");
}

#[test]
fn a_policy_built_in_code_is_checked_by_the_same_rules() {
    let err = EndpointPolicy::new(
        crate::retry::RetryPolicy::new(3).with_per_try_timeout(Duration::from_secs(2)),
    )
    .with_overall_timeout(Duration::from_secs(1))
    .validate()
    .expect_err("per-try above overall");
    assert_eq!(
        err,
        PolicyError::Invalid {
            field: "timeouts.per_try".to_owned(),
            rule: "2s is longer than the overall timeout 1s".to_owned(),
            at: None,
        }
    );
    let single: EndpointPolicy =
        toml::from_str("retry = { max_attempts = 2 }").expect("one endpoint parses alone");
    assert_eq!(single.retry().max_attempts(), 2);
    assert!(toml::from_str::<EndpointPolicy>("retry = { max_attempts = 0 }").is_err());
}

#[test]
fn budgets_build_from_their_spec() {
    let budget = BudgetSpec::Grpc {
        max_tokens: 10,
        token_ratio: 0.1,
    }
    .build(Clock::system())
    .expect("valid");
    for _ in 0..5 {
        budget.record_failure();
    }
    assert!(budget.withdraw(crate::budget::Withdrawal::Retry).is_err());
    assert!(
        BudgetSpec::Concurrency {
            budget_percent: f64::NAN,
            min_retry_concurrency: 3
        }
        .build(Clock::system())
        .is_err()
    );
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
        let _ = PolicyFile::from_toml(&text);
        let _ = PolicyFile::from_json(&text);
    }

    #[test]
    fn arbitrary_values_are_accepted_or_named(
        max_attempts in any::<u32>(),
        max_tokens in any::<u32>(),
        token_ratio in prop_oneof![any::<f64>(), 0.0f64..2.0],
        base_ms in any::<u32>(),
        cap_ms in any::<u32>(),
        multiplier in prop_oneof![any::<f64>().prop_filter("toml has no NaN payloads", |m| !m.is_nan()), 0.5f64..4.0],
    ) {
        let text = format!(
            "[endpoints.e]\nretry = {{ max_attempts = {max_attempts} }}\n\
             backoff = {{ base = \"{base_ms}ms\", cap = \"{cap_ms}ms\", multiplier = {multiplier:?} }}\n\
             budget = {{ kind = \"grpc\", max_tokens = {max_tokens}, token_ratio = {token_ratio:?} }}\n",
        );
        match PolicyFile::from_toml(&text) {
            Ok(file) => {
                let budget = file.endpoint("e").and_then(|e| e.budget().copied()).expect("configured");
                prop_assert!(budget.build(Clock::system()).is_ok());
                prop_assert_eq!(PolicyFile::from_toml(&file.to_toml()), Ok(file));
            }
            Err(PolicyError::Invalid { field, .. }) => {
                prop_assert!(field.starts_with("endpoints.\"e\"."), "{}", field);
            }
            Err(e @ PolicyError::Read { .. }) => prop_assert!(false, "{}", e),
            Err(PolicyError::Syntax { message, .. }) => {
                // Only what TOML itself cannot hold (an infinite float is `inf`) may fail here.
                prop_assert!(!token_ratio.is_finite() || !multiplier.is_finite(), "{}", message);
            }
        }
    }
}

#[test]
fn a_held_breaker_is_read_written_back_only_when_held_and_needs_a_breaker() {
    let held = PolicyFile::from_toml(
        "[endpoints.\"GET /img/*\"]\nbreaker = { count = 20, isolated = true }\n",
    )
    .expect("valid");
    let policy = held.endpoint("GET /img/*").expect("endpoint");
    assert!(policy.breaker_isolated());
    assert!(
        held.to_toml().contains("isolated = true"),
        "{}",
        held.to_toml()
    );
    assert_eq!(PolicyFile::from_toml(&held.to_toml()), Ok(held.clone()));
    assert_eq!(PolicyFile::from_json(&held.to_json()), Ok(held.clone()));

    let free = PolicyFile::from_toml("[endpoints.\"GET /img/*\"]\nbreaker = { count = 20 }\n")
        .expect("valid");
    assert!(
        !free
            .endpoint("GET /img/*")
            .expect("endpoint")
            .breaker_isolated()
    );
    assert!(
        !free.to_toml().contains("isolated"),
        "written only when held"
    );
    assert_ne!(free, held);

    let in_code = EndpointPolicy::new(RetryPolicy::new(1)).with_breaker_isolated(true);
    match in_code.validate() {
        Err(PolicyError::Invalid { field, rule, .. }) => {
            assert_eq!(field, "breaker.isolated");
            assert!(rule.contains("no breaker"), "{rule}");
        }
        other => panic!("expected the missing breaker named, got {other:?}"),
    }
}
