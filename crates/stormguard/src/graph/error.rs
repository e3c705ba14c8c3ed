//! What went wrong with a call graph, and where.

use std::path::PathBuf;

use crate::policy::{Location, PolicyError};

/// A call graph that could not be used: where, and which rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// The file could not be read (missing, unreadable, too large, an unknown extension, not
    /// UTF-8).
    #[error("{}: {message}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        message: String,
    },
    /// The text is not valid TOML/JSON for the graph's shape (an unknown field, a wrong type,
    /// a malformed duration, an inline policy that breaks a rule).
    #[error("{at}: {field}: {message}")]
    Syntax {
        /// Where in the text.
        at: Location,
        /// The field path, e.g. `services."web".endpoints."GET /".calls[0].policy`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A value breaks a rule of the graph (an unknown callee, a cycle, both or neither of
    /// `policy` and `policy_ref`).
    #[error("{at}: {field}: {rule}")]
    Invalid {
        /// Where the field (or the nearest enclosing table the text writes) is.
        at: Location,
        /// The field path.
        field: String,
        /// The rule broken.
        rule: String,
    },
    /// A path makes more calls than [`MAX_DEPTH`](super::MAX_DEPTH): refused before any
    /// tool walks it.
    #[error(
        "{at}: {field}: this call is the {depth}th on a path from an entry point; at most {limit} calls may follow each other"
    )]
    TooDeep {
        /// Where the call is.
        at: Location,
        /// The call's field path.
        field: String,
        /// Its depth (calls from an entry point, itself included).
        depth: usize,
        /// [`MAX_DEPTH`](super::MAX_DEPTH).
        limit: usize,
    },
    /// A policy file named by a `policy_ref` could not be used.
    #[error("{field}: {source}")]
    Policy {
        /// The `policy_ref` field that names the file.
        field: String,
        /// The policy loader's error (it names the policy file, line and field).
        source: PolicyError,
    },
}
