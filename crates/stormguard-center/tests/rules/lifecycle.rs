//! What a fired rule changed is always taken back: after a restart of the center (a new
//! runner over the same database), by an edit that makes the rule change something else,
//! by deleting it, and when two rules set one field and clear in either order.

use super::*;

/// A named edit of a rule (its JSON).
type Edit<T> = (&'static str, fn(&mut T));

fn at(t0: Instant, s: u64) -> Instant {
    t0 + Duration::from_secs(s)
}

/// Drives the `cdn-504` rule to its firing (version `2`, on a fresh setup).
async fn fire(runner: &RuleRunner, t0: Instant) {
    let quiet = runner.observe("web", &seen(0.4), at(t0, 0)).await.unwrap();
    assert!(quiet.is_empty(), "{quiet:?}");
    let fired = runner.observe("web", &seen(0.4), at(t0, 10)).await.unwrap();
    assert_eq!(
        (fired[0].verdict, fired[0].action, fired[0].version),
        (Verdict::Fire, "rule-fire", Some(2))
    );
}

/// The image endpoint's attempts and fallback in the latest version, and its author.
async fn latest(center: &TestCenter) -> (u32, Fallback, String) {
    let v = &versions(center).await[0];
    let policy = policy_of(v);
    let endpoint = policy.endpoint(EP).unwrap();
    (
        endpoint.retry().max_attempts(),
        endpoint.fallback(),
        v["author"].as_str().unwrap().to_owned(),
    )
}

/// The newest audit record with `action`, and its detail.
async fn newest(center: &TestCenter, action: &str) -> (Value, Value) {
    let record = audit(center)
        .await
        .into_iter()
        .find(|r| r["action"] == action)
        .unwrap_or_else(|| panic!("no {action} record"));
    let detail = serde_json::from_str(record["detail"].as_str().unwrap()).unwrap();
    (record, detail)
}

#[tokio::test]
async fn a_restarted_center_reverts_a_rule_that_fired_before() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("center.db").display());
    restart_on(&url).await;
}

#[tokio::test]
async fn on_postgres_a_restarted_center_reverts_a_rule_that_fired_before() {
    let Some(url) = support::postgres_url("rule revert after a restart") else {
        return;
    };
    restart_on(&support::postgres_schema(&url).await).await;
}

async fn restart_on(url: &str) {
    let (mut first, runner) = setup_on(TestCenter::on(url, None).await, false).await;
    let t0 = Instant::now();
    fire(&runner, t0).await;
    drop(runner);
    first.stop().await;
    drop(first);

    let second = TestCenter::on(url, None).await;
    let runner = RuleRunner::new(second.center.clone(), 6);
    // Still holding: the restarted runner knows the rule fired, and does not fire it again.
    let holding = runner.observe("web", &seen(0.4), at(t0, 15)).await.unwrap();
    assert!(holding.is_empty(), "{holding:?}");
    assert!(
        runner
            .observe("web", &seen(0.0), at(t0, 20))
            .await
            .unwrap()
            .is_empty()
    );
    let reverted = runner.observe("web", &seen(0.0), at(t0, 40)).await.unwrap();
    assert_eq!(
        (reverted.len(), reverted[0].verdict, reverted[0].version),
        (1, Verdict::Revert, Some(3))
    );
    assert_eq!(
        latest(&second).await,
        (3, Fallback::OnGiveUp, "rule:cdn-504".to_owned()),
        "the values before the firing are back"
    );
}

#[tokio::test]
async fn an_edit_that_changes_what_a_fired_rule_does_reverts_it_first() {
    let edits: [Edit<Value>; 3] = [
        ("other actions", |r| {
            r["actions"] = json!([{ "set": "attempts", "max_attempts": 2 }]);
        }),
        ("dry run on", |r| r["dry_run"] = json!(true)),
        ("another endpoint", |r| r["endpoint"] = json!("GET /other")),
    ];
    for (what, edit) in edits {
        let (center, runner) = setup(false).await;
        let t0 = Instant::now();
        fire(&runner, t0).await;
        let mut edited = rule(false);
        edit(&mut edited);
        let editor = center.api(&center.editor);
        assert_eq!(put_rule(&editor, &edited).await.0, 204, "{what}");
        assert_eq!(
            versions(&center).await.len(),
            3,
            "{what}: a revert published"
        );
        assert_eq!(
            latest(&center).await,
            (3, Fallback::OnGiveUp, "rule:cdn-504".to_owned()),
            "{what}"
        );
        let (record, detail) = newest(&center, "rule-revert").await;
        assert_eq!(record["version"], 3, "{what}");
        assert!(
            detail["reason"]
                .as_str()
                .unwrap()
                .starts_with("edited by alice"),
            "{what}: {detail}"
        );
        // The edited rule starts idle: with its condition holding it waits `for` again,
        // then fires as it now reads.
        let mut both = seen(0.4);
        both.set_endpoint("GET /other", Series::ErrorRatioCode(504), 0.4);
        let waiting = runner.observe("web", &both, at(t0, 11)).await.unwrap();
        assert!(waiting.is_empty(), "{what}: {waiting:?}");
        let fired = runner.observe("web", &both, at(t0, 21)).await.unwrap();
        let expected = match what {
            "other actions" => ("rule-fire", Some(4)),
            "dry run on" => ("rule-dry-run", None),
            // The policy has no such endpoint.
            _ => ("rule-failed", None),
        };
        assert_eq!(
            (fired[0].verdict, fired[0].action, fired[0].version),
            (Verdict::Fire, expected.0, expected.1),
            "{what}"
        );
        if what == "other actions" {
            assert_eq!(latest(&center).await.0, 2, "the new action");
        }
    }
}

#[tokio::test]
async fn an_edit_of_a_fired_rule_s_thresholds_keeps_it_fired() {
    let (center, runner) = setup(false).await;
    let t0 = Instant::now();
    fire(&runner, t0).await;
    let mut edited = rule(false);
    edited["when"]["exit_below"] = json!(0.05);
    assert_eq!(put_rule(&center.api(&center.editor), &edited).await.0, 204);
    assert_eq!(versions(&center).await.len(), 2, "nothing reverted");
    // 0.04 clears by the new exit threshold (not by the old 0.02).
    assert!(
        runner
            .observe("web", &seen(0.04), at(t0, 20))
            .await
            .unwrap()
            .is_empty()
    );
    let reverted = runner
        .observe("web", &seen(0.04), at(t0, 40))
        .await
        .unwrap();
    assert_eq!(
        (reverted[0].verdict, reverted[0].version),
        (Verdict::Revert, Some(3))
    );
    assert_eq!(latest(&center).await.0, 3);
}

#[tokio::test]
async fn deleting_a_fired_rule_reverts_it_first() {
    let (center, runner) = setup(false).await;
    let t0 = Instant::now();
    fire(&runner, t0).await;
    let editor = center.api(&center.editor);
    let path = "/v1/services/web/rules/cdn-504";
    assert_eq!(editor.send("DELETE", path, None).await.0, 204);
    assert_eq!(
        latest(&center).await,
        (3, Fallback::OnGiveUp, "rule:cdn-504".to_owned())
    );
    let actions: Vec<_> = audit(&center)
        .await
        .iter()
        .take(2)
        .map(|r| r["action"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        actions,
        ["rule-delete", "rule-revert"],
        "reverted, then deleted"
    );
    let (_, detail) = newest(&center, "rule-revert").await;
    assert_eq!(detail["reason"], "deleted by alice");
    assert!(
        runner
            .observe("web", &seen(0.0), at(t0, 40))
            .await
            .unwrap()
            .is_empty(),
        "the deleted rule is gone from the runner"
    );
    // Deleting a rule that has not fired publishes nothing.
    assert_eq!(put_rule(&editor, &rule(false)).await.0, 204);
    assert_eq!(editor.send("DELETE", path, None).await.0, 204);
    assert_eq!(versions(&center).await.len(), 3);
}

/// Rule `a-cut` sets attempts 3 -> 2 on 504s, `b-cut` then 2 -> `b` on a slow P99.
async fn two_rules_on(center: TestCenter, b: u32) -> (TestCenter, RuleRunner) {
    let editor = center.api(&center.editor);
    assert_eq!(editor.publish("web", 0, POLICY).await.0, 201);
    for (name, attempts, when) in [
        (
            "a-cut",
            2,
            json!({ "series": "error_ratio", "code": 504, "above": 0.10, "exit_below": 0.02 }),
        ),
        (
            "b-cut",
            b,
            json!({ "series": "p99", "above": "800ms", "exit_below": "300ms" }),
        ),
    ] {
        let body = json!({
            "name": name, "service": "web", "endpoint": EP, "for": "10s", "exit_for": "20s",
            "when": when, "actions": [{ "set": "attempts", "max_attempts": attempts }],
        });
        let path = format!("/v1/services/web/rules/{name}");
        let put = editor
            .send("PUT", &path, Some(body.to_string().into_bytes()))
            .await;
        assert_eq!(put.0, 204, "{put:?}");
    }
    let runner = RuleRunner::new(center.center.clone(), 6);
    (center, runner)
}

fn both(ratio: f64, p99: f64) -> Observations {
    let mut o = seen(ratio);
    o.set_endpoint(EP, Series::P99, p99);
    o
}

/// Runs the observations at the given seconds; the (rule, version) of each change.
async fn run(
    runner: &RuleRunner,
    t0: Instant,
    steps: &[(u64, f64, f64)],
) -> Vec<(String, Option<u64>)> {
    let mut out = Vec::new();
    for &(s, ratio, p99) in steps {
        for event in runner
            .observe("web", &both(ratio, p99), at(t0, s))
            .await
            .unwrap()
        {
            out.push((event.rule, event.version));
        }
    }
    out
}

async fn first_cleared_first(center: TestCenter) {
    let (center, runner) = two_rules_on(center, 1).await;
    let t0 = Instant::now();
    let fired = run(&runner, t0, &[(0, 0.4, 1.0), (10, 0.4, 1.0)]).await;
    assert_eq!(
        fired,
        [("a-cut".into(), Some(2)), ("b-cut".into(), Some(3))]
    );
    assert_eq!(latest(&center).await.0, 1);
    // a clears first: b's 1 stays, and a's 3 passes to b.
    let a_back = run(&runner, t0, &[(20, 0.0, 1.0), (40, 0.0, 1.0)]).await;
    assert_eq!(a_back, [("a-cut".into(), None)], "nothing to publish yet");
    assert_eq!(latest(&center).await.0, 1, "b is still active");
    let (_, detail) = newest(&center, "rule-revert").await;
    assert_eq!(detail["changes"][0]["handed_to"], "b-cut", "{detail}");
    let (record, detail) = newest(&center, "rule-handoff").await;
    assert_eq!(record["actor"], "rule:b-cut");
    assert_eq!(detail["changes"][0]["before"], 3, "{detail}");
    // The heir keeps when and in which order it fired (its `min_hold` and its place among
    // the firings do not restart at the hand-over).
    let b_fired = audit(&center)
        .await
        .into_iter()
        .find(|r| r["action"] == "rule-fire" && r["actor"] == "rule:b-cut")
        .unwrap();
    assert_eq!(
        (&detail["fired_ms"], &detail["fired_id"]),
        (&b_fired["at_ms"], &b_fired["id"]),
        "{detail}"
    );
    let b_back = run(&runner, t0, &[(50, 0.0, 0.1), (70, 0.0, 0.1)]).await;
    assert_eq!(b_back, [("b-cut".into(), Some(4))]);
    assert_eq!(latest(&center).await.0, 3, "the value before both rules");
}

async fn last_cleared_first(center: TestCenter) {
    let (center, runner) = two_rules_on(center, 1).await;
    let t0 = Instant::now();
    run(&runner, t0, &[(0, 0.4, 1.0), (10, 0.4, 1.0)]).await;
    let b_back = run(&runner, t0, &[(20, 0.4, 0.1), (40, 0.4, 0.1)]).await;
    assert_eq!(b_back, [("b-cut".into(), Some(4))]);
    assert_eq!(latest(&center).await.0, 2, "a's value, a still active");
    let a_back = run(&runner, t0, &[(50, 0.0, 0.1), (70, 0.0, 0.1)]).await;
    assert_eq!(a_back, [("a-cut".into(), Some(5))]);
    assert_eq!(latest(&center).await.0, 3);
}

#[tokio::test]
async fn two_rules_on_one_field_the_first_to_fire_clears_first() {
    first_cleared_first(TestCenter::sqlite().await).await;
}

#[tokio::test]
async fn two_rules_on_one_field_the_last_to_fire_clears_first() {
    last_cleared_first(TestCenter::sqlite().await).await;
}

#[tokio::test]
async fn on_postgres_two_rules_on_one_field_unwind_in_either_order() {
    let Some(url) = support::postgres_url("two rules on one field") else {
        return;
    };
    first_cleared_first(TestCenter::on(&support::postgres_schema(&url).await, None).await).await;
    last_cleared_first(TestCenter::on(&support::postgres_schema(&url).await, None).await).await;
}

/// Two replicas' runners over one database, both seeing the rule's condition: the one that
/// fires second finds the rule fired by the other and writes nothing (no second `rule-fire`
/// record with no changes that would hide the first), so the revert restores the values.
async fn two_runners_fire_once(url: &str) {
    let (first, runner_a) = setup_on(TestCenter::on(url, None).await, false).await;
    let second = TestCenter::on(url, None).await;
    let runner_b = RuleRunner::new(second.center.clone(), 6);
    let t0 = Instant::now();
    // Both runners read the rule idle, then A fires.
    let quiet = runner_b
        .observe("web", &seen(0.4), at(t0, 0))
        .await
        .unwrap();
    assert!(quiet.is_empty(), "{quiet:?}");
    fire(&runner_a, t0).await;
    let late = runner_b
        .observe("web", &seen(0.4), at(t0, 10))
        .await
        .unwrap();
    assert_eq!(
        (late[0].verdict, late[0].action, late[0].version),
        (Verdict::Fire, "rule-fire", None),
        "{late:?}"
    );
    let fires: Vec<_> = audit(&first)
        .await
        .into_iter()
        .filter(|r| r["action"] == "rule-fire")
        .collect();
    assert_eq!(fires.len(), 1, "one rule-fire record: {fires:?}");
    // B's engine holds the rule fired too; it reverts when the condition clears.
    runner_b
        .observe("web", &seen(0.0), at(t0, 20))
        .await
        .unwrap();
    let reverted = runner_b
        .observe("web", &seen(0.0), at(t0, 40))
        .await
        .unwrap();
    assert_eq!(
        (reverted[0].verdict, reverted[0].version),
        (Verdict::Revert, Some(3))
    );
    assert_eq!(
        latest(&first).await,
        (3, Fallback::OnGiveUp, "rule:cdn-504".to_owned())
    );
}

#[tokio::test]
async fn two_runners_over_one_database_fire_a_rule_once() {
    let dir = tempfile::tempdir().unwrap();
    two_runners_fire_once(&format!(
        "sqlite://{}",
        dir.path().join("center.db").display()
    ))
    .await;
}

#[tokio::test]
async fn on_postgres_two_runners_fire_a_rule_once() {
    let Some(url) = support::postgres_url("two runners firing one rule") else {
        return;
    };
    two_runners_fire_once(&support::postgres_schema(&url).await).await;
}

/// A deletion whose revert was published but whose own write then failed (the database
/// refuses it: a trigger the test adds): the rule stays stored, idle, and the runner reads
/// it so, firing again while its condition holds instead of holding a change that is gone.
#[tokio::test]
async fn a_failed_deletion_after_its_revert_leaves_the_rule_idle_in_the_runner() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("center.db").display());
    let (center, runner) = setup_on(TestCenter::on(&url, None).await, false).await;
    let t0 = Instant::now();
    fire(&runner, t0).await;
    let db = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query(
        "CREATE TRIGGER keep_rules BEFORE DELETE ON center_rules
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
    )
    .execute(&db)
    .await
    .unwrap();
    let editor = center.api(&center.editor);
    let (status, _) = editor
        .send("DELETE", "/v1/services/web/rules/cdn-504", None)
        .await;
    assert!(status >= 500, "{status}");
    assert_eq!(latest(&center).await.0, 3, "the revert was published");
    let waiting = runner.observe("web", &seen(0.4), at(t0, 11)).await.unwrap();
    assert!(waiting.is_empty(), "{waiting:?}");
    let fired = runner.observe("web", &seen(0.4), at(t0, 21)).await.unwrap();
    assert_eq!(
        (fired[0].verdict, fired[0].action, fired[0].version),
        (Verdict::Fire, "rule-fire", Some(4)),
        "{fired:?}"
    );
}

/// Both rules set attempts to 2: b's firing publishes nothing but holds the field, so when
/// a clears first the 2 stays (b is still active) and b restores the 3 when it clears.
#[tokio::test]
async fn two_rules_setting_one_value_keep_it_until_both_clear() {
    let (center, runner) = two_rules_on(TestCenter::sqlite().await, 2).await;
    let t0 = Instant::now();
    let fired = run(&runner, t0, &[(0, 0.4, 1.0), (10, 0.4, 1.0)]).await;
    assert_eq!(fired, [("a-cut".into(), Some(2)), ("b-cut".into(), None)]);
    let (_, detail) = newest(&center, "rule-fire").await;
    assert_eq!(detail["rule"], "b-cut");
    assert_eq!(detail["changes"][0]["before"], 2, "a held field: {detail}");
    let a_back = run(&runner, t0, &[(20, 0.0, 1.0), (40, 0.0, 1.0)]).await;
    assert_eq!(a_back, [("a-cut".into(), None)], "b still holds the 2");
    assert_eq!(latest(&center).await.0, 2);
    let b_back = run(&runner, t0, &[(50, 0.0, 0.1), (70, 0.0, 0.1)]).await;
    assert_eq!(b_back, [("b-cut".into(), Some(3))]);
    assert_eq!(latest(&center).await.0, 3, "the value before both rules");
}

/// A revert that hands a value over writes its `rule-revert` and `rule-handoff` records in
/// one transaction: when the hand-over cannot be written (the database refuses it: a
/// trigger the test adds), neither is, the rule stays active, and the next observation
/// after the database accepts it again carries the revert out whole.
#[tokio::test]
async fn a_revert_and_its_hand_over_are_written_together() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("center.db").display());
    let (center, runner) = two_rules_on(TestCenter::on(&url, None).await, 1).await;
    let t0 = Instant::now();
    run(&runner, t0, &[(0, 0.4, 1.0), (10, 0.4, 1.0)]).await;
    let db = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query(
        "CREATE TRIGGER no_handoff BEFORE INSERT ON center_audit
         WHEN NEW.action = 'rule-handoff'
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
    )
    .execute(&db)
    .await
    .unwrap();
    run(&runner, t0, &[(20, 0.0, 1.0)]).await;
    let refused = runner.observe("web", &both(0.0, 1.0), at(t0, 40)).await;
    assert!(refused.is_err(), "{refused:?}");
    let reverts = audit(&center)
        .await
        .into_iter()
        .filter(|r| r["action"] == "rule-revert")
        .count();
    assert_eq!(reverts, 0, "no revert record without its hand-over");
    sqlx::query("DROP TRIGGER no_handoff")
        .execute(&db)
        .await
        .unwrap();
    let a_back = run(&runner, t0, &[(41, 0.0, 1.0)]).await;
    assert_eq!(a_back, [("a-cut".into(), None)]);
    let (record, detail) = newest(&center, "rule-handoff").await;
    assert_eq!(record["actor"], "rule:b-cut");
    assert_eq!(detail["changes"][0]["before"], 3, "{detail}");
}
