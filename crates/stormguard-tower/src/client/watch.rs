//! Watching a policy file and reloading it when it changes (feature `watch`).
//!
//! Editors and configuration tools rarely write a file in place: they write a new file and
//! rename it over the old one, which ends a watch on the old file. So the watcher watches the
//! file's directory and reacts to any event on the file's name, and it debounces: the burst of
//! events of one save (create, write, rename, metadata) becomes one reload, read once the
//! burst has been quiet for the debounce time — usually: on a busy machine one save can
//! reach the watcher as two bursts, and the file is read twice (the second read finds the
//! policies in use and is not counted as a swap). Each reload is [`Policies::reload`]:
//! validated first, a bad file keeps the last good policies.
//!
//! Write the file as those tools do, a new file renamed over the old one: a file rewritten in
//! place can be read half-written, and a prefix of a policy file may itself be a valid (and
//! smaller) policy file. What survives a swap — a breaker's state, a budget's tokens, a
//! health window, each kept while its own configuration is unchanged — is told at
//! [`Policies::swap`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify_debouncer_mini::notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_mini::{DebounceEventResult, Debouncer, new_debouncer};

use super::live::Policies;
use super::reload::ReloadError;
use crate::observe::Observer;

/// The default debounce: the quiet time after the last event of a save before reloading.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(100);

/// A running watch of one policy file. Dropping it stops watching.
pub struct PolicyWatcher {
    _debouncer: Debouncer<RecommendedWatcher>,
    path: PathBuf,
}

impl std::fmt::Debug for PolicyWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyWatcher")
            .field("path", &self.path)
            .finish()
    }
}

impl PolicyWatcher {
    /// The file watched.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Why a watch could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The file's first load failed: nothing is watched, the policies are unchanged.
    #[error("first load of the policy file: {0}")]
    Load(#[from] ReloadError),
    /// The operating system refused the watch (no such directory, out of inotify watches).
    #[error("cannot watch {}: {source}", path.display())]
    Watch {
        /// The directory that could not be watched.
        path: PathBuf,
        /// The watcher's error.
        source: notify_debouncer_mini::notify::Error,
    },
}

impl<O: Observer> Policies<O> {
    /// Loads the policy file at `path` now, then reloads it whenever it changes, `debounce`
    /// after the last change of a burst ([`DEFAULT_DEBOUNCE`] suits most). Each reload goes
    /// through [`Policies::reload`]: an invalid file keeps the last good policies and is
    /// recorded in [`Policies::status`].
    pub fn watch(
        &self,
        path: impl AsRef<Path>,
        debounce: Duration,
    ) -> Result<PolicyWatcher, WatchError> {
        let path = path.as_ref();
        self.reload(path)?;
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        let dir = path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_owned);
        let policies = self.clone();
        let file = path.clone();
        let mut debouncer = new_debouncer(debounce, move |events: DebounceEventResult| {
            let touched = match events {
                Ok(events) => events.iter().any(|e| e.path == file),
                // A watcher error (an overflowed event queue) may hide a change: read again.
                Err(_) => true,
            };
            if touched {
                // The outcome is in the status, the metrics and the log.
                let _ = policies.reload(&file);
            }
        })
        .map_err(|source| WatchError::Watch {
            path: dir.clone(),
            source,
        })?;
        debouncer
            .watcher()
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|source| WatchError::Watch {
                path: dir.clone(),
                source,
            })?;
        Ok(PolicyWatcher {
            _debouncer: debouncer,
            path,
        })
    }
}

#[cfg(test)]
mod tests;
