//! The lint rules against their fixtures: each finds its problem in the fixture that has it,
//! and nothing is found in the clean ones; the seeds' review case through lint and review.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use stormguard::graph::CallGraph;
use stormguard::lint::review::{Verdict, review};
use stormguard::lint::{Finding, LintConfig, Rule, Severity, lint_graph, lint_policy_file};
use stormguard::policy::PolicyFile;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn lint(name: &str) -> Vec<Finding> {
    let graph = CallGraph::load(fixture(&format!("lint/{name}.toml"))).unwrap();
    lint_graph(&graph, &LintConfig::default())
}

fn rules(findings: &[Finding]) -> Vec<Rule> {
    findings.iter().map(|f| f.rule).collect()
}

#[test]
fn the_clean_graph_has_no_findings() {
    assert_eq!(lint("clean"), []);
}

#[test]
fn each_rule_finds_its_problem_in_its_fixture() {
    for (name, rule) in [
        ("amplification", Rule::Amplification),
        ("layered_retries", Rule::LayeredRetries),
        ("inner_retries_dead", Rule::InnerRetriesDead),
        ("timeout_above_p99", Rule::TimeoutAboveP99),
        ("timeout_below_p99", Rule::TimeoutBelowP99),
        ("retry_non_idempotent", Rule::RetryNonIdempotent),
        ("retry_on_4xx", Rule::RetryOn4xx),
        ("retry_without_budget", Rule::RetryWithoutBudget),
        ("retry_without_jitter", Rule::RetryWithoutJitter),
        ("retries_impossible", Rule::RetriesImpossible),
    ] {
        let findings = lint(name);
        let found: Vec<&Finding> = findings.iter().filter(|f| f.rule == rule).collect();
        assert_eq!(found.len(), 1, "{name}: {findings:#?}");
        let finding = found[0];
        assert!(
            finding
                .file
                .as_ref()
                .unwrap()
                .ends_with(format!("{name}.toml"))
        );
        assert!(finding.line.unwrap() > 1, "{name}: {finding:?}");
        assert!(!finding.field.is_empty());
    }
}

#[test]
fn findings_name_the_field_and_its_line() {
    let findings = lint("timeout_below_p99");
    assert_eq!(rules(&findings), [Rule::TimeoutBelowP99]);
    let f = &findings[0];
    assert_eq!(
        f.field,
        r#"services."api".endpoints."POST /order".calls[0].policy.timeouts.per_try"#
    );
    assert_eq!(f.severity, Severity::Error);
    // The inline policy's line: the TOML places an inline table's fields on its own line.
    let text = std::fs::read_to_string(fixture("lint/timeout_below_p99.toml")).unwrap();
    let line = text.lines().nth(f.line.unwrap() - 1).unwrap();
    assert!(line.contains("per_try = \"200ms\""), "{line}");
}

#[test]
fn three_layers_of_two_retries_are_27x_and_budgets_with_the_signal_bring_it_to_1_1x() {
    let findings = lint("amplification");
    let amp = findings
        .iter()
        .find(|f| f.rule == Rule::Amplification)
        .unwrap();
    assert_eq!(amp.severity, Severity::Error);
    assert!(amp.message.contains("27x"), "{}", amp.message);

    let text = std::fs::read_to_string(fixture("lint/amplification.toml"))
        .unwrap()
        .replace(
            "policy = { retry = { max_attempts = 3 } }",
            "policy = { retry = { max_attempts = 3 }, budget = { kind = \"ratio\", retry_ratio = 0.1, ttl = \"10s\" } }",
        )
        .replace("[services.web.endpoints.\"GET /\"]", "[services.web]\nretry_signal = true\n[services.api]\nretry_signal = true\n[services.store]\nretry_signal = true\n[services.web.endpoints.\"GET /\"]");
    let graph = CallGraph::from_toml(&text).unwrap();
    let findings = lint_graph(&graph, &LintConfig::default());
    assert_eq!(rules(&findings), [Rule::Amplification], "{findings:#?}");
    assert_eq!(findings[0].severity, Severity::Note);
    assert!(
        findings[0].message.contains("27x"),
        "{}",
        findings[0].message
    );
    assert!(
        findings[0].message.contains("1.10x"),
        "{}",
        findings[0].message
    );
}

#[test]
fn a_policy_file_alone_is_linted_with_the_rules_that_need_no_graph() {
    let lint_file = |name: &str| {
        let path = fixture(&format!("lint/{name}.toml"));
        let file = PolicyFile::load(&path).unwrap();
        let source = stormguard::graph::Source {
            file: Some(path.clone()),
            text: std::fs::read_to_string(&path).unwrap(),
            json: false,
        };
        lint_policy_file(&file, Some(&source))
    };
    assert_eq!(lint_file("policy_clean"), []);
    let findings = lint_file("policy_problems");
    let mut found = rules(&findings);
    found.sort();
    assert_eq!(
        found,
        [
            Rule::RetryNonIdempotent,
            Rule::RetryWithoutBudget,
            Rule::RetryWithoutJitter,
            Rule::RetriesImpossible
        ],
        "{findings:#?}"
    );
    let jitter = findings
        .iter()
        .find(|f| f.rule == Rule::RetryWithoutJitter)
        .unwrap();
    assert_eq!(jitter.field, r#"endpoints."GET /search".backoff.jitter"#);
    assert_eq!(jitter.line, Some(10));
}

/// The seeds: "an interface's timeout went from 2 s to 5 s; review caught that its
/// downstream's P99 is 1.8 s, so the retry window would grow too large; it became 3 s".
#[test]
fn the_seeds_review_case_is_flagged_by_lint_and_review_and_3s_passes() {
    let graph = CallGraph::load(fixture("review/graph.toml")).unwrap();
    let config = LintConfig::default();
    assert_eq!(
        lint_graph(&graph, &config),
        [],
        "2 s in production is clean"
    );
    let version = |t: &str| {
        let path = fixture(&format!("review/pay_{t}.toml"));
        (PolicyFile::load(&path).unwrap(), path)
    };
    let (old, _) = version("2s");
    let (five, five_path) = version("5s");
    let (three, three_path) = version("3s");

    let findings = lint_graph(&graph.with_policy_file(&five, &five_path), &config);
    assert_eq!(rules(&findings), [Rule::TimeoutAboveP99], "{findings:#?}");
    assert_eq!(findings[0].file.as_deref(), Some(five_path.as_path()));
    assert_eq!(
        findings[0].field,
        r#"endpoints."POST /pay".timeouts.overall"#
    );
    assert_eq!(findings[0].line, Some(2));
    assert_eq!(
        lint_graph(&graph.with_policy_file(&three, &three_path), &config),
        []
    );

    let flagged = review(&old, &five, Some(&graph), &config);
    assert_eq!(flagged.verdict, Verdict::Fail);
    let j = &flagged.judgements[0];
    assert_eq!(
        (j.field.as_str(), j.old.as_deref(), j.new.as_deref()),
        ("timeouts.overall", Some("2s"), Some("5s"))
    );
    assert!(j.message.contains("1.8s"), "{}", j.message);
    assert_eq!(
        review(&old, &three, Some(&graph), &config).verdict,
        Verdict::Pass
    );
}

#[test]
fn review_judges_attempts_budgets_and_jitter() {
    let old = PolicyFile::from_toml(
        r#"[endpoints.a]
        retry = { max_attempts = 2 }
        budget = { kind = "ratio", retry_ratio = 0.1, ttl = "10s" }"#,
    )
    .unwrap();
    let judge = |new: &str| {
        let new = PolicyFile::from_toml(new).unwrap();
        review(&old, &new, None, &LintConfig::default())
    };
    let more = judge(
        "[endpoints.a]\nretry = { max_attempts = 3 }\nbudget = { kind = \"ratio\", retry_ratio = 0.1, ttl = \"10s\" }",
    );
    assert_eq!(more.verdict, Verdict::Review);
    assert_eq!(more.judgements[0].field, "retry.max_attempts");
    let no_budget = judge("[endpoints.a]\nretry = { max_attempts = 2 }");
    assert_eq!(no_budget.verdict, Verdict::Fail);
    let looser = judge(
        "[endpoints.a]\nretry = { max_attempts = 2 }\nbudget = { kind = \"ratio\", retry_ratio = 0.5, ttl = \"10s\" }",
    );
    assert_eq!(looser.verdict, Verdict::Review);
    assert_eq!(looser.judgements[0].field, "budget.retry_ratio");
    let no_jitter = judge(
        "[endpoints.a]\nretry = { max_attempts = 2 }\nbackoff = { jitter = \"none\" }\nbudget = { kind = \"ratio\", retry_ratio = 0.1, ttl = \"10s\" }",
    );
    assert_eq!(no_jitter.verdict, Verdict::Review);
    assert_eq!(no_jitter.judgements[0].field, "backoff.jitter");
    assert_eq!(judge("[endpoints.a]\nretry = { max_attempts = 2 }\nbudget = { kind = \"ratio\", retry_ratio = 0.1, ttl = \"10000ms\" }").judgements, []);
}

/// An endpoint policy added by a change is judged by the rules a policy breaks on its own:
/// a new `POST /pay` that retries in-doubt failures without a key fails the review, as
/// `policy lint` would fail it.
#[test]
fn an_added_endpoint_is_judged_by_the_lint_rules() {
    let old = PolicyFile::from_toml("[endpoints.\"GET /a\"]\n").expect("valid");
    let new = PolicyFile::from_toml(
        "[endpoints.\"GET /a\"]\n[endpoints.\"POST /pay\"]\nidempotency = \"idempotent\"\nretry = { max_attempts = 3 }\n",
    )
    .expect("valid");
    let judged = review(&old, &new, None, &LintConfig::default());
    assert_eq!(judged.verdict, Verdict::Fail, "{judged:?}");
    assert!(
        judged
            .judgements
            .iter()
            .any(|j| j.endpoint == "POST /pay" && j.severity == Severity::Error),
        "{judged:?}"
    );
    let safe = PolicyFile::from_toml(
        "[endpoints.\"GET /a\"]\n[endpoints.\"GET /b\"]\nretry = { max_attempts = 1 }\n",
    )
    .expect("valid");
    assert_eq!(
        review(&old, &safe, None, &LintConfig::default()).verdict,
        Verdict::Pass
    );
}
