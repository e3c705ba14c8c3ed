//! What went wrong reading latency data.

/// Latency data that could not be read: the line and what was wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct AdviseError {
    /// The line, from 1 (0 for the data as a whole).
    pub line: usize,
    /// What is wrong, quoting at most a short piece of the input.
    pub message: String,
}

impl AdviseError {
    pub(super) fn at(line: usize, message: impl Into<String>) -> Self {
        AdviseError {
            line,
            message: crate::duration::cut(&message.into(), 256),
        }
    }
}
