//! Field-by-field differences between two versions of a policy file.
//!
//! A review, a CI gate or a policy center's history all start from the same question: what
//! changed, endpoint by endpoint and field by field, in the names the file uses. A
//! [`PolicyDiff`] answers it structurally, from the validated policies (so reordering,
//! comments, defaults written out or left implicit, and `"1000ms"` against `"1s"` are not
//! changes); judging the changes is the reviewer's job
//! ([`lint::review`](crate::lint::review)).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::{EndpointPolicy, PolicyFile};

/// What changed between two policy files, endpoint by endpoint, in endpoint-name order.
///
/// ```
/// use stormguard::policy::PolicyFile;
/// use stormguard::policy::diff::{EndpointChange, PolicyDiff};
///
/// let old = PolicyFile::from_toml("[endpoints.a]\ntimeouts = { overall = \"2s\" }")?;
/// let new = PolicyFile::from_toml("[endpoints.a]\ntimeouts = { overall = \"5000ms\" }")?;
/// let diff = PolicyDiff::between(&old, &new);
/// assert_eq!(diff.endpoints[0].change, EndpointChange::Changed);
/// let field = &diff.endpoints[0].fields[0];
/// assert_eq!(field.field, "timeouts.overall");
/// assert_eq!((field.old.as_deref(), field.new.as_deref()), (Some("2s"), Some("5s")));
/// # Ok::<(), stormguard::policy::PolicyError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PolicyDiff {
    /// The endpoints that differ.
    pub endpoints: Vec<EndpointDiff>,
}

/// How one endpoint differs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EndpointDiff {
    /// The endpoint's name.
    pub endpoint: String,
    /// Added, removed or changed.
    pub change: EndpointChange,
    /// Every field that differs (for an added or removed endpoint, every field it has).
    pub fields: Vec<FieldChange>,
}

/// Whether an endpoint is new, gone, or changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EndpointChange {
    /// Only in the new file.
    Added,
    /// Only in the old file.
    Removed,
    /// In both, with different fields.
    Changed,
}

/// One field's old and new value, as the file writes them (`"2s"`, `3`, `"full"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldChange {
    /// The field path within the endpoint: `timeouts.overall`, `windows[0].start`.
    pub field: String,
    /// The old value; `None` when the field was absent.
    pub old: Option<String>,
    /// The new value; `None` when the field is gone.
    pub new: Option<String>,
}

impl PolicyDiff {
    /// The differences from `old` to `new`.
    pub fn between(old: &PolicyFile, new: &PolicyFile) -> Self {
        let mut names: Vec<&String> = old
            .endpoints()
            .keys()
            .chain(new.endpoints().keys())
            .collect();
        names.sort();
        names.dedup();
        let endpoints = names
            .into_iter()
            .filter_map(|name| {
                let (before, after) = (old.endpoint(name), new.endpoint(name));
                let change = match (before, after) {
                    (None, Some(_)) => EndpointChange::Added,
                    (Some(_), None) => EndpointChange::Removed,
                    (Some(a), Some(b)) if a != b => EndpointChange::Changed,
                    _ => return None,
                };
                let fields = fields(before, after);
                Some(EndpointDiff {
                    endpoint: name.clone(),
                    change,
                    fields,
                })
            })
            .collect();
        PolicyDiff { endpoints }
    }

    /// Whether the two files hold the same policies.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }
}

/// The differing fields of two versions of one endpoint's policy.
fn fields(old: Option<&EndpointPolicy>, new: Option<&EndpointPolicy>) -> Vec<FieldChange> {
    let flat = |policy: Option<&EndpointPolicy>| {
        let mut out = BTreeMap::new();
        if let Some(value) = policy.and_then(|p| serde_json::to_value(p).ok()) {
            flatten("", &value, &mut out);
        }
        out
    };
    let (before, after) = (flat(old), flat(new));
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| FieldChange {
            field: k.clone(),
            old: before.get(k).cloned(),
            new: after.get(k).cloned(),
        })
        .collect()
}

/// `value`'s leaves by dotted path: objects and lists of objects are walked, other lists
/// and scalars are leaves written as the file would (strings unquoted).
fn flatten(at: &str, value: &Value, out: &mut BTreeMap<String, String>) {
    let join = |key: &str| {
        if at.is_empty() {
            key.to_owned()
        } else {
            format!("{at}.{key}")
        }
    };
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                flatten(&join(key), v, out);
            }
        }
        Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
            for (index, v) in items.iter().enumerate() {
                flatten(&format!("{at}[{index}]"), v, out);
            }
        }
        Value::String(s) => {
            out.insert(at.to_owned(), s.clone());
        }
        other => {
            out.insert(at.to_owned(), other.to_string());
        }
    }
}
