//! Reloading the live policies from a file, and the record of how the last reloads went.
//!
//! A bad policy file must never take a running service down with it: [`Policies::reload`]
//! reads and validates the whole file first and swaps only a good one in; a bad one leaves
//! the last good policies in use, and says why in three places a service can watch:
//!
//! - [`Policies::status`]: the version in use, counts of swaps and failures, the last error
//!   and any warnings of the policies in use (a value to serve on a status page);
//! - with the `metrics` feature, the counter `stormguard_policy_reload_errors_total` and the
//!   gauge `stormguard_policy_version` (the [content hash](Policies::version) in use);
//! - with the `tracing` feature, a warning event per failure, an info event per swap.
//!
//! `Policies::watch` (feature `watch`) calls [`Policies::reload`] whenever the file
//! changes.

use std::path::Path;
use std::sync::Mutex;
use std::time::SystemTime;

use stormguard::policy::{PolicyError, PolicyFile};

use super::live::{InvalidPolicies, Policies};
use crate::observe::Observer;

/// Why a reload left the policies as they were.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    /// The file could not be read, parsed or validated.
    #[error(transparent)]
    Load(#[from] PolicyError),
    /// The file's policies could not be used by this stack (an endpoint name that is not a
    /// route, an endpoint the stack needs and the file lacks).
    #[error(transparent)]
    Policies(#[from] InvalidPolicies),
}

/// How the policies of one stack were last changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadStatus {
    /// The [content hash](Policies::version) of the policies in use.
    pub version: u64,
    /// Swaps that changed the policies (from code, a reload or the watcher), the first
    /// build excluded. A swap of the policies already in use is not counted.
    pub swaps: u64,
    /// Swaps and reloads that failed and left the policies as they were.
    pub errors: u64,
    /// When the last swap succeeded.
    pub last_swap: Option<SystemTime>,
    /// The last failure, if the last attempt failed: when, and why. `None` once a later swap
    /// succeeds.
    pub last_error: Option<(SystemTime, String)>,
    /// What the policies in use allow but probably do not mean (see
    /// [`PolicyFile::warnings`]).
    pub warnings: Vec<String>,
}

/// The status of one stack, updated under its swap lock.
pub(crate) struct StatusCell(Mutex<ReloadStatus>);

impl StatusCell {
    pub(crate) fn new(version: u64) -> Self {
        #[cfg(feature = "metrics")]
        metrics::gauge!("stormguard_policy_version").set(version as f64);
        StatusCell(Mutex::new(ReloadStatus {
            version,
            ..ReloadStatus::default()
        }))
    }

    pub(crate) fn get(&self) -> ReloadStatus {
        self.lock().clone()
    }

    pub(crate) fn succeeded(&self, version: u64, file: &PolicyFile) {
        let warnings = file.warnings().iter().map(ToString::to_string).collect();
        let mut status = self.lock();
        status.version = version;
        status.swaps += 1;
        status.last_swap = Some(SystemTime::now());
        status.last_error = None;
        status.warnings = warnings;
        #[cfg(feature = "metrics")]
        metrics::gauge!("stormguard_policy_version").set(version as f64);
        #[cfg(feature = "tracing")]
        tracing::info!(
            version = format_args!("{version:012x}"),
            warnings = status.warnings.len(),
            "stormguard policies swapped"
        );
    }

    /// A good file held the policies already in use: nothing changed, but the last
    /// attempt did not fail.
    pub(crate) fn unchanged(&self) {
        self.lock().last_error = None;
    }

    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        let message = error.to_string();
        #[cfg(feature = "metrics")]
        metrics::counter!("stormguard_policy_reload_errors_total").increment(1);
        #[cfg(feature = "tracing")]
        tracing::warn!(error = %message, "stormguard policies kept: the new ones are invalid");
        let mut status = self.lock();
        status.errors += 1;
        status.last_error = Some((SystemTime::now(), message));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReloadStatus> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<O: Observer> Policies<O> {
    /// Reads, validates and swaps in the policy file at `path` (TOML or JSON, by extension;
    /// see [`PolicyFile::load`]). On any error the policies in use stay, and the error is
    /// recorded (see the [module docs](self)).
    pub fn reload(&self, path: impl AsRef<Path>) -> Result<(), ReloadError> {
        match PolicyFile::load(path) {
            Ok(file) => Ok(self.swap(&file)?),
            Err(error) => {
                self.inner.status.failed(&error);
                Err(error.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use stormguard::policy::PolicyFile;

    use crate::client::ClientLayer;

    fn file(attempts: u32) -> PolicyFile {
        PolicyFile::from_toml(&format!(
            "[endpoints.\"GET /x\"]\nidempotency = \"idempotent\"\n\
             retry = {{ max_attempts = {attempts} }}\n"
        ))
        .expect("valid")
    }

    #[test]
    fn a_swap_of_the_policies_in_use_is_not_counted_but_clears_the_last_error() {
        let layer = ClientLayer::from_policy_file(&file(2)).expect("stack");
        let policies = layer.policies();
        let first = policies.version();

        policies.swap(&file(2)).expect("the same policies");
        assert_eq!(policies.status().swaps, 0, "nothing changed");
        assert_eq!(policies.version(), first);

        policies.swap(&file(3)).expect("new policies");
        let changed = policies.status();
        assert_eq!(changed.swaps, 1);
        assert_ne!(changed.version, first);

        let missing = std::env::temp_dir().join("stormguard-no-such-dir/policies.toml");
        policies.reload(&missing).expect_err("no such file");
        assert!(policies.status().last_error.is_some());

        policies.swap(&file(3)).expect("the same policies again");
        let after = policies.status();
        assert_eq!(after.swaps, 1, "the same policies are not a second swap");
        assert_eq!(after.errors, 1);
        assert_eq!(after.last_error, None, "the last attempt did not fail");
    }
}
