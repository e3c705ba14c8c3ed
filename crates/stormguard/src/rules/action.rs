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

use std::collections::BTreeMap;

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
#[derive(Clone, Debug, PartialEq)]
pub struct FieldEdit {
    /// The field, from the endpoint's table: `retry.max_attempts`.
    pub field: String,
    keys: &'static [&'static str],
    /// Its value in the version the rule fired on.
    pub before: Option<Value>,
    /// Its value in the version the firing published.
    pub after: Option<Value>,
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

/// `file` with the `edits` of a firing undone on `endpoint` where the field still holds the
/// value the firing set, and what was done with each field. `Ok(None)` when there is
/// nothing left to undo (the endpoint is gone, or every field was changed since).
pub fn revert(
    file: &PolicyFile,
    endpoint: &str,
    edits: &[FieldEdit],
) -> Result<(Option<PolicyFile>, Vec<RevertedField>), PolicyError> {
    let at = FieldPath::endpoint(endpoint);
    let Some(policy) = file.endpoint(endpoint) else {
        let kept = edits
            .iter()
            .map(|edit| RevertedField::Kept {
                edit: edit.clone(),
                now: None,
            })
            .collect();
        return Ok((None, kept));
    };
    let mut restore = Vec::new();
    let mut report = Vec::new();
    for edit in edits {
        let now = policy.file_value(edit.keys);
        if now == edit.after {
            restore.push((edit.keys, edit.before.clone()));
            report.push(RevertedField::Restored(edit.clone()));
        } else {
            report.push(RevertedField::Kept {
                edit: edit.clone(),
                now,
            });
        }
    }
    if restore.is_empty() {
        return Ok((None, report));
    }
    let new = policy.with_file_values(&restore, &at)?;
    Ok((Some(replace(file, endpoint, new)), report))
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
