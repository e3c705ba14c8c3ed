//! `stormguard policy lint` and `stormguard policy diff` as a CI job runs them: reports,
//! exit statuses, SARIF validated against the official 2.1.0 schema.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use serde_json::Value;

#[path = "support/run.rs"]
mod run;
use run::{stdout, stormguard};

/// A fixture of the core crate's lint and review tests.
fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../stormguard/tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn sarif_schema() -> jsonschema::Validator {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sarif-2.1.0-rtm.5.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::draft4::new(&schema).expect("the SARIF schema compiles (see fixtures/README.md)")
}

#[test]
fn sarif_output_validates_against_the_2_1_0_schema() {
    let validator = sarif_schema();
    for args in [
        vec![
            "policy",
            "lint",
            "--graph",
            &fixture("lint/amplification.toml"),
        ],
        vec!["policy", "lint", &fixture("lint/policy_problems.toml")],
        vec!["policy", "lint", "--graph", &fixture("lint/clean.toml")],
    ] {
        let mut args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        args.extend(["--format".into(), "sarif".into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = stormguard(&args);
        let log: Value = serde_json::from_str(&stdout(&o)).expect("SARIF is JSON");
        let errors: Vec<String> = validator
            .iter_errors(&log)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{args:?}: {errors:#?}");
        assert_eq!(log["version"], "2.1.0");
        assert_eq!(
            log["runs"][0]["tool"]["driver"]["rules"]
                .as_array()
                .unwrap()
                .len(),
            10
        );
    }
    // A log that breaks the schema is refused, so the check above means something.
    let bad = serde_json::json!({"version": "2.1.0", "runs": [{"results": []}]});
    assert!(!validator.is_valid(&bad));
}

#[test]
fn sarif_results_point_at_the_file_and_line() {
    let o = stormguard(&[
        "policy",
        "lint",
        &fixture("lint/timeout_below_p99.toml"),
        "--format",
        "sarif",
    ]);
    let o2 = stormguard(&[
        "policy",
        "lint",
        "--graph",
        &fixture("lint/timeout_below_p99.toml"),
        "--format",
        "sarif",
    ]);
    assert_eq!(o.status.code(), Some(2), "a graph is not a policy file");
    assert_eq!(o2.status.code(), Some(1));
    let log: Value = serde_json::from_str(&stdout(&o2)).unwrap();
    let result = &log["runs"][0]["results"][0];
    assert_eq!(result["ruleId"], "SG005");
    assert_eq!(result["level"], "error");
    let physical = &result["locations"][0]["physicalLocation"];
    assert!(
        physical["artifactLocation"]["uri"]
            .as_str()
            .unwrap()
            .starts_with("file:///")
    );
    assert!(
        physical["artifactLocation"]["uri"]
            .as_str()
            .unwrap()
            .ends_with("timeout_below_p99.toml")
    );
    assert_eq!(
        physical["region"]["startLine"], 24,
        "the line of the inline policy"
    );
}

#[test]
fn lint_exit_status_gates_ci() {
    let clean = stormguard(&["policy", "lint", "--graph", &fixture("lint/clean.toml")]);
    assert_eq!(clean.status.code(), Some(0));
    assert_eq!(stdout(&clean), "no findings\n");
    let warned = stormguard(&[
        "policy",
        "lint",
        "--graph",
        &fixture("lint/retry_without_jitter.toml"),
    ]);
    assert_eq!(warned.status.code(), Some(1));
    assert!(stdout(&warned).contains("SG009 retry-without-jitter"));
    let only_errors = stormguard(&[
        "policy",
        "lint",
        "--graph",
        &fixture("lint/retry_without_jitter.toml"),
        "--fail-on",
        "error",
    ]);
    assert_eq!(only_errors.status.code(), Some(0));
    let json = stormguard(&[
        "policy",
        "lint",
        "--graph",
        &fixture("lint/retry_on_4xx.toml"),
        "--format",
        "json",
    ]);
    let findings: Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(findings[0]["rule"], "retry-on-4xx");
    assert_eq!(findings[0]["severity"], "error");
    for bad in [
        vec!["policy", "lint"],
        vec!["policy", "lint", "missing.toml"],
        vec![
            "policy",
            "lint",
            "--graph",
            &fixture("lint/clean.toml"),
            "--p99-factor",
            "0.5",
        ],
    ] {
        assert_eq!(stormguard(&bad).status.code(), Some(2), "{bad:?}");
    }
}

#[test]
fn the_seeds_review_case_through_the_cli() {
    let graph = fixture("review/graph.toml");
    let diff = |new: &str, format: &str| {
        stormguard(&[
            "policy",
            "diff",
            &fixture("review/pay_2s.toml"),
            &fixture(&format!("review/pay_{new}.toml")),
            "--graph",
            &graph,
            "--format",
            format,
        ])
    };
    let five = diff("5s", "markdown");
    assert_eq!(five.status.code(), Some(1));
    let comment = stdout(&five);
    assert!(comment.contains("Policy review: **fail**"), "{comment}");
    assert!(
        comment.contains("| `POST /pay` | `timeouts.overall` | 2s | 5s | error |"),
        "{comment}"
    );
    let three = diff("3s", "json");
    assert_eq!(three.status.code(), Some(0));
    let review: Value = serde_json::from_str(&stdout(&three)).unwrap();
    assert_eq!(review["verdict"], "pass");
    assert_eq!(review["diff"]["endpoints"][0]["fields"][0]["new"], "3s");

    let lint = |new: &str| {
        stormguard(&[
            "policy",
            "lint",
            &fixture(&format!("review/pay_{new}.toml")),
            "--graph",
            &graph,
        ])
    };
    let flagged = lint("5s");
    assert_eq!(flagged.status.code(), Some(1));
    assert!(stdout(&flagged).contains("SG004 timeout-above-p99"));
    assert_eq!(lint("3s").status.code(), Some(0));
}
