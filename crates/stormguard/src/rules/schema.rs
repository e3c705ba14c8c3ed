//! Rules as a file writes them, and the checks that turn them into [`Rule`]s.
//!
//! As with policy files, the raw shapes here exist only to be read and written: a rule is
//! checked field by field when it is read, and a broken one is refused with its field named
//! (`rules[0].when.all[1].exit_below`) instead of firing on the wrong number at 3 am.
//! Unknown fields are errors. The same shapes serialise back, so what the center stores and
//! returns is what was accepted.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::action::{Action, TimeoutField};
use super::condition::{Condition, Direction, Threshold};
use super::observe::Series;
use super::{MAX_ACTIONS, MAX_CHANGES_PER_HOUR, MAX_DEPTH, MAX_RULE_NAME, Rule};
use crate::duration::parse_duration;
use crate::policy::limits::{MAX_ATTEMPTS, MAX_DURATION, MAX_NAME_BYTES};
use crate::policy::{BudgetSpec, Fallback, FieldPath, PolicyError};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSet {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) max_changes_per_hour: Option<u32>,
    #[serde(default)]
    pub(super) rules: Vec<RawRule>,
}

/// A rule as the file writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    name: String,
    service: String,
    endpoint: String,
    when: RawCondition,
    #[serde(rename = "for", default, with = "crate::duration::serde_duration")]
    hold: Duration,
    #[serde(
        default,
        with = "crate::duration::serde_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    exit_for: Option<Duration>,
    #[serde(
        default,
        with = "crate::duration::serde_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    min_hold: Option<Duration>,
    #[serde(default)]
    dry_run: bool,
    actions: Vec<RawAction>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCondition {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    series: Option<SeriesName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    above: Option<RawNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    below: Option<RawNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exit_below: Option<RawNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exit_above: Option<RawNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    all: Option<Vec<RawCondition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    any: Option<Vec<RawCondition>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SeriesName {
    ErrorRatio,
    P99,
    Cpu,
    Memory,
}

/// A threshold: a number, or for `p99` a duration (`"800ms"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum RawNumber {
    Number(f64),
    Text(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum TimeoutName {
    Connect,
    PerTry,
    Overall,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "set", rename_all = "snake_case", deny_unknown_fields)]
enum RawAction {
    Attempts {
        max_attempts: u32,
    },
    Timeout {
        which: TimeoutName,
        #[serde(with = "crate::duration::serde_duration")]
        value: Duration,
    },
    Budget {
        budget: BudgetSpec,
    },
    Fallback {
        fallback: Fallback,
    },
    Breaker {
        isolated: bool,
    },
}

impl RawSet {
    /// The checked rules and the hourly cap; `at` is the file's root.
    pub(super) fn check(&self) -> Result<(u32, Vec<Rule>), PolicyError> {
        let root = FieldPath::root("");
        let cap = self
            .max_changes_per_hour
            .unwrap_or(super::DEFAULT_CHANGES_PER_HOUR);
        if !(1..=MAX_CHANGES_PER_HOUR).contains(&cap) {
            return Err(root
                .field("max_changes_per_hour")
                .invalid(format!("must be in 1..={MAX_CHANGES_PER_HOUR}, got {cap}")));
        }
        let mut rules: Vec<Rule> = Vec::with_capacity(self.rules.len());
        for (index, raw) in self.rules.iter().enumerate() {
            let at = root.field("rules").index(index);
            let rule = raw.check(&at)?;
            if rules
                .iter()
                .any(|r| r.name == rule.name && r.service == rule.service)
            {
                return Err(at.field("name").invalid(format!(
                    "{:?} names another rule of service {:?} already",
                    rule.name, rule.service
                )));
            }
            rules.push(rule);
        }
        Ok((cap, rules))
    }
}

impl RawRule {
    /// The checked rule; `at` names it in errors.
    pub(super) fn check(&self, at: &FieldPath) -> Result<Rule, PolicyError> {
        check_name(&at.field("name"), &self.name, MAX_RULE_NAME, true)?;
        check_name(&at.field("service"), &self.service, MAX_RULE_NAME, false)?;
        check_name(&at.field("endpoint"), &self.endpoint, MAX_NAME_BYTES, false)?;
        let when = self.when.check(&at.field("when"), 0)?;
        let exit_hold = self.exit_for.unwrap_or(self.hold);
        let min_hold = self.min_hold.unwrap_or(Duration::ZERO);
        for (name, value) in [
            ("for", self.hold),
            ("exit_for", exit_hold),
            ("min_hold", min_hold),
        ] {
            if value > MAX_DURATION {
                return Err(at
                    .field(name)
                    .invalid(format!("{value:?} is longer than the 1 h maximum")));
            }
        }
        let actions_at = at.field("actions");
        if self.actions.is_empty() || self.actions.len() > MAX_ACTIONS {
            return Err(actions_at.invalid(format!(
                "a rule has 1..={MAX_ACTIONS} actions, got {}",
                self.actions.len()
            )));
        }
        let mut actions: Vec<Action> = Vec::with_capacity(self.actions.len());
        for (index, raw) in self.actions.iter().enumerate() {
            let action_at = actions_at.index(index);
            let action = raw.check(&action_at)?;
            if actions.iter().any(|a| a.field() == action.field()) {
                return Err(action_at.invalid(format!(
                    "another action of this rule sets {} already",
                    action.field_name()
                )));
            }
            actions.push(action);
        }
        Ok(Rule {
            name: self.name.clone(),
            service: self.service.clone(),
            endpoint: self.endpoint.clone(),
            when,
            hold: self.hold,
            exit_hold,
            min_hold,
            dry_run: self.dry_run,
            actions,
            raw: self.clone(),
        })
    }
}

fn check_name(at: &FieldPath, name: &str, max: usize, strict: bool) -> Result<(), PolicyError> {
    if name.trim().is_empty() {
        return Err(at.invalid("must not be blank"));
    }
    if name.len() > max {
        return Err(at.invalid(format!("at most {max} bytes, got {}", name.len())));
    }
    if strict
        && !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(at.invalid("letters, digits, '-', '_' and '.' only (it is part of URLs)"));
    }
    Ok(())
}

impl RawCondition {
    fn check(&self, at: &FieldPath, depth: usize) -> Result<Condition, PolicyError> {
        if depth > MAX_DEPTH {
            return Err(at.invalid(format!("conditions nest at most {MAX_DEPTH} deep")));
        }
        let leafy = self.series.is_some()
            || self.class.is_some()
            || self.code.is_some()
            || self.above.is_some()
            || self.below.is_some()
            || self.exit_below.is_some()
            || self.exit_above.is_some();
        match (&self.all, &self.any, leafy) {
            (Some(parts), None, false) => Ok(Condition::All(check_parts(parts, &at.field("all"), depth)?)),
            (None, Some(parts), false) => Ok(Condition::Any(check_parts(parts, &at.field("any"), depth)?)),
            (None, None, true) => self.check_leaf(at),
            _ => Err(at.invalid(
                "a condition is one of: a series with its thresholds, `all = [...]`, or `any = [...]`",
            )),
        }
    }

    fn check_leaf(&self, at: &FieldPath) -> Result<Condition, PolicyError> {
        let name = self.series.ok_or_else(|| {
            at.field("series")
                .invalid("missing: error_ratio, p99, cpu or memory")
        })?;
        let series = match (name, &self.class, self.code) {
            (SeriesName::ErrorRatio, None, None) => Series::ErrorRatio,
            (SeriesName::ErrorRatio, Some(class), None) => {
                let digit = class
                    .strip_suffix("xx")
                    .and_then(|d| d.parse::<u8>().ok())
                    .filter(|d| (1..=5).contains(d))
                    .ok_or_else(|| {
                        at.field("class").invalid(format!(
                            "{class:?} is not a status class (\"4xx\", \"5xx\")"
                        ))
                    })?;
                Series::ErrorRatioClass(digit)
            }
            (SeriesName::ErrorRatio, None, Some(code)) => {
                if !(100..=599).contains(&code) {
                    return Err(at
                        .field("code")
                        .invalid(format!("{code} is not an HTTP status code (100..=599)")));
                }
                Series::ErrorRatioCode(code)
            }
            (SeriesName::ErrorRatio, Some(_), Some(_)) => {
                return Err(at.field("code").invalid("set `class` or `code`, not both"));
            }
            (_, Some(_), _) => {
                return Err(at.field("class").invalid("only error_ratio has a class"));
            }
            (_, _, Some(_)) => return Err(at.field("code").invalid("only error_ratio has a code")),
            (SeriesName::P99, None, None) => Series::P99,
            (SeriesName::Cpu, None, None) => Series::Cpu,
            (SeriesName::Memory, None, None) => Series::Memory,
        };
        let (direction, enter, exit, enter_name, exit_name) =
            match (&self.above, &self.below, &self.exit_below, &self.exit_above) {
                (Some(enter), None, exit, None) => {
                    (Direction::Above, enter, exit, "above", "exit_below")
                }
                (None, Some(enter), None, exit) => {
                    (Direction::Below, enter, exit, "below", "exit_above")
                }
                (Some(_), Some(_), _, _) => {
                    return Err(at
                        .field("below")
                        .invalid("set `above` or `below`, not both"));
                }
                (None, None, _, _) => {
                    return Err(at.invalid("a threshold is missing: set `above` or `below`"));
                }
                (Some(_), None, _, Some(_)) => {
                    return Err(at
                        .field("exit_above")
                        .invalid("goes with `below`; with `above` write `exit_below`"));
                }
                (None, Some(_), Some(_), None) | (None, Some(_), Some(_), Some(_)) => {
                    return Err(at
                        .field("exit_below")
                        .invalid("goes with `above`; with `below` write `exit_above`"));
                }
            };
        let enter = number(series, enter, &at.field(enter_name))?;
        let exit = match exit {
            Some(exit) => number(series, exit, &at.field(exit_name))?,
            None => enter,
        };
        let wrong_side = match direction {
            Direction::Above => exit > enter,
            Direction::Below => exit < enter,
        };
        if wrong_side {
            return Err(at.field(exit_name).invalid(format!(
                "{exit} is past the enter threshold {enter}: the rule would clear while it still holds"
            )));
        }
        // Every series is at least 0, and the ratios at most 1: a rule that clears only below
        // 0 (or above 1) would fire and hold its change for ever.
        let unreachable = match direction {
            Direction::Above => exit <= 0.0,
            Direction::Below => !matches!(series, Series::P99 | Series::Memory) && exit >= 1.0,
        };
        if unreachable {
            return Err(at.field(exit_name).invalid(format!(
                "no value can clear the rule at {exit}: set `{exit_name}` (the rule clears once the value is past it)"
            )));
        }
        Ok(Condition::Series(Threshold {
            series,
            direction,
            enter,
            exit,
        }))
    }
}

fn check_parts(
    parts: &[RawCondition],
    at: &FieldPath,
    depth: usize,
) -> Result<Vec<Condition>, PolicyError> {
    if parts.is_empty() {
        return Err(at.invalid("needs at least one condition"));
    }
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| part.check(&at.index(i), depth + 1))
        .collect()
}

/// A threshold as the engine compares it: a ratio, seconds for `p99`, bytes for `memory`.
fn number(series: Series, raw: &RawNumber, at: &FieldPath) -> Result<f64, PolicyError> {
    match (series, raw) {
        (Series::P99, RawNumber::Text(text)) => parse_duration(text)
            .map(|d| d.as_secs_f64())
            .map_err(|e| at.invalid(e)),
        (Series::P99, RawNumber::Number(_)) => {
            Err(at.invalid("a latency threshold is a duration such as \"800ms\""))
        }
        (_, RawNumber::Text(_)) => Err(at.invalid("must be a number")),
        (Series::Memory, RawNumber::Number(n)) => {
            if n.is_finite() && *n >= 0.0 {
                Ok(*n)
            } else {
                Err(at.invalid(format!(
                    "a memory threshold is a number of bytes >= 0, got {n}"
                )))
            }
        }
        (_, RawNumber::Number(n)) => {
            if (0.0..=1.0).contains(n) {
                Ok(*n)
            } else {
                Err(at.invalid(format!("a ratio is between 0 and 1 (10 % is 0.1), got {n}")))
            }
        }
    }
}

impl RawAction {
    fn check(&self, at: &FieldPath) -> Result<Action, PolicyError> {
        match self {
            RawAction::Attempts { max_attempts } => {
                if !(1..=MAX_ATTEMPTS).contains(max_attempts) {
                    return Err(at.field("max_attempts").invalid(format!(
                        "must be in 1..={MAX_ATTEMPTS} (1 = the first attempt only, no retries), got {max_attempts}"
                    )));
                }
                Ok(Action::Attempts(*max_attempts))
            }
            RawAction::Timeout { which, value } => {
                if value.is_zero() || *value > MAX_DURATION {
                    return Err(at
                        .field("value")
                        .invalid(format!("must be above zero and at most 1 h, got {value:?}")));
                }
                let which = match which {
                    TimeoutName::Connect => TimeoutField::Connect,
                    TimeoutName::PerTry => TimeoutField::PerTry,
                    TimeoutName::Overall => TimeoutField::Overall,
                };
                Ok(Action::Timeout(which, *value))
            }
            RawAction::Budget { budget } => {
                budget.validate(&at.field("budget"))?;
                Ok(Action::Budget(*budget))
            }
            RawAction::Fallback { fallback } => Ok(Action::Fallback(*fallback)),
            RawAction::Breaker { isolated } => Ok(Action::IsolateBreaker(*isolated)),
        }
    }
}
