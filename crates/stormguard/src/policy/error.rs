//! What went wrong with a policy, and where.

use std::fmt;
use std::path::PathBuf;

use crate::duration::cut;

/// The longest error message kept, in characters: a message quotes at most a short piece of
/// the input, so a 10 MB bad value gives an error of a few hundred bytes.
pub(super) const MAX_MESSAGE: usize = 512;

/// A policy that could not be used: where, and which rule.
///
/// Every message is bounded: a value is quoted once, cut to
/// [`MAX_QUOTED`](crate::duration::MAX_QUOTED) characters, and a whole message to a few
/// hundred.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read (missing, unreadable, too large, an unknown extension, not
    /// UTF-8).
    #[error("{}: {message}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        message: String,
    },
    /// The text is not valid TOML/JSON for this shape: an unknown field, a wrong type, a
    /// malformed duration, broken syntax.
    #[error("{at}: {}{message}", Field(field))]
    Syntax {
        /// Where in the text.
        at: Location,
        /// The path of the field, e.g. `endpoints."POST /pay".retry.max_attempts` (empty
        /// when the text breaks before any field).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A value breaks a rule.
    #[error("{}{}{rule}", At(at), Field(field))]
    Invalid {
        /// The path of the field, e.g. `endpoints."POST /pay".retry.max_attempts`.
        field: String,
        /// The rule broken.
        rule: String,
        /// Where the field (or the nearest enclosing table the text writes) is, for a policy
        /// read from text; `None` for one built in code.
        at: Option<Location>,
    },
}

impl PolicyError {
    /// The same error, located in `file`.
    pub(super) fn in_file(mut self, file: &std::path::Path) -> Self {
        match &mut self {
            PolicyError::Syntax { at, .. } | PolicyError::Invalid { at: Some(at), .. } => {
                at.file = Some(file.to_owned());
            }
            PolicyError::Invalid { at: None, .. } | PolicyError::Read { .. } => {}
        }
        self
    }
}

/// A place in a policy text: the file (when read from one), line and column (both from 1,
/// the column counted in characters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The file, when the text was read from one.
    pub file: Option<PathBuf>,
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1, in characters.
    pub column: usize,
}

impl Location {
    /// The location of byte `offset` of `text`.
    pub(crate) fn of(text: &str, offset: usize) -> Self {
        let before = text.get(..offset.min(text.len())).unwrap_or(text);
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Location {
            file: None,
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(file) => write!(f, "{}:{}:{}", file.display(), self.line, self.column),
            None => write!(f, "line {}, column {}", self.line, self.column),
        }
    }
}

struct At<'a>(&'a Option<Location>);

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(at) => write!(f, "{at}: "),
            None => Ok(()),
        }
    }
}

struct Field<'a>(&'a str);

impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, "{}: ", self.0)
        }
    }
}

/// Something a policy allows that is probably not meant; the policy is used all the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyWarning {
    /// The path of the field.
    pub field: String,
    /// What will happen.
    pub message: String,
}

impl fmt::Display for PolicyWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", Field(&self.field), self.message)
    }
}

/// A dotted path to a field, for error messages. An endpoint's name is quoted and cut to
/// [`MAX_QUOTED`](crate::duration::MAX_QUOTED) characters.
#[derive(Clone, Debug)]
pub(crate) struct FieldPath(String);

impl FieldPath {
    pub(crate) fn root(name: &str) -> Self {
        FieldPath(name.to_owned())
    }

    pub(crate) fn endpoint(name: &str) -> Self {
        FieldPath(format!(
            "endpoints.{:?}",
            cut(name, crate::duration::MAX_QUOTED)
        ))
    }

    pub(crate) fn field(&self, name: &str) -> FieldPath {
        if self.0.is_empty() {
            FieldPath(name.to_owned())
        } else {
            FieldPath(format!("{}.{name}", self.0))
        }
    }

    /// Element `index` of the list at this path: `windows[0]`.
    pub(crate) fn index(&self, index: usize) -> FieldPath {
        FieldPath(format!("{}[{index}]", self.0))
    }

    pub(crate) fn invalid(&self, rule: impl fmt::Display) -> PolicyError {
        PolicyError::Invalid {
            field: self.0.clone(),
            rule: bounded(&rule.to_string()),
            at: None,
        }
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `message` cut to [`MAX_MESSAGE`] characters.
pub(super) fn bounded(message: &str) -> String {
    cut(message, MAX_MESSAGE)
}
