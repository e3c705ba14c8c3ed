//! A service's rules, each written out in words (when it fires, what it does, how it
//! clears), with its state and its firing history: the `rule-fire`, `rule-revert`,
//! `rule-handoff`, `rule-dry-run` and `rule-failed` audit records the rule runner writes,
//! with the values that fired it.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use serde_json::Value;
use stormguard::duration::format_duration;
use stormguard::rules::{Action, Condition, Direction, Rule, Series};

use super::page::{Failure, Tab, html_response, layout, when};
use super::session::Signed;
use crate::api::admin::AuditRecord;
use crate::api::check_name;
use crate::rules::state;
use crate::server::Center;

/// How many rule audit records the page reads (all rules of the service together).
const FIRINGS_PAGE: u32 = 200;

pub(crate) async fn rules(
    State(center): State<Center>,
    signed: Signed,
    Path(service): Path<String>,
) -> Result<Response, Failure> {
    check_name("service", &service)?;
    let rows = center.store().rules(&service).await?;
    let records: Vec<AuditRecord> = center
        .store()
        .audit_actions(&service, "rule-", FIRINGS_PAGE)
        .await?
        .into_iter()
        .map(AuditRecord::from)
        .collect();
    // Whether each rule is active, read as the rule runner reads it (its newest fire,
    // revert or hand-over record, however many records came after it).
    let mut active = Vec::with_capacity(rows.len());
    for row in &rows {
        active.push(state::active(&center, &service, &row.name).await?.is_some());
    }
    let body = html! {
        h1 { "Rules" }
        @if rows.is_empty() {
            p.muted { "This service has no rules. Add one with " code { "stormguard policy rules put" } " or " code { "PUT /v1/services/" (service) "/rules/{name}" } "." }
        }
        @for (row, active) in rows.iter().zip(&active) {
            @match Rule::from_json(&row.rule) {
                Ok(rule) => (rule_card(&rule, *active, &records)),
                Err(error) => section.card {
                    h2 { (row.name) }
                    p.notice.bad { "This stored rule does not read: " (error) }
                },
            }
        }
    };
    Ok(html_response(
        StatusCode::OK,
        layout(
            &format!("{service} rules"),
            Some(&signed),
            Some((&service, Tab::Rules)),
            body,
        ),
    ))
}

/// One rule's records, newest first: its own fire/revert/dry-run/failed records (not the
/// `rule-put` and `rule-delete` records of edits to it).
fn firings<'a>(rule: &str, records: &'a [AuditRecord]) -> Vec<&'a AuditRecord> {
    let actor = format!("rule:{rule}");
    records
        .iter()
        .filter(|r| r.actor == actor && kind(&r.action).is_some())
        .collect()
}

/// What a record says, and its badge's class.
fn kind(action: &str) -> Option<(&'static str, &'static str)> {
    match action {
        "rule-fire" => Some(("fired", "bad")),
        "rule-revert" => Some(("reverted", "good")),
        "rule-handoff" => Some(("took over a revert", "wait")),
        "rule-dry-run" => Some(("dry run", "wait")),
        "rule-failed" => Some(("failed", "bad")),
        _ => None,
    }
}

fn rule_card(rule: &Rule, active: bool, records: &[AuditRecord]) -> Markup {
    let firings = firings(&rule.name, records);
    html! {
        section.card.rule data-rule=(rule.name) {
            h2 {
                (rule.name) " "
                @if active { span.badge.bad.state { "active" } } @else { span.badge.good.state { "idle" } }
                @if rule.dry_run { " " span.badge.wait { "dry run" } }
            }
            table.settings {
                tr { th { "Endpoint" } td { code { (rule.endpoint) } } }
                tr { th { "Fires when" } td { (condition(&rule.when, true)) " for " (format_duration(rule.hold)) } }
                tr { th { "Then sets" } td { (actions(&rule.actions)) } }
                tr { th { "Reverts when" } td { (condition(&rule.when, false)) " for " (format_duration(rule.exit_hold))
                    @if !rule.min_hold.is_zero() { ", and at least " (format_duration(rule.min_hold)) " after firing" } } }
            }
            h3 { "Firing history" }
            @if firings.is_empty() {
                p.muted { "It has not fired." }
            } @else {
                table.firings {
                    thead { tr { th { "When" } th { "What" } th { "Version" } th { "Observed" } th { "Changes" } } }
                    tbody {
                        @for record in &firings { (firing_row(record)) }
                    }
                }
            }
        }
    }
}

fn firing_row(record: &AuditRecord) -> Markup {
    let (what, class) = kind(&record.action).unwrap_or(("?", "muted"));
    let detail: Value = serde_json::from_str(&record.detail).unwrap_or(Value::Null);
    let verdict = detail["verdict"].as_str().unwrap_or("");
    html! {
        tr.firing data-action=(record.action) {
            td { (when(record.at_ms)) }
            td {
                span class={"badge " (class)} { (what) }
                @if record.action == "rule-dry-run" { " " span.muted { "would " (verdict) } }
            }
            td { @match record.version { Some(v) => { "v" (v) }, None => span.muted { "—" } } }
            td {
                @if let Some(observed) = detail["observed"].as_object() {
                    @for (series, value) in observed {
                        div { code { (series) } " = " (number(value)) }
                    }
                }
            }
            td {
                @if let Some(changes) = detail["changes"].as_array() {
                    @for change in changes { div { (change_text(change)) } }
                }
                @if let Some(reason) = detail["reason"].as_str() { div.muted { (reason) } }
                @if let Some(error) = detail["error"].as_str() { div.bad { (error) } }
            }
        }
    }
}

/// A JSON number as people write it (`0.4`, `3`), anything else as JSON.
fn number(value: &Value) -> String {
    match value.as_f64() {
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) => format!("{}", (v * 10_000.0).round() / 10_000.0),
        None => value.to_string(),
    }
}

/// `retry.max_attempts: 3 → 1` from a firing's change, or what a revert restored, kept or
/// left to another rule.
fn change_text(change: &Value) -> Markup {
    let field = change["field"].as_str().unwrap_or("?");
    let show = |v: &Value| {
        if v.is_null() {
            "(unset)".to_owned()
        } else {
            v.to_string()
        }
    };
    html! {
        code { (field) } ": "
        @if change.get("after").is_some() {
            (show(&change["before"])) " → " (show(&change["after"]))
        } @else if change.get("restored").is_some() {
            (show(&change["from"])) " → " (show(&change["restored"])) " " span.muted { "(restored)" }
        } @else if change.get("kept").is_some() {
            (show(&change["kept"])) " " span.muted { "(kept: changed since the firing)" }
        } @else if let Some(to) = change["handed_to"].as_str() {
            span.muted { "left to rule " (to) ", which restores " (show(&change["before"])) }
        }
    }
}

/// A condition in words: by its enter thresholds (`holds`) or its exit thresholds.
fn condition(when: &Condition, holds: bool) -> String {
    match when {
        Condition::Series(t) => {
            let (sign, value) = match (t.direction, holds) {
                (Direction::Above, true) => (">", t.enter),
                (Direction::Above, false) => ("<", t.exit),
                (Direction::Below, true) => ("<", t.enter),
                (Direction::Below, false) => (">", t.exit),
            };
            format!("{} {sign} {}", t.series, threshold(t.series, value))
        }
        // `all` clears when any part clears, `any` when every part does.
        Condition::All(parts) => join(parts, holds, if holds { " and " } else { " or " }),
        Condition::Any(parts) => join(parts, holds, if holds { " or " } else { " and " }),
    }
}

fn join(parts: &[Condition], holds: bool, with: &str) -> String {
    let texts: Vec<String> = parts.iter().map(|p| condition(p, holds)).collect();
    if texts.len() == 1 {
        texts.concat()
    } else {
        format!("({})", texts.join(with))
    }
}

/// A threshold in its series' unit: `10%` for ratios, `800ms` for P99, bytes for memory.
fn threshold(series: Series, value: f64) -> String {
    match series {
        Series::P99 => format_duration(std::time::Duration::from_secs_f64(value.max(0.0))),
        Series::Memory => format!("{value:.0} bytes"),
        _ => format!("{}%", (value * 1000.0).round() / 10.0),
    }
}

fn actions(actions: &[Action]) -> Markup {
    html! {
        @for (i, action) in actions.iter().enumerate() {
            @if i > 0 { ", " }
            code { (action.field().join(".")) " = " (action_value(action)) }
        }
    }
}

/// The value an action sets, as the policy file writes it (strings without their quotes).
fn action_value(action: &Action) -> String {
    match action.value() {
        serde_json::Value::String(text) => text,
        other => other.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use stormguard::rules::Threshold;

    #[test]
    fn conditions_read_as_words_both_ways() {
        let when = Condition::All(vec![
            Condition::Series(Threshold {
                series: Series::ErrorRatioCode(504),
                direction: Direction::Above,
                enter: 0.1,
                exit: 0.02,
            }),
            Condition::Series(Threshold {
                series: Series::P99,
                direction: Direction::Above,
                enter: 0.8,
                exit: 0.3,
            }),
        ]);
        assert_eq!(
            condition(&when, true),
            "(error_ratio{code=504} > 10% and p99_seconds > 800ms)"
        );
        assert_eq!(
            condition(&when, false),
            "(error_ratio{code=504} < 2% or p99_seconds < 300ms)"
        );
    }

    #[test]
    fn numbers_are_written_short() {
        assert_eq!(number(&serde_json::json!(0.4)), "0.4");
        assert_eq!(number(&serde_json::json!(3.0)), "3");
        assert_eq!(number(&serde_json::json!(0.123_456)), "0.1235");
    }
}
