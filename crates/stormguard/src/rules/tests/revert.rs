//! Applying a rule's actions to a policy and reverting them: human edits kept, two rules on
//! one field unwound in either order.

use std::time::Duration;

use super::{EP, error_field, rules, secs};
use crate::policy::{BudgetSpec, Fallback, PolicyError, PolicyFile};
use crate::rules::*;

fn firing(rule: &str, edits: Vec<FieldEdit>) -> Firing {
    Firing {
        rule: rule.to_owned(),
        endpoint: EP.to_owned(),
        edits,
    }
}

const POLICY: &str = r#"
[endpoints."GET /img/*"]
idempotency = "idempotent"
retry = { max_attempts = 3 }
timeouts = { per_try = "300ms", overall = "1s" }
"#;

#[test]
fn apply_then_revert_restores_the_old_values() {
    let file = PolicyFile::from_toml(POLICY).unwrap();
    let actions = [Action::Attempts(1), Action::Fallback(Fallback::Always)];
    let (fired, edits) = apply(&file, EP, &actions).unwrap();
    let policy = fired.endpoint(EP).unwrap();
    assert_eq!(policy.retry().max_attempts(), 1);
    assert_eq!(policy.fallback(), Fallback::Always);
    assert_eq!(edits.len(), 2);
    let Reverted {
        file: back,
        fields: report,
        ..
    } = revert(&fired, &firing("cdn-504", edits), &[]).unwrap();
    assert_eq!(back.unwrap(), file);
    assert!(
        report
            .iter()
            .all(|r| matches!(r, RevertedField::Restored(_)))
    );
}

#[test]
fn a_revert_keeps_human_edits_made_in_between() {
    let file = PolicyFile::from_toml(POLICY).unwrap();
    let actions = [Action::Attempts(1), Action::Fallback(Fallback::Always)];
    let (fired, edits) = apply(&file, EP, &actions).unwrap();
    // Someone loosens the overall timeout (another field) and sets attempts to 2 (the same
    // field) while the rule is active.
    let human = PolicyFile::from_toml(
        &fired
            .to_toml()
            .replace("overall = \"1s\"", "overall = \"3s\"")
            .replace("max_attempts = 1", "max_attempts = 2"),
    )
    .unwrap();
    assert_eq!(human.endpoint(EP).unwrap().overall_timeout(), Some(secs(3)));
    let Reverted {
        file: back,
        fields: report,
        ..
    } = revert(&human, &firing("cdn-504", edits), &[]).unwrap();
    let back = back.unwrap();
    let policy = back.endpoint(EP).unwrap();
    assert_eq!(
        policy.overall_timeout(),
        Some(secs(3)),
        "the other field's edit stays"
    );
    assert_eq!(
        policy.retry().max_attempts(),
        2,
        "the same field's newer value stays"
    );
    assert_eq!(
        policy.fallback(),
        Fallback::OnGiveUp,
        "the untouched rule field is restored"
    );
    assert!(
        matches!(&report[0], RevertedField::Kept { edit, .. } if edit.field == "retry.max_attempts")
    );
    assert!(matches!(&report[1], RevertedField::Restored(edit) if edit.field == "fallback"));
}

#[test]
fn apply_and_revert_keep_an_endpoints_windows() {
    let text = format!(
        "{POLICY}[[endpoints.\"GET /img/*\".windows]]\nstart = \"03:00\"\nend = \"04:00\"\ntime_zone = \"UTC\"\noverrides = {{ timeouts = {{ overall = \"5s\" }} }}\n"
    );
    let file = PolicyFile::from_toml(&text).unwrap();
    let (fired, edits) = apply(&file, EP, &[Action::Attempts(1)]).unwrap();
    let again = PolicyFile::from_toml(&fired.to_toml()).unwrap();
    assert_eq!(
        again, fired,
        "the fired policy reads back, windows included"
    );
    assert!(fired.to_toml().contains("03:00"));
    let back = revert(&fired, &firing("cdn-504", edits), &[]).unwrap().file;
    assert_eq!(back.unwrap(), file);
}

#[test]
fn a_rule_holds_the_breaker_open_and_its_revert_lets_go() {
    let set = rules(
        r#"
        [[rules]]
        name = "cdn-down"
        service = "web"
        endpoint = "GET /img/*"
        when = { series = "error_ratio", code = 504, above = 0.5, exit_below = 0.02 }
        actions = [{ set = "breaker", isolated = true }]
        "#,
    );
    assert_eq!(set.rules[0].actions, vec![Action::IsolateBreaker(true)]);

    let with_breaker = format!("{POLICY}breaker = {{ count = 20 }}\n");
    let file = PolicyFile::from_toml(&with_breaker).unwrap();
    let (fired, edits) = apply(&file, EP, &set.rules[0].actions).unwrap();
    assert!(fired.endpoint(EP).unwrap().breaker_isolated());
    assert_eq!(edits.len(), 1);
    assert_eq!(edits[0].field, "breaker.isolated");
    assert_eq!(edits[0].before, None);
    let back = revert(&fired, &firing("cdn-504", edits), &[]).unwrap().file;
    assert_eq!(back.unwrap(), file, "the revert lets the breaker go");

    // Without a breaker there is nothing to hold open: refused, naming the field.
    let bare = PolicyFile::from_toml(POLICY).unwrap();
    match apply(&bare, EP, &set.rules[0].actions) {
        Err(PolicyError::Invalid { field, rule, .. }) => {
            assert_eq!(field, "endpoints.\"GET /img/*\".breaker.isolated");
            assert!(rule.contains("no breaker"), "{rule}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Rule `a` sets attempts 4 -> 2, then rule `b` sets 2 -> 1: the policies after each.
fn two_rules_on_one_field() -> (PolicyFile, Firing, PolicyFile, Firing, PolicyFile) {
    let original =
        PolicyFile::from_toml(&POLICY.replace("max_attempts = 3", "max_attempts = 4")).unwrap();
    let (after_a, edits_a) = apply(&original, EP, &[Action::Attempts(2)]).unwrap();
    let (after_b, edits_b) = apply(&after_a, EP, &[Action::Attempts(1)]).unwrap();
    (
        original,
        firing("a", edits_a),
        after_a,
        firing("b", edits_b),
        after_b,
    )
}

fn attempts(file: &PolicyFile) -> u32 {
    file.endpoint(EP).unwrap().retry().max_attempts()
}

#[test]
fn two_rules_on_one_field_unwind_in_order_when_the_last_clears_first() {
    let (original, a, after_a, b, after_b) = two_rules_on_one_field();
    let by_b = revert(&after_b, &b, std::slice::from_ref(&a)).unwrap();
    let back_to_a = by_b.file.unwrap();
    assert_eq!(back_to_a, after_a, "b puts back a's value");
    assert!(by_b.handed.is_empty());
    let by_a = revert(&back_to_a, &a, &[]).unwrap();
    assert_eq!(attempts(by_a.file.as_ref().unwrap()), 4);
    assert_eq!(by_a.file.unwrap(), original);
}

#[test]
fn two_rules_on_one_field_hand_over_when_the_first_clears_first() {
    let (original, a, _, b, after_b) = two_rules_on_one_field();
    let by_a = revert(&after_b, &a, std::slice::from_ref(&b)).unwrap();
    assert_eq!(by_a.file, None, "b's value stays while b is active");
    assert!(
        matches!(&by_a.fields[0], RevertedField::HandedOver { to, .. } if to == "b"),
        "{:?}",
        by_a.fields
    );
    let b_now = by_a.handed.into_iter().next().unwrap();
    assert_eq!(
        b_now.edits[0].before,
        Some(4.into()),
        "b now holds a's before"
    );
    // Handing over again (a revert tried twice) changes nothing more.
    let again = revert(&after_b, &a, std::slice::from_ref(&b_now)).unwrap();
    assert!(again.handed.is_empty());
    let by_b = revert(&after_b, &b_now, &[]).unwrap();
    assert_eq!(by_b.file.unwrap(), original, "the last revert restores 4");
}

#[test]
fn a_person_s_value_set_between_two_rules_is_not_handed_over() {
    let (_, a, after_a, _, _) = two_rules_on_one_field();
    // A person sets 3 over a's 2, then b sets 1 over the person's 3.
    let human = PolicyFile::from_toml(
        &after_a
            .to_toml()
            .replace("max_attempts = 2", "max_attempts = 3"),
    )
    .unwrap();
    let (after_b, edits_b) = apply(&human, EP, &[Action::Attempts(1)]).unwrap();
    let b = firing("b", edits_b);
    let by_a = revert(&after_b, &a, std::slice::from_ref(&b)).unwrap();
    assert!(matches!(&by_a.fields[0], RevertedField::Kept { .. }));
    assert!(by_a.handed.is_empty());
    let by_b = revert(&after_b, &b, &[]).unwrap();
    assert_eq!(
        attempts(&by_b.file.unwrap()),
        3,
        "the person's value comes back"
    );
}

#[test]
fn a_firing_reads_back_from_json_and_an_unknown_field_is_refused() {
    let with_breaker = format!("{POLICY}breaker = {{ count = 20 }}\n");
    let file = PolicyFile::from_toml(&with_breaker).unwrap();
    let actions = [
        Action::Attempts(1),
        Action::Timeout(TimeoutField::Connect, secs(1)),
        Action::Timeout(TimeoutField::PerTry, secs(1)),
        Action::Timeout(TimeoutField::Overall, secs(2)),
        Action::Budget(BudgetSpec::AwsStandard),
        Action::Fallback(Fallback::Always),
        Action::IsolateBreaker(true),
    ];
    // Every variant (and every timeout) is here: a new one fails to compile until it is
    // added, and then this test checks that its field reads back.
    for action in &actions {
        match action {
            Action::Attempts(_)
            | Action::Budget(_)
            | Action::Fallback(_)
            | Action::IsolateBreaker(_)
            | Action::Timeout(
                TimeoutField::Connect | TimeoutField::PerTry | TimeoutField::Overall,
                _,
            ) => {}
        }
    }
    let (_, edits) = apply(&file, EP, &actions).unwrap();
    assert_eq!(edits.len(), actions.len(), "{edits:?}");
    let fired = firing("cdn-504", edits);
    let text = serde_json::to_string(&fired).unwrap();
    assert_eq!(serde_json::from_str::<Firing>(&text).unwrap(), fired);
    let bad = text.replace("retry.max_attempts", "retry.nope");
    let err = serde_json::from_str::<Firing>(&bad).unwrap_err();
    assert!(err.to_string().contains("retry.nope"), "{err}");
}

#[test]
fn an_action_that_breaks_the_policy_is_refused_with_the_field() {
    let file = PolicyFile::from_toml(POLICY).unwrap();
    // per_try 300ms is longer than an overall timeout of 100ms.
    let err = apply(
        &file,
        EP,
        &[Action::Timeout(
            TimeoutField::Overall,
            Duration::from_millis(100),
        )],
    )
    .unwrap_err();
    assert!(error_field(err).starts_with(r#"endpoints."GET /img/*".timeouts"#));
    let err = apply(&file, "GET /nope", &[Action::Attempts(1)]).unwrap_err();
    assert_eq!(error_field(err), r#"endpoints."GET /nope""#);
}

#[test]
fn two_rules_setting_one_value_hand_it_over_in_either_order() {
    let file = PolicyFile::from_toml(POLICY).unwrap();
    let (after_a, edits_a) = apply(&file, EP, &[Action::Attempts(1)]).unwrap();
    let a = firing("a", edits_a);
    // B sets the 1 that A set: a held edit (and no new version to publish).
    let (after_b, edits_b) = apply_among(
        &after_a,
        EP,
        &[Action::Attempts(1)],
        std::slice::from_ref(&a),
    )
    .unwrap();
    assert_eq!(after_b, after_a);
    assert_eq!(edits_b.len(), 1);
    assert!(!edits_b[0].changed());
    let b = firing("b", edits_b);
    // A clears first: B keeps its 1 and takes over A's 3.
    let by_a = revert(&after_b, &a, std::slice::from_ref(&b)).unwrap();
    assert!(by_a.file.is_none(), "B still holds attempts at 1");
    assert!(
        matches!(&by_a.fields[0], RevertedField::HandedOver { to, .. } if to == "b"),
        "{:?}",
        by_a.fields
    );
    let b_now = &by_a.handed[0];
    assert_eq!(b_now.edits[0].before, Some(3.into()));
    let by_b = revert(&after_b, b_now, &[]).unwrap();
    assert_eq!(attempts(&by_b.file.unwrap()), 3);
    // B clears first: its held edit puts nothing back; A restores 3 later.
    let by_b = revert(&after_b, &b, std::slice::from_ref(&a)).unwrap();
    assert!(by_b.file.is_none() && by_b.handed.is_empty());
    let by_a = revert(&after_b, &a, &[]).unwrap();
    assert_eq!(attempts(&by_a.file.unwrap()), 3);
    // A person's value equal to the rule's is not held: nothing recorded.
    let (_, edits) = apply_among(&after_a, EP, &[Action::Attempts(1)], &[]).unwrap();
    assert!(edits.is_empty());
}
