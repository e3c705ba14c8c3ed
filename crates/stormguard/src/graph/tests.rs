#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::*;

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
    assert_eq!(graph.paths().len(), 1);
}

#[test]
fn json_graphs_have_the_same_shape() {
    let json = r#"{"services": {
        "a": {"endpoints": {"GET /": {"calls": [{"to": "b", "endpoint": "GET /x",
              "policy": {"retry": {"max_attempts": 3}}}]}}},
        "b": {"endpoints": {"GET /x": {"latency": {"p99": "10ms"}}}}}}"#;
    let graph = CallGraph::from_json(json).unwrap();
    assert_eq!(graph.paths()[0][0].policy.retry().max_attempts(), 3);
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
    let call = graph.paths()[0][0];
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
            prop_assert_eq!(graph.paths().len(), 1);
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
