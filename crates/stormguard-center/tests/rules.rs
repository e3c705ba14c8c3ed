//! Metric-driven rules in a real center on SQLite on 127.0.0.1: the rule routes, and the
//! `RuleRunner` fed hand-made observations at instants the test chooses (no collector, no
//! sleeps): firings and reverts are versions by `rule:<name>` with the observed values in
//! their audit records, a dry run publishes nothing, flapping input publishes once, the
//! hourly cap holds, and a revert keeps what a person changed in between; and (in
//! `lifecycle`) a fired rule's change taken back after a restart, an edit, a deletion, and
//! with two rules on one field.
#![allow(clippy::unwrap_used)]

#[path = "rules/lifecycle.rs"]
mod lifecycle;
mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stormguard::policy::{Fallback, PolicyFile};
use stormguard::rules::{Observations, Series, Verdict};
use stormguard_center::RuleRunner;
use support::{Api, TestCenter};

const EP: &str = "GET /img/*";
const POLICY: &str = r#"
[endpoints."GET /img/*"]
idempotency = "idempotent"
retry = { max_attempts = 3 }
timeouts = { per_try = "300ms", overall = "1s" }
"#;

fn rule(dry_run: bool) -> Value {
    json!({
        "name": "cdn-504",
        "service": "web",
        "endpoint": EP,
        "for": "10s",
        "exit_for": "20s",
        "dry_run": dry_run,
        "when": { "series": "error_ratio", "code": 504, "above": 0.10, "exit_below": 0.02 },
        "actions": [
            { "set": "attempts", "max_attempts": 1 },
            { "set": "fallback", "fallback": "always" }
        ]
    })
}

fn seen(ratio: f64) -> Observations {
    let mut o = Observations::new();
    o.set_endpoint(EP, Series::ErrorRatioCode(504), ratio);
    o
}

async fn put_rule(api: &Api, rule: &Value) -> (u16, Value) {
    api.send(
        "PUT",
        "/v1/services/web/rules/cdn-504",
        Some(rule.to_string().into_bytes()),
    )
    .await
}

async fn setup(dry_run: bool) -> (TestCenter, RuleRunner) {
    setup_on(TestCenter::sqlite().await, dry_run).await
}

async fn setup_on(center: TestCenter, dry_run: bool) -> (TestCenter, RuleRunner) {
    let editor = center.api(&center.editor);
    assert_eq!(editor.publish("web", 0, POLICY).await.0, 201);
    assert_eq!(put_rule(&editor, &rule(dry_run)).await.0, 204);
    let runner = RuleRunner::new(center.center.clone(), 6);
    (center, runner)
}

async fn versions(center: &TestCenter) -> Vec<Value> {
    let (status, body) = center
        .api(&center.viewer)
        .get("/v1/services/web/versions")
        .await;
    assert_eq!(status, 200);
    body.as_array().unwrap().clone()
}

async fn audit(center: &TestCenter) -> Vec<Value> {
    let (_, body) = center
        .api(&center.viewer)
        .get("/v1/audit?service=web")
        .await;
    body.as_array().unwrap().clone()
}

fn policy_of(version: &Value) -> PolicyFile {
    PolicyFile::from_toml(version["policy"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn rule_routes_check_roles_and_fields() {
    let center = TestCenter::sqlite().await;
    let (editor, viewer) = (center.api(&center.editor), center.api(&center.viewer));
    assert_eq!(put_rule(&viewer, &rule(false)).await.0, 403);
    let mut bad = rule(false);
    bad["when"]["exit_below"] = json!(0.5);
    let (status, body) = put_rule(&editor, &bad).await;
    assert_eq!(status, 422);
    assert!(
        body["error"].as_str().unwrap().contains("when.exit_below"),
        "{body}"
    );
    let mut other = rule(false);
    other["service"] = json!("api");
    assert_eq!(put_rule(&editor, &other).await.0, 400);
    assert_eq!(put_rule(&editor, &rule(false)).await.0, 204);
    let (status, list) = viewer.get("/v1/services/web/rules").await;
    assert_eq!(status, 200);
    assert_eq!(list[0]["name"], "cdn-504");
    assert_eq!(list[0]["rule"]["for"], "10s");
    let path = "/v1/services/web/rules/cdn-504";
    assert_eq!(viewer.send("DELETE", path, None).await.0, 403);
    assert_eq!(editor.send("DELETE", path, None).await.0, 204);
    assert_eq!(editor.send("DELETE", path, None).await.0, 404);
    let actions: Vec<_> = audit(&center)
        .await
        .iter()
        .map(|r| r["action"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(actions, ["rule-delete", "rule-put"]);
}

#[tokio::test]
async fn a_dry_run_publishes_nothing_and_records_what_it_would_do() {
    let (center, runner) = setup(true).await;
    let t0 = Instant::now();
    let mut events = Vec::new();
    for (s, ratio) in [(0, 0.4), (10, 0.4), (20, 0.0), (40, 0.0)] {
        events.extend(
            runner
                .observe("web", &seen(ratio), t0 + Duration::from_secs(s))
                .await
                .unwrap(),
        );
    }
    let verdicts: Vec<_> = events
        .iter()
        .map(|e| (e.verdict, e.action, e.version))
        .collect();
    assert_eq!(
        verdicts,
        [
            (Verdict::Fire, "rule-dry-run", None),
            (Verdict::Revert, "rule-dry-run", None)
        ]
    );
    assert_eq!(versions(&center).await.len(), 1, "nothing published");
    let records = audit(&center).await;
    let dry: Vec<_> = records
        .iter()
        .filter(|r| r["action"] == "rule-dry-run")
        .collect();
    assert_eq!(dry.len(), 2);
    assert_eq!(dry[1]["actor"], "rule:cdn-504");
    let detail: Value = serde_json::from_str(dry[1]["detail"].as_str().unwrap()).unwrap();
    assert_eq!(detail["observed"]["error_ratio{code=504}"], 0.4);
    assert_eq!(detail["changes"][0]["field"], "retry.max_attempts");
}

#[tokio::test]
async fn a_firing_publishes_and_a_revert_restores_keeping_a_human_edit() {
    fire_and_revert(setup(false).await).await;
}

#[tokio::test]
async fn on_postgres_a_firing_publishes_and_a_revert_restores() {
    let Some(url) = support::postgres_url("rule firing and revert") else {
        return;
    };
    let url = support::postgres_schema(&url).await;
    fire_and_revert(setup_on(TestCenter::on(&url, None).await, false).await).await;
}

async fn fire_and_revert((center, runner): (TestCenter, RuleRunner)) {
    let t0 = Instant::now();
    let at = |s| t0 + Duration::from_secs(s);
    assert!(
        runner
            .observe("web", &seen(0.4), at(0))
            .await
            .unwrap()
            .is_empty()
    );
    let fired = runner.observe("web", &seen(0.4), at(10)).await.unwrap();
    assert_eq!(fired.len(), 1);
    assert_eq!(
        (fired[0].verdict, fired[0].version),
        (Verdict::Fire, Some(2))
    );
    let v2 = &versions(&center).await[0];
    assert_eq!(v2["author"], "rule:cdn-504");
    let policy = policy_of(v2);
    let endpoint = policy.endpoint(EP).unwrap();
    assert_eq!(endpoint.retry().max_attempts(), 1, "no retries");
    assert_eq!(endpoint.fallback(), Fallback::Always);
    let record = audit(&center)
        .await
        .into_iter()
        .find(|r| r["version"] == 2)
        .unwrap();
    assert_eq!(
        (record["action"].as_str(), record["actor"].as_str()),
        (Some("rule-fire"), Some("rule:cdn-504"))
    );
    let detail: Value = serde_json::from_str(record["detail"].as_str().unwrap()).unwrap();
    assert_eq!(detail["rule"], "cdn-504");
    assert_eq!(detail["observed"]["error_ratio{code=504}"], 0.4);

    // A person loosens the overall timeout while the rule is active.
    let human = v2["policy"]
        .as_str()
        .unwrap()
        .replace("overall = \"1s\"", "overall = \"3s\"");
    assert_eq!(
        center.api(&center.editor).publish("web", 2, &human).await.0,
        201
    );

    assert!(
        runner
            .observe("web", &seen(0.0), at(20))
            .await
            .unwrap()
            .is_empty()
    );
    let reverted = runner.observe("web", &seen(0.0), at(40)).await.unwrap();
    assert_eq!(
        (reverted[0].verdict, reverted[0].version),
        (Verdict::Revert, Some(4))
    );
    let v4 = &versions(&center).await[0];
    assert_eq!(v4["author"], "rule:cdn-504");
    let policy = policy_of(v4);
    let endpoint = policy.endpoint(EP).unwrap();
    assert_eq!(endpoint.retry().max_attempts(), 3, "the old value is back");
    assert_eq!(endpoint.fallback(), Fallback::OnGiveUp);
    assert_eq!(
        endpoint.overall_timeout(),
        Some(Duration::from_secs(3)),
        "the human's edit stays"
    );
    let record = audit(&center)
        .await
        .into_iter()
        .find(|r| r["version"] == 4)
        .unwrap();
    assert_eq!(record["action"], "rule-revert");
}

#[tokio::test]
async fn flapping_input_publishes_once() {
    let (center, runner) = setup(false).await;
    let t0 = Instant::now();
    let mut published = 0;
    for s in 0..300u64 {
        // Above the 0.10 enter threshold first, then hovering around it, never under the
        // 0.02 exit threshold.
        let ratio = if s < 20 {
            0.2
        } else {
            [0.05, 0.15, 0.09, 0.11][s as usize % 4]
        };
        let events = runner
            .observe("web", &seen(ratio), t0 + Duration::from_secs(s))
            .await
            .unwrap();
        published += events.iter().filter(|e| e.version.is_some()).count();
    }
    assert_eq!(published, 1);
    assert_eq!(versions(&center).await.len(), 2);
}

#[tokio::test]
async fn the_hourly_cap_holds() {
    let (center, runner) = setup(false).await;
    runner.set_cap("web", 4).await;
    let t0 = Instant::now();
    let mut changes = Vec::new();
    // A fault that comes and goes every two minutes, for three hours, observed every 10 s.
    for step in 0..(3 * 360u64) {
        let s = step * 10;
        let ratio = if (s / 120) % 2 == 0 { 0.5 } else { 0.0 };
        for event in runner
            .observe("web", &seen(ratio), t0 + Duration::from_secs(s))
            .await
            .unwrap()
        {
            assert!(event.version.is_some(), "{event:?}");
            changes.push(s);
        }
    }
    assert!(changes.len() >= 8, "{changes:?}");
    for (i, &t) in changes.iter().enumerate() {
        let in_hour = changes[i..].iter().take_while(|&&u| u < t + 3600).count();
        assert!(
            in_hour <= 4,
            "{in_hour} changes in the hour from {t} s: {changes:?}"
        );
    }
    assert_eq!(versions(&center).await.len(), 1 + changes.len());
}

#[tokio::test]
async fn a_firing_that_cannot_be_published_is_recorded_and_tried_again() {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    // The policy has no "GET /img/*" endpoint for the rule to change.
    assert_eq!(
        editor
            .publish("web", 0, "[endpoints.\"GET /other\"]\n")
            .await
            .0,
        201
    );
    assert_eq!(put_rule(&editor, &rule(false)).await.0, 204);
    let runner = RuleRunner::new(center.center.clone(), 6);
    let t0 = Instant::now();
    let mut failed = 0;
    for s in [0, 10, 11, 12] {
        for event in runner
            .observe("web", &seen(0.4), t0 + Duration::from_secs(s))
            .await
            .unwrap()
        {
            assert_eq!(
                (event.verdict, event.action, event.version),
                (Verdict::Fire, "rule-failed", None)
            );
            assert!(
                event.detail.contains("no such endpoint"),
                "{}",
                event.detail
            );
            failed += 1;
        }
    }
    assert_eq!(
        failed, 3,
        "tried again at each observation once `for` has passed"
    );
    assert_eq!(versions(&center).await.len(), 1);
    let records = audit(&center).await;
    assert_eq!(
        records
            .iter()
            .filter(|r| r["action"] == "rule-failed")
            .count(),
        3
    );
}

/// A rule's standing (its newest fire, revert or hand-over record) is found through the
/// index on (service, actor, id), not by scanning the service's records.
#[tokio::test]
async fn a_rule_s_last_change_is_read_through_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("center.db").display());
    let _center = support::TestCenter::on(&url, None).await;
    let db = sqlx::SqlitePool::connect(&url).await.unwrap();
    // The query of `Store::last_rule_change`.
    let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(
        "EXPLAIN QUERY PLAN SELECT id, at_ms, actor, action, service, version, instance, detail
            FROM center_audit WHERE service = $1 AND actor = $2
            AND action IN ('rule-fire', 'rule-revert', 'rule-handoff')
            ORDER BY id DESC LIMIT 1",
    )
    .bind("web")
    .bind("rule:cdn-504")
    .fetch_all(&db)
    .await
    .unwrap();
    let plan: Vec<&str> = plan.iter().map(|row| row.3.as_str()).collect();
    assert!(
        plan.iter().any(|step| step.contains("center_audit_actor")),
        "{plan:?}"
    );
}
