#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::*;
use crate::lint::{LintConfig, Rule, lint_graph};

const REVIEW: &str = r#"
[services.web]
retry_signal = true

[[services.web.endpoints."GET /checkout".calls]]
to = "pay"
endpoint = "POST /pay"
idempotency_key = true
policy = { timeouts = { overall = "2s" }, retry = { max_attempts = 2 } }

[services.pay.endpoints."POST /pay"]
latency = { p50 = "300ms", p99 = "1.8s", p999 = "2.5s" }
failure_rate = 0.002
"#;

#[test]
fn a_graph_reads_its_services_calls_and_latency() {
    let graph = CallGraph::from_toml(REVIEW).unwrap();
    let web = graph.service("web").unwrap();
    assert!(web.retry_signal);
    let call = &web.endpoints["GET /checkout"].calls[0];
    assert_eq!(call.policy.overall_timeout(), Some(Duration::from_secs(2)));
    assert_eq!(call.origin, PolicyOrigin::Inline);
    assert_eq!(call.retry_on, DEFAULT_RETRY_ON);
    assert_eq!(
        call.field,
        r#"services."web".endpoints."GET /checkout".calls[0]"#
    );
    let pay = graph.callee(call).unwrap();
    assert!(!pay.idempotent, "POST is not idempotent by its name");
    assert_eq!(pay.latency.p99, Some(Duration::from_millis(1800)));
    assert_eq!(
        graph.topological_order(),
        [("web", "GET /checkout"), ("pay", "POST /pay")]
    );
}

#[test]
fn json_graphs_have_the_same_shape() {
    let json = r#"{"services": {
        "a": {"endpoints": {"GET /": {"calls": [{"to": "b", "endpoint": "GET /x",
              "policy": {"retry": {"max_attempts": 3}}}]}}},
        "b": {"endpoints": {"GET /x": {"latency": {"p99": "10ms"}}}}}}"#;
    let graph = CallGraph::from_json(json).unwrap();
    assert_eq!(
        graph.calls_of(("a", "GET /"))[0]
            .policy
            .retry()
            .max_attempts(),
        3
    );
}

/// A chain of `calls` calls: s0 -> s1 -> ... , each trying twice within a budget, every
/// service with the don't-retry signal (so the only finding is the chain's amplification).
fn deep_chain(calls: usize) -> String {
    let mut text = String::new();
    for i in 0..calls {
        text += &format!(
            "[services.s{i}]\nretry_signal = true\n[[services.s{i}.endpoints.\"GET /\".calls]]\nto = \"s{}\"\nendpoint = \"GET /\"\npolicy = {{ retry = {{ max_attempts = 2 }}, budget = {{ kind = \"ratio\", retry_ratio = 0.1, ttl = \"10s\" }} }}\n",
            i + 1
        );
    }
    text += &format!("[services.s{calls}.endpoints.\"GET /\"]\n");
    text
}

#[test]
fn a_10000_call_chain_loads_and_lints_without_recursion_and_a_deeper_one_is_refused() {
    let graph = CallGraph::from_toml(&deep_chain(MAX_DEPTH)).unwrap();
    assert_eq!(graph.topological_order().len(), MAX_DEPTH + 1);
    let findings = lint_graph(&graph, &LintConfig::default());
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let amp = &findings[0];
    assert_eq!(amp.rule, Rule::Amplification);
    // 2^10000 overflows a float: the message says so rather than printing a wrong number;
    // with the signal only the last layer retries, within its budget.
    assert!(
        amp.message.contains("infx") && amp.message.contains("1.10x"),
        "{}",
        amp.message
    );
    assert!(
        amp.message.contains("s0 -> s1 -> s2 -> ... (9995 more)"),
        "{}",
        amp.message
    );

    let err = CallGraph::from_toml(&deep_chain(MAX_DEPTH + 1)).unwrap_err();
    assert!(
        matches!(&err, GraphError::TooDeep { depth, limit, field, .. }
            if *depth == MAX_DEPTH + 1 && *limit == MAX_DEPTH && field.starts_with("services.\"s10000\"")),
        "{err}"
    );
}

#[test]
fn a_30_layer_diamond_is_walked_once_per_endpoint_not_once_per_path() {
    // Layer i has two services a_i and b_i, each calling both of layer i + 1: 2^30 paths.
    let mut text = String::new();
    for layer in 0..30 {
        for side in ["a", "b"] {
            for next in ["a", "b"] {
                text += &format!(
                    "[[services.{side}{layer}.endpoints.\"GET /\".calls]]\nto = \"{next}{}\"\nendpoint = \"GET /\"\npolicy = {{ retry = {{ max_attempts = 2 }}, budget = {{ kind = \"ratio\", retry_ratio = 0.1, ttl = \"10s\" }} }}\n",
                    layer + 1
                );
            }
        }
    }
    text += "[services.a30.endpoints.\"GET /\"]\n[services.b30.endpoints.\"GET /\"]\n";
    // A walk of every path would not end (2^30 of them); one per endpoint ends at once.
    let graph = CallGraph::from_toml(&text).unwrap();
    let findings = lint_graph(&graph, &LintConfig::default());
    let amp: Vec<_> = findings
        .iter()
        .filter(|f| f.rule == Rule::Amplification)
        .collect();
    // The four calls into the last layer, each the end of paths of 2^30 attempts, but at
    // most 1.1^30 = 17.4x with the budgets.
    assert_eq!(amp.len(), 4, "{amp:#?}");
    assert!(amp[0].message.contains("1073741824x"), "{}", amp[0].message);
    assert!(amp[0].message.contains("17.45x"), "{}", amp[0].message);
}

#[test]
fn a_histogram_gives_the_percentiles() {
    let graph = CallGraph::from_toml(
        r#"[services.a.endpoints."GET /"]
        latency = { histogram = [{ le = "10ms", count = 900 }, { le = "100ms", count = 99 }, { le = "1s", count = 1 }] }"#,
    )
    .unwrap();
    let latency = graph.service("a").unwrap().endpoints["GET /"].latency;
    assert_eq!(latency.p50, Some(Duration::from_millis(10)));
    assert_eq!(latency.p99, Some(Duration::from_millis(100)));
    assert_eq!(latency.p999, Some(Duration::from_millis(100)));
}

#[test]
fn falling_percentiles_are_refused_by_name() {
    let err = CallGraph::from_toml(
        r#"[services.a.endpoints."GET /"]
        latency = { p50 = "100ms", p90 = "120ms", p99 = "10ms" }"#,
    )
    .unwrap_err();
    let GraphError::Invalid { field, rule, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(field, r#"services."a".endpoints."GET /".latency.p99"#);
    assert!(rule.contains("below p90 (120ms)"), "{rule}");
    // Equal percentiles (a flat tail) are a latency.
    CallGraph::from_toml(
        r#"[services.a.endpoints."GET /"]
        latency = { p50 = "5ms", p99 = "5ms", p999 = "9ms" }"#,
    )
    .unwrap();
}

#[test]
fn errors_name_the_line_and_field() {
    let err = CallGraph::from_toml(&REVIEW.replace("to = \"pay\"", "to = \"nope\"")).unwrap_err();
    let GraphError::Invalid { at, field, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(
        field,
        r#"services."web".endpoints."GET /checkout".calls[0].to"#
    );
    assert_eq!(at.line, 6, "{err}");

    let err =
        CallGraph::from_toml(&REVIEW.replace("max_attempts = 2", "max_attempts = 0")).unwrap_err();
    let GraphError::Syntax { field, message, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(
        field,
        r#"services."web".endpoints."GET /checkout".calls[0].policy"#
    );
    assert!(message.contains("max_attempts"), "{message}");

    let err = CallGraph::from_toml(&REVIEW.replace("failure_rate = 0.002", "failure_rate = 2.0"))
        .unwrap_err();
    assert!(err.to_string().contains("failure_rate"), "{err}");

    let err =
        CallGraph::from_toml(&REVIEW.replace("idempotency_key", "idempotency_keys")).unwrap_err();
    assert!(err.to_string().contains("unknown field"), "{err}");
}

#[test]
fn a_call_needs_exactly_one_policy() {
    let text = REVIEW.replace(
        "policy = { timeouts = { overall = \"2s\" }, retry = { max_attempts = 2 } }",
        "",
    );
    let err = CallGraph::from_toml(&text).unwrap_err();
    assert!(err.to_string().contains("exactly one"), "{err}");
}

#[test]
fn cycles_are_refused() {
    let err = CallGraph::from_toml(
        r#"[[services.a.endpoints."GET /".calls]]
        to = "b"
        endpoint = "GET /"
        policy = {}
        [[services.b.endpoints."GET /".calls]]
        to = "a"
        endpoint = "GET /"
        policy = {}"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("cycle"), "{err}");
}

#[test]
fn policy_references_use_the_policy_loader() {
    let dir = std::env::temp_dir().join(format!("sg-graph-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("p.toml"),
        "[endpoints.\"POST /pay\"]\ntimeouts = { overall = \"3s\" }\n",
    )
    .unwrap();
    let graph_text = REVIEW.replace(
        "policy = { timeouts = { overall = \"2s\" }, retry = { max_attempts = 2 } }",
        "policy_ref = \"p.toml#POST /pay\"",
    );
    std::fs::write(dir.join("g.toml"), &graph_text).unwrap();
    let graph = CallGraph::load(dir.join("g.toml")).unwrap();
    let call = &graph.calls_of(("web", "GET /checkout"))[0];
    assert_eq!(call.policy.overall_timeout(), Some(Duration::from_secs(3)));
    assert!(matches!(&call.origin, PolicyOrigin::File { endpoint, .. } if endpoint == "POST /pay"));

    std::fs::write(
        dir.join("g.toml"),
        graph_text.replace("#POST /pay", "#GET /none"),
    )
    .unwrap();
    let err = CallGraph::load(dir.join("g.toml")).unwrap_err();
    assert!(err.to_string().contains("no endpoint"), "{err}");
    std::fs::write(
        dir.join("p.toml"),
        "[endpoints.x]\nretry = { max_attempts = 0 }\n",
    )
    .unwrap();
    std::fs::write(dir.join("g.toml"), graph_text.replace("#POST /pay", "#x")).unwrap();
    let err = CallGraph::load(dir.join("g.toml")).unwrap_err();
    assert!(matches!(err, GraphError::Policy { .. }), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

mod props {
    use proptest::prelude::*;

    use super::super::CallGraph;
    use crate::lint::{LintConfig, Rule, lint_graph};

    /// A chain of `attempts.len()` calls, service i calling service i + 1.
    fn chain(attempts: &[u32]) -> String {
        let mut text = String::new();
        for (i, n) in attempts.iter().enumerate() {
            text.push_str(&format!(
                "[[services.s{i}.endpoints.\"GET /\".calls]]\nto = \"s{}\"\nendpoint = \"GET /\"\npolicy = {{ retry = {{ max_attempts = {n} }} }}\n",
                i + 1
            ));
        }
        text.push_str(&format!(
            "[services.s{}.endpoints.\"GET /\"]\n",
            attempts.len()
        ));
        text
    }

    proptest! {
        #[test]
        fn any_text_is_a_graph_or_an_error(text in "(?s).{0,400}") {
            let _ = CallGraph::from_toml(&text);
            let _ = CallGraph::from_json(&text);
        }

        #[test]
        fn any_graph_like_text_is_a_graph_or_an_error(
            text in "(\\[\\[?services\\.[ab]( endpoints\\.\"[GET /]{1,5}\")?(\\.calls)?\\]\\]?\n(to|endpoint|policy|policy_ref|latency|retry_signal) = (\"[ab]\"|\\{\\}|true|\"x#y\"|\\{ p99 = \"1s\" \\})\n){0,8}"
        ) {
            if let Ok(graph) = CallGraph::from_toml(&text) {
                let _ = lint_graph(&graph, &LintConfig::default());
            }
        }

        #[test]
        fn a_chains_amplification_is_the_product_of_its_attempts(attempts in proptest::collection::vec(1u32..=5, 1..5)) {
            let graph = CallGraph::from_toml(&chain(&attempts)).unwrap();
            prop_assert_eq!(graph.topological_order().len(), attempts.len() + 1);
            let product: u32 = attempts.iter().product();
            let findings = lint_graph(&graph, &LintConfig::default());
            let amp = findings.iter().find(|f| f.rule == Rule::Amplification);
            prop_assert_eq!(amp.is_some(), product > 10, "{:?}", findings);
            if let Some(amp) = amp {
                let expected = format!("{product}x");
                prop_assert!(amp.message.contains(&expected), "{}", amp.message);
            }
        }
    }
}
