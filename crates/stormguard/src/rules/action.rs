//! What a firing rule changes in its endpoint's policy, and how a revert undoes exactly that.
//!
//! An action sets fields of the endpoint's policy *as the policy file writes them*
//! (`retry.max_attempts`, `timeouts.overall`, `budget`, `fallback`), and the result is read
//! and validated by the same code as a file, so a rule cannot make a policy that a person
//! could not publish. Each firing records, per field, the value before and the value after;
//! a revert puts back the value before only where the field still holds the rule's value.
//! Where someone changed that same field since the firing, their value is newer than both
//! and is kept (the revert reports it as kept); fields the rule never touched are never
//! touched by the revert, so any other edit made in between survives.
//!
//! **Two rules on one field.** Rule A sets `retry.max_attempts` 4 → 2, then rule B sets it
//! 2 → 1. If B clears first it puts back 2 (A's value) and A later puts back 4: the field
//! unwinds in order. If A clears first, the field holds B's 1, not A's 2, so A must not
//! restore 4 under B; but A's "before" must not be lost either, or B would later restore
//! A's 2 and an automatic value would stay forever. So A *hands over* its value before to
//! the rule that overrode it (B's own value before is A's value after):
//! B now remembers 4, and restores it when it clears. The last revert restores the person's
//! value; a person's edit in between is still newer than every rule's and is kept. Handing
//! over is the same test as keeping a person's edit (the field no longer holds the rule's
//! value), with one question more: did another rule that is still active take it over?
//!
//! **Two rules setting one value.** If B sets the very value A set (4 → 1, then 1), B
//! changes nothing but *holds* the field ([`apply_among`]): A clearing first hands B its 4
//! instead of restoring it under B, and B clearing first puts nothing back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::duration::format_duration;
use crate::policy::{BudgetSpec, EndpointPolicy, Fallback, FieldPath, PolicyError, PolicyFile};
use std::time::Duration;

/// Which timeout an action sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeoutField {
    /// `timeouts.connect`.
    Connect,
    /// `timeouts.per_try`.
    PerTry,
    /// `timeouts.overall`.
    Overall,
}

/// One change a firing rule makes to its endpoint's policy.
///
/// [`Action::IsolateBreaker`] holds the endpoint's breaker open (it needs a breaker);
/// [`Fallback::Always`] answers every call from the fallback without calling the downstream
/// whether or not there is a breaker.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Sets `retry.max_attempts` (1 = no retries: the first attempt only).
    Attempts(u32),
    /// Sets one timeout (tighten or loosen).
    Timeout(TimeoutField, Duration),
    /// Replaces the retry budget (tighten or loosen).
    Budget(BudgetSpec),
    /// Sets when the stack answers from its fallback (`always` switches the endpoint over).
    Fallback(Fallback),
    /// Holds the breaker open (`true`) or lets it work again (`false`): `breaker.isolated`.
    IsolateBreaker(bool),
}

/// One action for each field an action sets: a [`FieldEdit`] read back finds its field's
/// keys by [`Action::field`] of these, so the names are written once (a test over every
/// variant fails if one is missing here).
const ONE_PER_FIELD: [Action; 7] = [
    Action::Attempts(1),
    Action::Timeout(TimeoutField::Connect, Duration::ZERO),
    Action::Timeout(TimeoutField::PerTry, Duration::ZERO),
    Action::Timeout(TimeoutField::Overall, Duration::ZERO),
    Action::Budget(BudgetSpec::AwsStandard),
    Action::Fallback(Fallback::Always),
    Action::IsolateBreaker(true),
];

impl Action {
    /// The field it sets, as the policy file names it from the endpoint's table.
    pub fn field(&self) -> &'static [&'static str] {
        match self {
            Action::Attempts(_) => &["retry", "max_attempts"],
            Action::Timeout(which, _) => match which {
                TimeoutField::Connect => &["timeouts", "connect"],
                TimeoutField::PerTry => &["timeouts", "per_try"],
                TimeoutField::Overall => &["timeouts", "overall"],
            },
            Action::Budget(_) => &["budget"],
            Action::Fallback(_) => &["fallback"],
            Action::IsolateBreaker(_) => &["breaker", "isolated"],
        }
    }

    /// The value it sets, as the policy file writes it: `1`, `"2s"`, `"always"`, `true`.
    pub fn value(&self) -> Value {
        match self {
            Action::Attempts(n) => Value::from(*n),
            Action::Timeout(_, d) => Value::from(format_duration(*d)),
            Action::Budget(b) => serde_json::to_value(b).unwrap_or(Value::Null),
            Action::Fallback(f) => serde_json::to_value(f).unwrap_or(Value::Null),
            Action::IsolateBreaker(held) => Value::from(*held),
        }
    }

    /// The field's name in messages: `retry.max_attempts`.
    pub fn field_name(&self) -> String {
        self.field().join(".")
    }
}

/// One field a firing changed: its value before and after, as the file writes them
/// (`None`: the policy left it out).
///
/// As JSON (what the center's `rule-fire` audit record keeps, so that a restarted center
/// can still revert): `{"field": "retry.max_attempts", "before": 3, "after": 1}`; reading
/// it back refuses a field no action sets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawFieldEdit")]
pub struct FieldEdit {
    /// The field, from the endpoint's table: `retry.max_attempts`.
    pub field: String,
    #[serde(skip)]
    keys: &'static [&'static str],
    /// Its value in the version the rule fired on.
    pub before: Option<Value>,
    /// Its value in the version the firing published.
    pub after: Option<Value>,
}

impl FieldEdit {
    /// Whether the firing changed the field (`false`: it holds a value another active rule
    /// set, see [`apply_among`]).
    pub fn changed(&self) -> bool {
        self.before != self.after
    }
}

#[derive(Deserialize)]
struct RawFieldEdit {
    field: String,
    #[serde(default)]
    before: Option<Value>,
    #[serde(default)]
    after: Option<Value>,
}

impl TryFrom<RawFieldEdit> for FieldEdit {
    type Error = String;

    fn try_from(raw: RawFieldEdit) -> Result<Self, String> {
        let keys = ONE_PER_FIELD
            .iter()
            .map(Action::field)
            .find(|keys| keys.join(".") == raw.field)
            .ok_or_else(|| format!("field: no rule action sets {:?}", raw.field))?;
        Ok(FieldEdit {
            field: raw.field,
            keys,
            before: raw.before,
            after: raw.after,
        })
    }
}

/// What one active rule changed: its endpoint and the fields it set there. A revert undoes
/// it; it is what the center keeps of each firing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Firing {
    /// The rule's name.
    pub rule: String,
    /// The endpoint whose policy it changed.
    pub endpoint: String,
    /// The fields it changed, with their values before and after.
    pub edits: Vec<FieldEdit>,
}

/// What a revert did with one field.
#[derive(Clone, Debug, PartialEq)]
pub enum RevertedField {
    /// Put back to its value before the firing.
    Restored(FieldEdit),
    /// Left as it is: someone set it to another value after the firing, and that newer
    /// value wins over the one before the firing.
    Kept {
        /// The edit the firing made.
        edit: FieldEdit,
        /// The value found now.
        now: Option<Value>,
    },
    /// Left as another rule, still active, set it over this rule's value; that rule now
    /// holds this rule's value before, and restores it when it reverts.
    HandedOver {
        /// The edit the firing made.
        edit: FieldEdit,
        /// The rule that holds it now.
        to: String,
    },
}

/// What [`revert`] decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Reverted {
    /// The policy with the fields restored; `None` when nothing is left to restore (the
    /// endpoint is gone, or every field was changed since).
    pub file: Option<PolicyFile>,
    /// What was done with each field of the firing.
    pub fields: Vec<RevertedField>,
    /// The other rules' firings that took over a value before, as they now stand (only
    /// those that changed).
    pub handed: Vec<Firing>,
}

/// `file` with `actions` applied to `endpoint`, and the fields that changed (an action that
/// sets a field to the value it already has changes nothing). The new policy is validated;
/// an error names the field under `endpoints."…"`.
pub fn apply(
    file: &PolicyFile,
    endpoint: &str,
    actions: &[Action],
) -> Result<(PolicyFile, Vec<FieldEdit>), PolicyError> {
    let at = FieldPath::endpoint(endpoint);
    let policy = endpoint_policy(file, endpoint, &at)?;
    if policy.breaker().is_none() && actions.contains(&Action::IsolateBreaker(true)) {
        return Err(at
            .field("breaker")
            .field("isolated")
            .invalid("the endpoint has no breaker for the rule to hold open"));
    }
    let fields: Vec<_> = actions
        .iter()
        .map(|a| (a.field(), Some(a.value())))
        .collect();
    let new = policy.with_file_values(&fields, &at)?;
    let edits = actions
        .iter()
        .filter_map(|a| {
            let keys = a.field();
            let (before, after) = (policy.file_value(keys), new.file_value(keys));
            (before != after).then(|| FieldEdit {
                field: a.field_name(),
                keys,
                before,
                after,
            })
        })
        .collect();
    Ok((replace(file, endpoint, new), edits))
}

/// [`apply`] among the other rules that are active now (`active`): a field the actions set
/// to the value another active rule set there already is recorded as *held* (an edit whose
/// values before and after are that value, [`FieldEdit::changed`] false), where [`apply`]
/// records nothing.
///
/// Why: rule A sets `retry.max_attempts` 4 → 1, then rule B sets it to 1 too. Had B no
/// edit, A clearing while B still holds would restore 4 and B's protection would be gone
/// with no rule left to say so. With B's held edit, A's revert finds a rule still holding
/// its value and hands it its value before instead ([`revert`]); B restores 4 when it
/// clears. If B clears first its held edit puts nothing back, and A restores 4 later. A
/// field a *person* already set to the rule's value is not held: the rule changed nothing
/// there and has nothing to restore.
pub fn apply_among(
    file: &PolicyFile,
    endpoint: &str,
    actions: &[Action],
    active: &[Firing],
) -> Result<(PolicyFile, Vec<FieldEdit>), PolicyError> {
    let (new, mut edits) = apply(file, endpoint, actions)?;
    let policy = endpoint_policy(file, endpoint, &FieldPath::endpoint(endpoint))?;
    for action in actions {
        let keys = action.field();
        if edits.iter().any(|e| e.keys == keys) {
            continue;
        }
        let now = policy.file_value(keys);
        let held = active.iter().any(|other| {
            other.endpoint == endpoint
                && other.edits.iter().any(|e| e.keys == keys && e.after == now)
        });
        if held {
            edits.push(FieldEdit {
                field: action.field_name(),
                keys,
                before: now.clone(),
                after: now,
            });
        }
    }
    Ok((new, edits))
}

/// `file` with `firing` undone where each field still holds the value the firing set, and
/// what was done with each field.
///
/// A field that holds another value was set since by someone else. If one of `active` (the
/// other rules that are active now, oldest firing first) overrode this rule's value on the
/// same endpoint (its value before is this rule's value after), it takes over this rule's
/// value before ([`RevertedField::HandedOver`]), and [`Reverted::handed`] holds its firing
/// as it now stands; otherwise the newer value is a person's and is kept.
pub fn revert(
    file: &PolicyFile,
    firing: &Firing,
    active: &[Firing],
) -> Result<Reverted, PolicyError> {
    let at = FieldPath::endpoint(&firing.endpoint);
    let mut handed: Vec<Firing> = Vec::new();
    let mut restore = Vec::new();
    let mut fields = Vec::new();
    let policy = file.endpoint(&firing.endpoint);
    for edit in &firing.edits {
        let now = policy.and_then(|p| p.file_value(edit.keys));
        if policy.is_some() && now == edit.after {
            // Another active rule holding this very value ([`apply_among`]) takes over the
            // value before; a held edit of this rule's own has nothing to put back.
            let holder = edit.changed()
                && active.iter().any(|other| {
                    other.rule != firing.rule
                        && other.endpoint == firing.endpoint
                        && other
                            .edits
                            .iter()
                            .any(|e| e.field == edit.field && !e.changed() && e.after == now)
                });
            if holder && let Some(to) = hand_over(firing, edit, active, &mut handed) {
                fields.push(RevertedField::HandedOver {
                    edit: edit.clone(),
                    to,
                });
                continue;
            }
            if edit.changed() {
                restore.push((edit.keys, edit.before.clone()));
            }
            fields.push(RevertedField::Restored(edit.clone()));
            continue;
        }
        match hand_over(firing, edit, active, &mut handed) {
            Some(to) => fields.push(RevertedField::HandedOver {
                edit: edit.clone(),
                to,
            }),
            None => fields.push(RevertedField::Kept {
                edit: edit.clone(),
                now,
            }),
        }
    }
    let file = match policy {
        Some(policy) if !restore.is_empty() => {
            let new = policy.with_file_values(&restore, &at)?;
            Some(replace(file, &firing.endpoint, new))
        }
        _ => None,
    };
    Ok(Reverted {
        file,
        fields,
        handed,
    })
}

/// Hands `edit`'s value before to the oldest of `active` that overrode it (its value before
/// on that field is `edit`'s after, or already `edit`'s before: handing over twice changes
/// nothing), recording the new firing in `handed`; the name of the rule that took it.
fn hand_over(
    firing: &Firing,
    edit: &FieldEdit,
    active: &[Firing],
    handed: &mut Vec<Firing>,
) -> Option<String> {
    let heir = active.iter().find(|other| {
        other.rule != firing.rule
            && other.endpoint == firing.endpoint
            && other.edits.iter().any(|e| {
                e.field == edit.field && (e.before == edit.after || e.before == edit.before)
            })
    })?;
    let index = match handed.iter().position(|h| h.rule == heir.rule) {
        Some(index) => index,
        None => {
            handed.push(heir.clone());
            handed.len() - 1
        }
    };
    for e in &mut handed[index].edits {
        if e.field == edit.field {
            e.before.clone_from(&edit.before);
        }
    }
    if handed[index] == *heir {
        // It held that value already.
        handed.remove(index);
    }
    Some(heir.rule.clone())
}

fn endpoint_policy<'a>(
    file: &'a PolicyFile,
    endpoint: &str,
    at: &FieldPath,
) -> Result<&'a EndpointPolicy, PolicyError> {
    file.endpoint(endpoint)
        .ok_or_else(|| at.invalid("the policy has no such endpoint for the rule to change"))
}

fn replace(file: &PolicyFile, endpoint: &str, policy: EndpointPolicy) -> PolicyFile {
    let mut endpoints: BTreeMap<String, EndpointPolicy> = file.endpoints().clone();
    endpoints.insert(endpoint.to_owned(), policy);
    PolicyFile::new(endpoints)
}
