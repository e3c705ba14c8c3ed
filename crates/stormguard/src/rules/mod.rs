//! Metric-driven rules: when a downstream's numbers say so, change its policy, and change it
//! back when they recover.
//!
//! The seeds' CDN outage healed without anyone touching anything: a rule saw the image
//! service's 504s, cut its retries from 3 to 0 and switched it to a backup source within
//! 30 s. Written as code such a rule hides in a deployment; written as data it is reviewed,
//! stored and audited like the policies it changes. A [`Rule`] names a service and one of its
//! downstream endpoints (the policy file's endpoint key), a [`Condition`] over named series
//! ([`Series`]: error ratios overall, by status class or by code, P99 latency, instance CPU
//! and memory) that must hold for a while (`for`), and the [`Action`]s to take on the
//! endpoint's policy.
//!
//! ```toml
//! max_changes_per_hour = 6        # per service; fire + revert count as two
//!
//! [[rules]]
//! name = "cdn-504"
//! service = "web"
//! endpoint = "GET /img/*"
//! for = "5s"                      # the condition holds this long before the rule fires
//! exit_for = "30s"                # and has cleared this long before it reverts
//! min_hold = "60s"                # never reverts sooner than this after firing
//! dry_run = false                 # true: record what it would do, change nothing
//! when = { all = [
//!   { series = "error_ratio", code = 504, above = 0.10, exit_below = 0.02 },
//!   { series = "p99", above = "800ms", exit_below = "300ms" },
//! ] }
//! actions = [
//!   { set = "attempts", max_attempts = 1 },       # the first attempt only: no retries
//!   { set = "fallback", fallback = "on_give_up" }, # the backup answers what fails
//! ]
//! ```
//!
//! A rule's condition clears only if traffic still reaches the endpoint: with `fallback =
//! "always"` or `breaker = { isolated = true }` nothing is sent, its series stop, and the
//! rule can never revert by itself (one attempt with `on_give_up` keeps the downstream
//! visible, as the self-heal demo does).
//!
//! Thresholds: ratios (`error_ratio`, `cpu`) are fractions 0..=1, `p99` a duration, `memory`
//! bytes. Other actions: `{ set = "timeout", which = "overall", value = "2s" }` (`connect`,
//! `per_try`, `overall`), `{ set = "budget", budget = { kind = "grpc", max_tokens = 5,
//! token_ratio = 0.1 } }` (the budget replaced whole), `{ set = "breaker", isolated = true }`
//! (holds the endpoint's breaker open: every call refused without reaching the downstream,
//! and answered by the fallback where one is set; the endpoint needs a `breaker`). The file
//! is read by [`RuleSet::from_toml`] and [`RuleSet::from_json`] (the same shape); every error
//! names its field.
//!
//! What to do at each instant is decided by [`RuleEngine`], a pure state machine over
//! observations and an instant given by the caller; applying an action to a policy and
//! undoing it is [`apply`] and [`revert`]. Publishing is the policy center's business.
//!
//! **Edits and deletions.** Editing a fired rule so that it changes something else (another
//! endpoint, other actions) or nothing (dry run on) would strand its change: nothing would
//! ever take it back. So such an edit, and deleting a fired rule, first reverts what the
//! rule changed, and the edited rule starts idle; an edit that keeps what the rule changes
//! ([`Rule::acts_like`]: only thresholds or durations differ) leaves it fired, and it reverts
//! by its new exit condition.

mod action;
mod condition;
mod engine;
mod observe;
mod schema;
#[cfg(test)]
mod tests;

use std::time::Duration;

use serde::de::DeserializeOwned;

pub use action::{
    Action, FieldEdit, Firing, Reverted, RevertedField, TimeoutField, apply, apply_among, revert,
};
pub use condition::{Condition, Direction, Threshold};
pub use engine::{Decision, RuleEngine, Verdict};
pub use observe::{Observations, Series};

use crate::policy::PolicyError;
use crate::policy::text::Format;
use schema::{RawRule, RawSet};

/// The hourly cap on automatic changes per service when a rule set names none.
pub const DEFAULT_CHANGES_PER_HOUR: u32 = 6;
/// The largest hourly cap: a change a minute is a control loop, not a rule.
pub const MAX_CHANGES_PER_HOUR: u32 = 60;
/// The most actions one rule takes.
pub const MAX_ACTIONS: usize = 8;
/// How deep all/any may nest.
pub const MAX_DEPTH: usize = 4;
/// The longest rule or service name, in bytes.
pub const MAX_RULE_NAME: usize = 128;

/// One rule, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Its name, unique within its service: the author of what it publishes is `rule:<name>`.
    pub name: String,
    /// The service whose policy it changes.
    pub service: String,
    /// The downstream endpoint (the policy file's endpoint key) whose policy it changes and
    /// whose series it reads.
    pub endpoint: String,
    /// When it holds and when it clears.
    pub when: Condition,
    /// How long the condition holds before the rule fires (`for`).
    pub hold: Duration,
    /// How long the condition stays cleared before the rule reverts (`exit_for`; `for` when
    /// not written).
    pub exit_hold: Duration,
    /// The least time between firing and reverting (`min_hold`; none when not written).
    pub min_hold: Duration,
    /// Record what it would do, change nothing.
    pub dry_run: bool,
    /// What it sets on the endpoint's policy.
    pub actions: Vec<Action>,
    raw: RawRule,
}

impl Rule {
    /// Reads and checks one rule written as JSON (the center's API form); an error names the
    /// field.
    pub fn from_json(text: &str) -> Result<Rule, PolicyError> {
        let raw: RawRule = parse(text, Format::Json)?;
        raw.check(&crate::policy::FieldPath::root(""))
    }

    /// Whether `other` changes the same thing the same way: the same service, endpoint,
    /// actions, and dry run. An edit that keeps this (a new threshold, a longer `for`)
    /// leaves a fired rule fired; one that does not first reverts what the rule changed
    /// (see [`RuleEngine::set_rules`]).
    pub fn acts_like(&self, other: &Rule) -> bool {
        self.service == other.service
            && self.endpoint == other.endpoint
            && self.actions == other.actions
            && self.dry_run == other.dry_run
    }

    /// The rule as JSON, in the shape [`Rule::from_json`] reads back.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.raw).unwrap_or_default()
    }
}

/// A file of rules and the hourly cap on the automatic changes they make per service.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleSet {
    /// At most this many automatic changes (firings and reverts) per service in any hour.
    pub max_changes_per_hour: u32,
    /// The rules, in the file's order.
    pub rules: Vec<Rule>,
}

impl RuleSet {
    /// Reads and checks a TOML rule file; an error names the line and column (syntax) or the
    /// field (`rules[0].when.above`).
    pub fn from_toml(text: &str) -> Result<RuleSet, PolicyError> {
        Self::read(text, Format::Toml)
    }

    /// Reads and checks a JSON rule file (the same shape as TOML).
    pub fn from_json(text: &str) -> Result<RuleSet, PolicyError> {
        Self::read(text, Format::Json)
    }

    fn read(text: &str, format: Format) -> Result<RuleSet, PolicyError> {
        let raw: RawSet = if text.trim().is_empty() {
            RawSet::default()
        } else {
            parse(text, format)?
        };
        let (max_changes_per_hour, rules) = raw.check()?;
        Ok(RuleSet {
            max_changes_per_hour,
            rules,
        })
    }
}

/// `text` read as `T`, an error placed at its line and column and named by its field path
/// as serde writes it (`rules[0].when.above`).
fn parse<T: DeserializeOwned>(text: &str, format: Format) -> Result<T, PolicyError> {
    crate::policy::text::deserialize(text, format, |path| {
        let field = path.to_string();
        if field == "." { String::new() } else { field }
    })
}
