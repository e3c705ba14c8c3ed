//! The rules of each service, run against observations: firings and reverts become versions.
//!
//! The decisions are [`stormguard::rules::RuleEngine`]'s, a pure function of what the
//! collectors observed and the instant they give; this module only carries them out, so
//! that a rule's change is like any person's: a version written through the one publish
//! path (validated, linted, audited, compare-and-set on the latest version, pushed to the
//! watchers), whose author is `rule:<name>` and whose audit record holds the values that
//! fired it. A publish that loses the compare-and-set to someone else's is tried again on
//! the new latest version (a few times), so a rule never overwrites an edit it did not see.
//!
//! A dry-run rule publishes nothing: each firing or revert it would have made is an audit
//! record with action `rule-dry-run`. A firing that cannot be published (the service has no
//! policy yet, the endpoint is missing, the result would not validate) is recorded as
//! `rule-failed` and taken back in the engine, which tries again at the next observation.
//!
//! **What a rule changed is kept in the store, not in memory.** The `rule-fire` record holds
//! the endpoint and each field changed with its value before and after; a revert reads the
//! rule's newest record ([`state`]), restores those fields only, to their values before, and
//! keeps a field someone changed since ([`stormguard::rules::revert`]). So a restarted
//! center (a new runner over the same store) picks up where the old one stopped: at its
//! first observation of a service, and whenever that service's rules are edited, it sets
//! each rule's phase from its newest record ([`RuleEngine::restore`]), and a rule that fired
//! before the restart reverts when its condition clears (`min_hold` counted from the
//! firing).
//!
//! **Edits and deletions** of a fired rule go through the rule routes, which take the same
//! turn as an observation ([`Center::rule_turn`]): an edit that changes what the rule
//! changes (another endpoint, other actions, dry run on or off) first reverts the rule's
//! change — a version by `rule:<name>` whose `rule-revert` record says who edited it — and
//! the edited rule starts idle; an edit of thresholds or durations only leaves it fired.
//! Deleting a fired rule reverts its change the same way, then deletes it. If the revert
//! cannot be published the edit is refused (409), so a change is never stranded. If the
//! revert is published but the edit's own write then fails, the runner reads the rule's
//! phase back from the store at its next observation ([`Center::edit_reverts`]).
//!
//! **Replicas.** The turn is per process: it orders one replica's runner and rule routes,
//! not two replicas'. Across replicas each publish is still a compare-and-set on the latest
//! version, and each try reads the rule's standing again after the latest version (whose
//! record it went with), so two runners firing one rule publish it once and the loser
//! writes nothing; but an edit on one replica may land between another replica's decision
//! and its publish (the rule then acts on its rule as it read it; the next observation
//! reads the edit), and its revert is not seen by the other replica's engine until that
//! rule's stored row changes.
//!
//! **Two rules on one field** unwind in either order: a revert that finds its field set over
//! by another rule still active hands that rule its value before (a `rule-handoff` record by
//! the other rule), and the last revert restores the value from before the first firing.
//! A rule that sets the value another active rule set already publishes nothing but holds
//! the field ([`stormguard::rules::apply_among`]), so it is handed the value before too.

mod publish;
pub(crate) mod state;

use std::collections::HashMap;
use std::time::Instant;

use serde_json::{Value, json};
use stormguard::rules::{Decision, Observations, Rule, RuleEngine, Verdict};

use crate::error::ApiError;
use crate::server::Center;
use crate::store::{RuleRow, StoreError};

/// What became of one rule's firing or revert at one observation.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleEvent {
    /// The rule.
    pub rule: String,
    /// What the engine decided ([`Verdict::Fire`] or [`Verdict::Revert`]).
    pub verdict: Verdict,
    /// The version published, if one was (none for a dry run, a failure, or nothing to do).
    pub version: Option<u64>,
    /// The audit action written: `rule-fire`, `rule-revert`, `rule-dry-run`, `rule-failed`
    /// (`rule-fire` with no record and no version when the rule's last record says it had
    /// fired already, as another replica's runner may have done).
    pub action: &'static str,
    /// The audit detail (JSON: the rule, the observed values, the fields changed).
    pub detail: String,
}

/// Runs every service's stored rules against the observations the collectors hand it.
///
/// ```no_run
/// # async fn run(center: stormguard_center::Center) -> Result<(), stormguard_center::StoreError> {
/// use std::time::Instant;
/// use stormguard::rules::{Observations, Series};
/// use stormguard_center::RuleRunner;
///
/// let runner = RuleRunner::new(center, 6);
/// let mut seen = Observations::new();
/// seen.set_endpoint("GET /img/*", Series::ErrorRatioCode(504), 0.4);
/// for event in runner.observe("web", &seen, Instant::now()).await? {
///     println!("{} {:?} -> {:?}", event.rule, event.verdict, event.version);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct RuleRunner {
    center: Center,
    max_changes_per_hour: u32,
    services: tokio::sync::Mutex<HashMap<String, ServiceRules>>,
}

#[derive(Debug)]
struct ServiceRules {
    engine: RuleEngine,
    cap: Option<u32>,
    /// Each stored rule's name and when it was last written, and the center's count of
    /// reverts made by the rule routes ([`Center::edit_reverts`]), as of the last
    /// observation: when either changes (or at the first observation) the rules' phases
    /// are read back from the store.
    restored: Option<(u64, Vec<(String, i64)>)>,
}

impl ServiceRules {
    fn new(max_changes_per_hour: u32) -> Self {
        ServiceRules {
            engine: RuleEngine::new(Vec::new(), max_changes_per_hour),
            cap: None,
            restored: None,
        }
    }
}

impl RuleRunner {
    /// A runner for `center`'s rules; each service makes at most `max_changes_per_hour`
    /// automatic changes in any hour unless [`RuleRunner::set_cap`] says otherwise.
    pub fn new(center: Center, max_changes_per_hour: u32) -> Self {
        RuleRunner {
            center,
            max_changes_per_hour,
            services: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Sets the hourly cap of one service.
    pub async fn set_cap(&self, service: &str, max_changes_per_hour: u32) {
        let mut services = self.services.lock().await;
        let entry = services
            .entry(service.to_owned())
            .or_insert_with(|| ServiceRules::new(max_changes_per_hour));
        entry.cap = Some(max_changes_per_hour);
    }

    /// Runs `service`'s rules (as stored now) on what was observed at `now`, and publishes
    /// or records what they decide. Returns what was done for each firing or revert.
    pub async fn observe(
        &self,
        service: &str,
        seen: &Observations,
        now: Instant,
    ) -> Result<Vec<RuleEvent>, StoreError> {
        let _turn = self.center.rule_turn().await;
        let rows = self.center.store().rules(service).await?;
        let rules = readable(service, &rows);
        let mut services = self.services.lock().await;
        let state = services
            .entry(service.to_owned())
            .or_insert_with(|| ServiceRules::new(self.max_changes_per_hour));
        let cap = state.cap.unwrap_or(self.max_changes_per_hour);
        state.engine.set_rules(rules, cap);
        let written = (
            self.center.edit_reverts(),
            rows.iter()
                .map(|r| (r.name.clone(), r.updated_ms))
                .collect::<Vec<_>>(),
        );
        if state.restored.as_ref() != Some(&written) {
            self.restore(service, &mut state.engine, now).await?;
            state.restored = Some(written);
        }
        let changes: Vec<_> = state
            .engine
            .decide(seen, now)
            .into_iter()
            .filter(|d| matches!(d.verdict, Verdict::Fire | Verdict::Revert))
            .collect();
        let mut events = Vec::new();
        for (index, decision) in changes.iter().enumerate() {
            let Some(rule) = state
                .engine
                .rules()
                .find(|r| r.name == decision.rule)
                .cloned()
            else {
                continue;
            };
            match self.carry_out(service, &rule, decision).await {
                Ok(event) => {
                    if event.action == "rule-failed" {
                        state.engine.undo(&rule.name);
                    }
                    events.push(event);
                }
                Err(error) => {
                    // The store failed: this change and the ones after it were not carried
                    // out. The engine takes them back (they are tried again at the next
                    // observation, and stop counting toward the cap).
                    for undone in &changes[index..] {
                        state.engine.undo(&undone.rule);
                    }
                    return Err(error);
                }
            }
        }
        Ok(events)
    }

    /// Sets each rule's phase from its newest record: fired (at the record's instant) or
    /// not.
    async fn restore(
        &self,
        service: &str,
        engine: &mut RuleEngine,
        now: Instant,
    ) -> Result<(), StoreError> {
        let names: Vec<String> = engine.rules().map(|r| r.name.clone()).collect();
        for name in names {
            let active = state::active(&self.center, service, &name).await?;
            engine.restore(&name, active.map(|a| a.instant(now)));
        }
        Ok(())
    }

    async fn carry_out(
        &self,
        service: &str,
        rule: &Rule,
        decision: &Decision,
    ) -> Result<RuleEvent, StoreError> {
        let firing = decision.verdict == Verdict::Fire;
        let observed: serde_json::Map<String, Value> = decision
            .observed
            .iter()
            .map(|(series, value)| (series.to_string(), json!(value)))
            .collect();
        let detail = json!({
            "rule": rule.name,
            "endpoint": rule.endpoint,
            "verdict": if firing { "fire" } else { "revert" },
            "observed": observed,
        });
        let done = if firing {
            publish::fire(&self.center, service, rule, detail).await?
        } else if rule.dry_run {
            let mut detail = detail;
            detail["changes"] = json!([]);
            let detail = detail.to_string();
            publish::audit(
                &self.center,
                service,
                &rule.name,
                "rule-dry-run",
                None,
                &detail,
            )
            .await?;
            publish::Done {
                action: "rule-dry-run",
                version: None,
                detail,
            }
        } else {
            publish::undo(&self.center, service, &rule.name, detail).await?
        };
        Ok(RuleEvent {
            rule: rule.name.clone(),
            verdict: decision.verdict,
            version: done.version,
            action: done.action,
            detail: done.detail,
        })
    }
}

/// The stored rules of `service` that read; one that does not (written by an older
/// version) is logged and left out.
fn readable(service: &str, rows: &[RuleRow]) -> Vec<Rule> {
    rows.iter()
        .filter_map(|row| match Rule::from_json(&row.rule) {
            Ok(rule) if rule.service == service => Some(rule),
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(%error, service, rule = row.name, "stormguard center: a stored rule does not read; skipped");
                None
            }
        })
        .collect()
}

/// Reverts what rule `old` of `service` changed, if it is active, before `by` deletes it
/// (`new` is `None`) or replaces it with `new` that changes something else
/// ([`Rule::acts_like`]); an edit that keeps what it changes reverts nothing. The caller
/// holds [`Center::rule_turn`]. A revert that cannot be published refuses the edit (409),
/// naming why: stored anyway, the rule's change would stay with nothing to take it back.
pub(crate) async fn revert_before_edit(
    center: &Center,
    service: &str,
    old: &Rule,
    new: Option<&Rule>,
    by: &str,
) -> Result<(), ApiError> {
    if new.is_some_and(|new| old.acts_like(new))
        || state::active(center, service, &old.name).await?.is_none()
    {
        return Ok(());
    }
    let reason = match new {
        None => format!("deleted by {by}"),
        Some(new) if new.endpoint != old.endpoint => {
            format!("edited by {by} to change endpoint {:?}", new.endpoint)
        }
        Some(new) if new.dry_run => format!("edited by {by} into a dry run"),
        Some(_) => format!("edited by {by} to take other actions"),
    };
    let detail = json!({
        "rule": old.name,
        "verdict": "revert",
        "reason": reason,
        "by": by,
    });
    let done = publish::undo(center, service, &old.name, detail).await?;
    if done.action == "rule-revert" {
        // Whether or not the edit is then written, the runner reads the rule's phase again.
        center.count_edit_revert();
    }
    if done.action == "rule-failed" {
        return Err(ApiError::Conflict(format!(
            "rule {:?} has fired and its change could not be reverted ({}); fix that, or \
             change the policy by hand, before {}",
            old.name,
            serde_json::from_str::<Value>(&done.detail)
                .ok()
                .and_then(|d| d["error"].as_str().map(str::to_owned))
                .unwrap_or_default(),
            if new.is_some() {
                "editing it"
            } else {
                "deleting it"
            },
        )));
    }
    Ok(())
}
