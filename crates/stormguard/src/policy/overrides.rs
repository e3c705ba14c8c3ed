//! A window as a file writes it, and how its `overrides` meet the endpoint's own fields.
//!
//! The overrides are merged into the endpoint *as the file writes it* and the result is read
//! by the same code as the endpoint itself ([`RawEndpoint`]), so an unknown field, a wrong
//! type or a broken rule inside a window is refused exactly as it would be anywhere else,
//! named by its path under `windows[i].overrides`. Written back, a window's overrides are the
//! fields where its policy differs from the endpoint's, so a policy reads back equal.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::file::RawEndpoint;
use super::window::{PolicyWindow, Schedule};
use super::{EndpointPolicy, FieldPath, PolicyError};

/// The one section a window replaces whole instead of merging: a budget's `kind` decides
/// which fields it has, so a merged budget of two kinds would hold fields of both.
const REPLACED_WHOLE: &str = "budget";

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWindow {
    start: String,
    end: String,
    time_zone: String,
    #[serde(default)]
    overrides: Map<String, Value>,
}

impl RawWindow {
    /// The window, with its policy read from `base` (the endpoint as written, without its
    /// windows) merged with the overrides; `at` names the window in errors.
    pub(super) fn into_window(
        self,
        base: &Map<String, Value>,
        at: &FieldPath,
    ) -> Result<PolicyWindow, PolicyError> {
        let schedule = Schedule::parse(&self.start, &self.end, &self.time_zone, at)?;
        let overrides_at = at.field("overrides");
        if self.overrides.contains_key("windows") {
            return Err(overrides_at
                .field("windows")
                .invalid("a window's policy holds no windows of its own"));
        }
        let mut merged = base.clone();
        merge(&mut merged, self.overrides, true);
        let raw: RawEndpoint =
            serde_path_to_error::deserialize(Value::Object(merged)).map_err(|e| {
                let path = e.path().to_string();
                let field = match path.as_str() {
                    "" | "." => overrides_at.clone(),
                    path => overrides_at.field(path),
                };
                field.invalid(e.into_inner())
            })?;
        let policy = raw.into_policy(&overrides_at)?;
        Ok(PolicyWindow { schedule, policy })
    }

    /// The file's form of `window`, its overrides taken against `base` (the endpoint as
    /// written, without its windows).
    pub(super) fn from_window(window: PolicyWindow, base: &Map<String, Value>) -> Self {
        let schedule = &window.schedule;
        RawWindow {
            start: schedule.start(),
            end: schedule.end(),
            time_zone: schedule.time_zone().to_owned(),
            overrides: diff(base, &object(&RawEndpoint::from(window.policy))),
        }
    }
}

/// The overrides that turn `base` into `window`'s policy: `None` when no overrides can (the
/// window removes a field that `base` sets).
pub(super) fn overrides_of(
    base: &EndpointPolicy,
    window: &EndpointPolicy,
) -> Option<Map<String, Value>> {
    let mut base = base.clone();
    base.windows.clear();
    let base = object(&RawEndpoint::from(base));
    let window = object(&RawEndpoint::from(window.clone()));
    let changes = diff(&base, &window);
    let mut merged = base;
    merge(&mut merged, changes.clone(), true);
    (merged == window).then_some(changes)
}

/// `raw` as a JSON object.
pub(super) fn object(raw: &RawEndpoint) -> Map<String, Value> {
    match serde_json::to_value(raw) {
        Ok(Value::Object(map)) => map,
        // A struct of strings, numbers, booleans and tables always serialises to an object.
        _ => Map::new(),
    }
}

/// Merges `overrides` into `base`: tables field by field, anything else replaced.
fn merge(base: &mut Map<String, Value>, overrides: Map<String, Value>, top: bool) {
    for (key, value) in overrides {
        match (base.get_mut(&key), value) {
            (Some(Value::Object(inner)), Value::Object(value))
                if !(top && key == REPLACED_WHOLE) =>
            {
                merge(inner, value, false);
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// The fields of `window` that differ from `base`'s, as overrides.
fn diff(base: &Map<String, Value>, window: &Map<String, Value>) -> Map<String, Value> {
    diff_at(base, window, true)
}

fn diff_at(
    base: &Map<String, Value>,
    window: &Map<String, Value>,
    top: bool,
) -> Map<String, Value> {
    let mut changes = Map::new();
    for (key, value) in window {
        match (base.get(key), value) {
            (Some(old), value) if old == value => {}
            (Some(Value::Object(old)), Value::Object(value)) if !(top && key == REPLACED_WHOLE) => {
                changes.insert(key.clone(), Value::Object(diff_at(old, value, false)));
            }
            (_, value) => {
                changes.insert(key.clone(), value.clone());
            }
        }
    }
    changes
}

/// One field of an endpoint's policy as the file writes it: the keys from the endpoint's table
/// down (`["retry", "max_attempts"]`).
pub(crate) type FieldKeys = [&'static str];

impl EndpointPolicy {
    /// The value of one field as the file writes it (`"2s"`, `3`, `"always"`), `None` when the
    /// policy leaves it out. Windows keep their own overrides and are not looked into.
    pub(crate) fn file_value(&self, keys: &FieldKeys) -> Option<Value> {
        let object = object(&RawEndpoint::from(self.clone()));
        let (last, parents) = keys.split_last()?;
        let mut table = &object;
        for key in parents {
            table = table.get(*key)?.as_object()?;
        }
        table.get(*last).cloned()
    }

    /// This policy with fields set (or, for `None`, removed) as the file writes them, read and
    /// validated by the same code as a file; `at` names the endpoint in errors. A window's
    /// overrides stay as they are, so a window that sets one of these fields keeps its own
    /// value during the window.
    pub(crate) fn with_file_values(
        &self,
        fields: &[(&FieldKeys, Option<Value>)],
        at: &FieldPath,
    ) -> Result<EndpointPolicy, PolicyError> {
        let mut raw = RawEndpoint::from(self.clone());
        let windows = std::mem::take(raw.windows_mut());
        let mut object = object(&raw);
        for (keys, value) in fields {
            set_field(&mut object, keys, value.clone());
        }
        let mut raw: RawEndpoint = serde_path_to_error::deserialize(Value::Object(object))
            .map_err(|e| {
                let path = e.path().to_string();
                let field = match path.as_str() {
                    "" | "." => at.clone(),
                    path => at.field(path),
                };
                field.invalid(e.into_inner())
            })?;
        *raw.windows_mut() = windows;
        raw.into_policy(at)
    }
}

/// Sets (or, for `None`, removes) the field at `keys` in `table`, making the tables on the way.
fn set_field(table: &mut Map<String, Value>, keys: &[&str], value: Option<Value>) {
    match keys {
        [] => {}
        [last] => {
            match value {
                Some(value) => table.insert((*last).to_owned(), value),
                None => table.remove(*last),
            };
        }
        [first, rest @ ..] => {
            let entry = table
                .entry((*first).to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            if let Value::Object(inner) = entry {
                set_field(inner, rest, value);
            }
        }
    }
}
