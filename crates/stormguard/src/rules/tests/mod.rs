#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use super::*;

mod revert;
use crate::policy::PolicyError;

const EP: &str = "GET /img/*";

fn rules(text: &str) -> RuleSet {
    RuleSet::from_toml(text).expect("valid rules")
}

fn one_rule(hold: &str, exit_hold: &str, extra: &str) -> RuleSet {
    rules(&one_rule_text(hold, exit_hold, extra))
}

fn one_rule_text(hold: &str, exit_hold: &str, extra: &str) -> String {
    format!(
        r#"
        max_changes_per_hour = 6
        [[rules]]
        name = "cdn-504"
        service = "web"
        endpoint = "GET /img/*"
        for = "{hold}"
        exit_for = "{exit_hold}"
        when = {{ series = "error_ratio", code = 504, above = 0.10, exit_below = 0.02 }}
        actions = [{{ set = "attempts", max_attempts = 1 }}, {{ set = "fallback", fallback = "always" }}]
        {extra}
        "#
    )
}

fn seen(ratio: f64) -> Observations {
    let mut o = Observations::new();
    o.set_endpoint(EP, Series::ErrorRatioCode(504), ratio);
    o
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn error_field(err: PolicyError) -> String {
    match err {
        PolicyError::Invalid { field, .. } | PolicyError::Syntax { field, .. } => field,
        PolicyError::Read { .. } => String::new(),
    }
}

#[test]
fn the_module_example_reads() {
    let set = rules(
        r#"
        max_changes_per_hour = 6
        [[rules]]
        name = "cdn-504"
        service = "web"
        endpoint = "GET /img/*"
        for = "5s"
        exit_for = "30s"
        min_hold = "60s"
        when = { all = [
          { series = "error_ratio", code = 504, above = 0.10, exit_below = 0.02 },
          { series = "p99", above = "800ms", exit_below = "300ms" },
        ] }
        actions = [
          { set = "attempts", max_attempts = 1 },
          { set = "fallback", fallback = "always" },
          { set = "timeout", which = "overall", value = "2s" },
          { set = "budget", budget = { kind = "grpc", max_tokens = 5, token_ratio = 0.1 } },
        ]
        "#,
    );
    let rule = &set.rules[0];
    assert_eq!(
        (rule.hold, rule.exit_hold, rule.min_hold),
        (secs(5), secs(30), secs(60))
    );
    let Condition::All(parts) = &rule.when else {
        panic!("all")
    };
    assert_eq!(
        parts[1],
        Condition::Series(Threshold {
            series: Series::P99,
            direction: Direction::Above,
            enter: 0.8,
            exit: 0.3
        })
    );
    assert_eq!(rule.actions[0], Action::Attempts(1));
    // JSON: the same shape, and a rule reads back from its own JSON.
    let again = Rule::from_json(&rule.to_json()).unwrap();
    assert_eq!(&again, rule);
}

#[test]
fn bad_rules_name_their_field() {
    let cases = [
        (
            r#"when = { series = "error_ratio", above = 0.1, exit_below = 0.2 }"#,
            "rules[0].when.exit_below",
        ),
        (
            r#"when = { series = "error_ratio", above = 10 }"#,
            "rules[0].when.above",
        ),
        (
            r#"when = { series = "error_ratio", code = 99, above = 0.1 }"#,
            "rules[0].when.code",
        ),
        (
            r#"when = { series = "error_ratio", class = "6xx", above = 0.1 }"#,
            "rules[0].when.class",
        ),
        (
            r#"when = { series = "p99", above = 0.8 }"#,
            "rules[0].when.above",
        ),
        (
            r#"when = { series = "cpu", above = 0.9, exit_above = 0.5 }"#,
            "rules[0].when.exit_above",
        ),
        (
            r#"when = { series = "error_ratio", above = 0.0 }"#,
            "rules[0].when.exit_below",
        ),
        (
            r#"when = { series = "error_ratio", above = 0.1, exit_below = 0.0 }"#,
            "rules[0].when.exit_below",
        ),
        (
            r#"when = { series = "cpu", below = 0.5, exit_above = 1.0 }"#,
            "rules[0].when.exit_above",
        ),
        (r#"when = { all = [] }"#, "rules[0].when.all"),
        (
            r#"when = { any = [{ series = "cpu", above = 0.9 }, { series = "cpu" }] }"#,
            "rules[0].when.any[1]",
        ),
    ];
    for (when, field) in cases {
        let text = format!(
            "[[rules]]\nname = \"r\"\nservice = \"s\"\nendpoint = \"e\"\n{when}\nactions = [{{ set = \"attempts\", max_attempts = 1 }}]\n"
        );
        let err = RuleSet::from_toml(&text).unwrap_err();
        assert_eq!(error_field(err.clone()), field, "{when}: {err}");
    }
    let base = "[[rules]]\nname = \"r\"\nservice = \"s\"\nendpoint = \"e\"\nwhen = { series = \"cpu\", above = 0.9 }\n";
    for (actions, field) in [
        (
            r#"actions = [{ set = "attempts", max_attempts = 0 }]"#,
            "rules[0].actions[0].max_attempts",
        ),
        (
            r#"actions = [{ set = "timeout", which = "overall", value = "0s" }]"#,
            "rules[0].actions[0].value",
        ),
        (
            r#"actions = [{ set = "attempts", max_attempts = 1 }, { set = "attempts", max_attempts = 2 }]"#,
            "rules[0].actions[1]",
        ),
        ("actions = []", "rules[0].actions"),
        (
            r#"actions = [{ set = "budget", budget = { kind = "grpc", max_tokens = 0, token_ratio = 0.1 } }]"#,
            "rules[0].actions[0].budget.max_tokens",
        ),
    ] {
        let err = RuleSet::from_toml(&format!("{base}{actions}\n")).unwrap_err();
        assert!(
            error_field(err.clone()).starts_with(field),
            "{actions}: {err}"
        );
    }
    // Unknown fields and wrong types are syntax errors naming the field, with a line.
    let err = RuleSet::from_toml(&format!("{base}actions = []\nfour = \"1s\"\n")).unwrap_err();
    assert!(err.to_string().contains("four"), "{err}");
    let err =
        RuleSet::from_json(r#"{"rules":[{"name":"r","service":"s","endpoint":"e","for":"soon"}]}"#)
            .unwrap_err();
    assert_eq!(error_field(err), "rules[0].for");
    let err = RuleSet::from_toml("max_changes_per_hour = 0").unwrap_err();
    assert_eq!(error_field(err), "max_changes_per_hour");
}

#[test]
fn fires_after_for_and_reverts_after_exit_for() {
    let set = one_rule("10s", "20s", "");
    let mut engine = RuleEngine::new(set.rules, set.max_changes_per_hour);
    let t0 = Instant::now();
    let at = |s| t0 + secs(s);
    assert_eq!(engine.decide(&seen(0.0), at(0))[0].verdict, Verdict::Quiet);
    assert_eq!(
        engine.decide(&seen(0.5), at(1))[0].verdict,
        Verdict::Pending { held: secs(0) }
    );
    assert_eq!(
        engine.decide(&seen(0.5), at(6))[0].verdict,
        Verdict::Pending { held: secs(5) }
    );
    let fire = engine.decide(&seen(0.5), at(11));
    assert_eq!(fire[0].verdict, Verdict::Fire);
    assert_eq!(
        fire[0].observed,
        vec![(Series::ErrorRatioCode(504), Some(0.5))]
    );
    assert_eq!(engine.decide(&seen(0.5), at(20))[0].verdict, Verdict::Hold);
    // Cleared at 30; reverts 20 s later, not sooner.
    assert_eq!(engine.decide(&seen(0.0), at(30))[0].verdict, Verdict::Hold);
    assert_eq!(engine.decide(&seen(0.0), at(49))[0].verdict, Verdict::Hold);
    assert_eq!(
        engine.decide(&seen(0.0), at(50))[0].verdict,
        Verdict::Revert
    );
    assert_eq!(engine.decide(&seen(0.0), at(51))[0].verdict, Verdict::Quiet);
}

#[test]
fn a_condition_that_stops_holding_before_for_starts_over() {
    let set = one_rule("10s", "20s", "");
    let mut engine = RuleEngine::new(set.rules, set.max_changes_per_hour);
    let t0 = Instant::now();
    for s in 0..60 {
        // Up 9 s, down 1 s: never 10 s in a row.
        let ratio = if s % 10 == 9 { 0.0 } else { 0.5 };
        let verdict = engine.decide(&seen(ratio), t0 + secs(s))[0].verdict;
        assert_ne!(verdict, Verdict::Fire, "at {s} s");
    }
}

#[test]
fn input_flapping_around_the_threshold_does_not_flap_the_policy() {
    let set = one_rule("10s", "20s", "");
    let mut engine = RuleEngine::new(set.rules, set.max_changes_per_hour);
    let t0 = Instant::now();
    let mut changes = Vec::new();
    for s in 0..600 {
        // Between 0.09 and 0.13 around the 0.10 enter threshold, never under the 0.02 exit.
        let ratio = [0.09, 0.13, 0.11, 0.095][s as usize % 4];
        let d = engine.decide(&seen(ratio), t0 + secs(s));
        if matches!(d[0].verdict, Verdict::Fire | Verdict::Revert) {
            changes.push((s, d[0].verdict));
        }
    }
    assert!(
        changes.is_empty(),
        "a 1-in-4 dip below enter resets `for`: {changes:?}"
    );
    // Held above long enough it fires once; hovering around the enter threshold afterwards
    // (0.05..0.15, always above the exit threshold) never reverts it.
    for s in 600..620 {
        let d = engine.decide(&seen(0.2), t0 + secs(s));
        if d[0].verdict == Verdict::Fire {
            changes.push((s, d[0].verdict));
        }
    }
    for s in 620..3000 {
        let ratio = [0.05, 0.15, 0.09, 0.11][s as usize % 4];
        let d = engine.decide(&seen(ratio), t0 + secs(s));
        if matches!(d[0].verdict, Verdict::Fire | Verdict::Revert) {
            changes.push((s, d[0].verdict));
        }
    }
    assert_eq!(changes, vec![(610, Verdict::Fire)]);
    assert!(engine.is_active("cdn-504"));
}

#[test]
fn the_hourly_cap_holds_and_never_blocks_a_revert() {
    let set = one_rule("0s", "0s", "");
    let mut engine = RuleEngine::new(set.rules, 4);
    let t0 = Instant::now();
    let mut changes: Vec<Duration> = Vec::new();
    let mut capped = 0;
    for s in 0..3 * 3600 {
        // A fault that comes and goes every 30 s.
        let ratio = if (s / 30) % 2 == 0 { 0.5 } else { 0.0 };
        let verdict = engine.decide(&seen(ratio), t0 + secs(s))[0].verdict;
        match verdict {
            Verdict::Fire | Verdict::Revert => changes.push(secs(s)),
            Verdict::Capped => capped += 1,
            _ => {}
        }
    }
    assert!(capped > 0);
    for (i, &t) in changes.iter().enumerate() {
        let in_hour = changes[i..]
            .iter()
            .take_while(|&&u| u < t + secs(3600))
            .count();
        assert!(in_hour <= 4, "{in_hour} changes in the hour from {t:?}");
    }
    // Firings and reverts alternate: no firing was left without its revert.
    assert!(changes.len() >= 8 && changes.len() % 2 == 0, "{changes:?}");
}

#[test]
fn the_hourly_cap_holds_with_several_rules_firing_together() {
    // Three rules on one condition, a cap of 4: each firing keeps room for its own revert and
    // for the reverts the others still owe.
    let text: String = ["a", "b", "c"]
        .iter()
        .map(|name| {
            one_rule_text("0s", "0s", "")
                .replace("name = \"cdn-504\"", &format!("name = \"{name}\""))
                .replace("max_changes_per_hour = 6", "")
        })
        .collect();
    let mut engine = RuleEngine::new(rules(&text).rules, 4);
    let t0 = Instant::now();
    let mut changes: Vec<Duration> = Vec::new();
    for s in 0..3 * 3600 {
        let ratio = if (s / 30) % 2 == 0 { 0.5 } else { 0.0 };
        for d in engine.decide(&seen(ratio), t0 + secs(s)) {
            if matches!(d.verdict, Verdict::Fire | Verdict::Revert) {
                changes.push(secs(s));
            }
        }
    }
    for (i, &t) in changes.iter().enumerate() {
        let in_hour = changes[i..]
            .iter()
            .take_while(|&&u| u < t + secs(3600))
            .count();
        assert!(in_hour <= 4, "{in_hour} changes in the hour from {t:?}");
    }
    assert!(changes.len() >= 8, "{changes:?}");
}

#[test]
fn a_dry_run_decides_the_same_and_counts_nothing() {
    let set = one_rule("0s", "0s", "dry_run = true");
    let mut engine = RuleEngine::new(set.rules, 2);
    let t0 = Instant::now();
    let mut fired = 0;
    for s in 0..100 {
        let ratio = if s % 2 == 0 { 0.5 } else { 0.0 };
        let d = &engine.decide(&seen(ratio), t0 + secs(s))[0];
        assert!(d.dry_run);
        assert_ne!(d.verdict, Verdict::Capped);
        fired += usize::from(d.verdict == Verdict::Fire);
    }
    assert_eq!(
        fired, 50,
        "a cap of 2 would allow 1 firing if dry runs counted"
    );
}

#[test]
fn undo_takes_a_firing_back() {
    let set = one_rule("0s", "20s", "");
    let mut engine = RuleEngine::new(set.rules, 2);
    let t0 = Instant::now();
    assert_eq!(engine.decide(&seen(0.5), t0)[0].verdict, Verdict::Fire);
    engine.undo("cdn-504");
    assert!(!engine.is_active("cdn-504"));
    // The undone firing does not count: the cap of 2 leaves room to fire again.
    assert_eq!(
        engine.decide(&seen(0.5), t0 + secs(1))[0].verdict,
        Verdict::Fire
    );
}

#[test]
fn missing_series_neither_fire_nor_revert() {
    let set = one_rule("0s", "0s", "");
    let mut engine = RuleEngine::new(set.rules, 6);
    let t0 = Instant::now();
    assert_eq!(
        engine.decide(&Observations::new(), t0)[0].verdict,
        Verdict::Quiet
    );
    assert_eq!(
        engine.decide(&seen(0.5), t0 + secs(1))[0].verdict,
        Verdict::Fire
    );
    assert_eq!(
        engine.decide(&Observations::new(), t0 + secs(2))[0].verdict,
        Verdict::Hold
    );
}

#[test]
fn a_rule_changed_while_fired_stays_fired_and_reverts_by_its_new_condition() {
    let set = one_rule("0s", "0s", "");
    let mut engine = RuleEngine::new(set.rules, 6);
    let t0 = Instant::now();
    assert_eq!(engine.decide(&seen(0.5), t0)[0].verdict, Verdict::Fire);
    let changed = one_rule("0s", "0s", "min_hold = \"1m\"");
    engine.set_rules(changed.rules.clone(), 6);
    assert!(engine.is_active("cdn-504"));
    assert_eq!(
        engine.decide(&seen(0.0), t0 + secs(30))[0].verdict,
        Verdict::Hold
    );
    assert_eq!(
        engine.decide(&seen(0.0), t0 + secs(60))[0].verdict,
        Verdict::Revert
    );
    // A pending rule that changes starts over.
    let slow = one_rule("10s", "0s", "");
    engine.set_rules(slow.rules, 6);
    assert!(matches!(
        engine.decide(&seen(0.5), t0 + secs(61))[0].verdict,
        Verdict::Pending { .. }
    ));
    engine.set_rules(one_rule("20s", "0s", "").rules, 6);
    assert_eq!(
        engine.decide(&seen(0.5), t0 + secs(75))[0].verdict,
        Verdict::Pending { held: secs(0) }
    );
}

mod props {
    use proptest::prelude::*;

    use super::super::RuleSet;

    proptest! {
        /// Any text gives rules or an error, never a panic; an error message stays short.
        #[test]
        fn any_text_is_rules_or_a_bounded_error(text in "\\PC{0,400}") {
            for result in [RuleSet::from_toml(&text), RuleSet::from_json(&text)] {
                if let Err(e) = result {
                    prop_assert!(e.to_string().len() < 2048);
                }
            }
        }

        /// A good file with one character changed reads or fails with a bounded error.
        #[test]
        fn a_damaged_rule_file_is_rules_or_a_bounded_error(at in 0usize..400, c in any::<char>()) {
            let good = super::one_rule_text("10s", "20s", "");
            let mut chars: Vec<char> = good.chars().collect();
            let i = at % chars.len();
            chars[i] = c;
            let text: String = chars.into_iter().collect();
            if let Err(e) = RuleSet::from_toml(&text) {
                prop_assert!(e.to_string().len() < 2048);
            }
        }
    }
}

#[test]
fn an_edit_that_changes_what_a_fired_rule_does_starts_it_idle() {
    let base = one_rule("0s", "0s", "").rules;
    let t0 = Instant::now();
    type Edit = (&'static str, fn(&mut Rule));
    let edits: [Edit; 3] = [
        ("dry run on", |r| r.dry_run = true),
        ("another endpoint", |r| r.endpoint = "GET /other".to_owned()),
        ("other actions", |r| r.actions = vec![Action::Attempts(2)]),
    ];
    for (what, edit) in edits {
        let mut engine = RuleEngine::new(base.clone(), 6);
        assert_eq!(engine.decide(&seen(0.5), t0)[0].verdict, Verdict::Fire);
        let mut changed = base.clone();
        edit(&mut changed[0]);
        assert!(!changed[0].acts_like(&base[0]), "{what}");
        engine.set_rules(changed, 6);
        assert!(!engine.is_active("cdn-504"), "{what}: idle after the edit");
    }
}

#[test]
fn a_restored_rule_reverts_and_owes_its_revert_to_the_cap() {
    let set = one_rule("0s", "20s", "min_hold = \"1m\"");
    let t0 = Instant::now();
    let mut engine = RuleEngine::new(set.rules.clone(), 2);
    // Fired 50 s before a restart: min_hold counts from then, not from the restart.
    engine.restore("cdn-504", Some(t0));
    assert!(engine.is_active("cdn-504"));
    let at = |s: u64| t0 + secs(50 + s);
    assert_eq!(engine.decide(&seen(0.0), at(0))[0].verdict, Verdict::Hold);
    assert_eq!(
        engine.decide(&seen(0.0), at(20))[0].verdict,
        Verdict::Revert
    );
    // Restoring as not fired makes a fired rule idle.
    let mut engine = RuleEngine::new(set.rules, 2);
    engine.restore("cdn-504", Some(t0));
    engine.restore("cdn-504", None);
    assert!(!engine.is_active("cdn-504"));
    // A cap of 2 leaves room for one firing and its revert: the restored rule's revert is
    // owed, so no other firing fits.
    let two = rules(&format!(
        "{}\n{}",
        one_rule_text("0s", "0s", "").replace("= 6", "= 2"),
        one_rule_text("0s", "0s", "")
            .replace("max_changes_per_hour = 6", "")
            .replace("cdn-504", "other")
    ));
    let mut engine = RuleEngine::new(two.rules, 2);
    engine.restore("cdn-504", Some(t0));
    let decisions = engine.decide(&seen(0.5), t0);
    assert_eq!(decisions[0].verdict, Verdict::Hold);
    assert_eq!(decisions[1].verdict, Verdict::Capped);
}
