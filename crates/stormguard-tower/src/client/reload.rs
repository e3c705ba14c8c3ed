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
//! A good file whose policies are already in use is not a swap: no count, no event. A bad one
//! is counted each time it is read, so a save that reaches a watcher twice counts twice.
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
    /// When the policies last changed by a swap.
    pub last_swap: Option<SystemTime>,
    /// The last failure, if the last attempt failed: when, and why. `None` once a later swap
    /// or reload succeeds, whether or not it changed the policies.
    pub last_error: Option<(SystemTime, String)>,
    /// What the policies in use allow but probably do not mean (see
    /// [`PolicyFile::warnings`]; a stack built for one endpoint shows that endpoint's).
    pub warnings: Vec<String>,
}

/// The status of one stack, updated under its swap lock.
pub(crate) struct StatusCell(Mutex<ReloadStatus>);

impl StatusCell {
    pub(crate) fn new(version: u64, warnings: Vec<String>) -> Self {
        #[cfg(feature = "metrics")]
        metrics::gauge!("stormguard_policy_version").set(version as f64);
        StatusCell(Mutex::new(ReloadStatus {
            version,
            warnings,
            ..ReloadStatus::default()
        }))
    }

    pub(crate) fn get(&self) -> ReloadStatus {
        self.lock().clone()
    }

    pub(crate) fn succeeded(&self, version: u64, warnings: Vec<String>) {
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
    use std::sync::Arc;

    use stormguard::policy::PolicyFile;

    use crate::client::ClientLayer;

    /// `GET /x` with `attempts` attempts of at most 1 s each in 1.5 s: a third one can never
    /// start, which is a warning. `other` sets another endpoint's attempts.
    fn file(attempts: u32, other: u32) -> PolicyFile {
        PolicyFile::from_toml(&format!(
            "[endpoints.\"GET /x\"]\nidempotency = \"idempotent\"\n\
             timeouts = {{ per_try = \"1s\", overall = \"1500ms\" }}\n\
             retry = {{ max_attempts = {attempts} }}\n\
             [endpoints.\"GET /y\"]\nretry = {{ max_attempts = {other} }}\n"
        ))
        .expect("valid")
    }

    #[test]
    fn a_swap_of_the_policies_in_use_builds_nothing_is_not_counted_and_clears_the_last_error() {
        let layer = ClientLayer::from_policy_file(&file(3, 1)).expect("stack");
        let policies = layer.policies();
        let first = policies.inner.table.load_full();
        let first_version = policies.version();
        assert_eq!(
            policies.status().warnings.len(),
            1,
            "the first policies' warning"
        );

        policies.swap(&file(3, 1)).expect("the same policies");
        assert!(
            Arc::ptr_eq(&first, &policies.inner.table.load_full()),
            "the table in use stays"
        );
        assert_eq!(policies.status().swaps, 0, "nothing changed");
        assert_eq!(policies.status().warnings.len(), 1);

        policies.swap(&file(2, 1)).expect("new policies");
        let changed = policies.status();
        assert_eq!(changed.swaps, 1);
        assert_ne!(changed.version, first_version);
        assert!(changed.warnings.is_empty(), "{:?}", changed.warnings);

        let missing = std::env::temp_dir().join("stormguard-no-such-dir/policies.toml");
        policies.reload(&missing).expect_err("no such file");
        assert!(policies.status().last_error.is_some());

        policies.swap(&file(2, 1)).expect("the same policies again");
        let after = policies.status();
        assert_eq!(after.swaps, 1, "the same policies are not a second swap");
        assert_eq!(after.errors, 1);
        assert_eq!(after.last_error, None, "the last attempt did not fail");
    }

    #[test]
    fn a_stack_for_one_endpoint_swaps_only_when_that_endpoints_policy_changes() {
        let start = file(3, 1);
        let policy = start.endpoint("GET /x").expect("the endpoint").clone();
        let layer = ClientLayer::named("GET /x", policy).expect("stack");
        let policies = layer.policies();
        let first = policies.inner.table.load_full();
        let first_version = policies.version();

        policies
            .swap(&file(3, 2))
            .expect("another endpoint changed");
        assert!(Arc::ptr_eq(&first, &policies.inner.table.load_full()));
        assert_eq!(policies.status().swaps, 0);

        policies.swap(&file(2, 2)).expect("this endpoint changed");
        assert_eq!(policies.status().swaps, 1);
        assert_ne!(policies.version(), first_version);
    }
}
