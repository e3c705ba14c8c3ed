//! What a version is: the canonical policy text, its content hash, and what changed.
//!
//! A publish may arrive as TOML or JSON, formatted any way; the center stores the policy as
//! the canonical TOML that [`PolicyFile::to_toml`] writes, so that the same policies always
//! have the same text and the same [content hash](content_hash), whoever formatted them.
//! The diff of a version is the list of changed field paths (with the old and the new
//! value) of the core's [`PolicyDiff`] — the same comparison `stormguard policy diff` judges —
//! named like the paths a validation error names (`endpoints."POST /pay".retry.max_attempts`),
//! and stable under reformatting.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use stormguard::policy::PolicyFile;
use stormguard::policy::diff::PolicyDiff;

/// One published version of a service's policies, as the API returns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// The service the policies are for.
    pub service: String,
    /// 1 for the first publish of the service, one more for each publish after it.
    pub version: u64,
    /// The SHA-256 of [`policy`](Self::policy), in hex.
    pub hash: String,
    /// The policies, as canonical TOML.
    pub policy: String,
    /// Who published it (the name of the token).
    pub author: String,
    /// Why, in the author's words.
    pub message: String,
    /// What changed from the version before.
    pub diff: Vec<FieldChange>,
    /// The version this one republished, when it is a rollback.
    pub rollback_of: Option<u64>,
    /// When it was published, in milliseconds since the Unix epoch.
    pub created_ms: i64,
}

/// One field whose value differs between two versions, as the file writes it (`"2s"`,
/// `3`, `"full"`). A field only in the new version has no `old`; a field only in the old
/// one has no `new`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldChange {
    /// The field's path: `endpoints."POST /pay".retry.max_attempts`.
    pub path: String,
    /// Its value before.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub old: Option<String>,
    /// Its value now.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub new: Option<String>,
}

/// The canonical text of `file`: what is stored and hashed.
pub fn canonical_text(file: &PolicyFile) -> String {
    file.to_toml()
}

/// The SHA-256 of `text`, in lowercase hex.
///
/// ```
/// let hash = stormguard_center::content_hash("");
/// assert!(hash.starts_with("e3b0c442"));
/// ```
pub fn content_hash(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The fields that differ between `old` (none for a service's first version) and `new`:
/// the core's [`PolicyDiff`] (validated policies compared, so `"5000ms"` against `"5s"` is no
/// change), each field named by its whole path in the file.
///
/// ```
/// use stormguard::policy::PolicyFile;
/// use stormguard_center::changed_fields;
///
/// let old = PolicyFile::from_toml("[endpoints.pay]\nretry = { max_attempts = 3 }")?;
/// let new = PolicyFile::from_toml("[endpoints.pay]\nretry = { max_attempts = 1 }")?;
/// let diff = changed_fields(Some(&old), &new);
/// assert_eq!(diff[0].path, r#"endpoints."pay".retry.max_attempts"#);
/// assert_eq!((diff[0].old.as_deref(), diff[0].new.as_deref()), (Some("3"), Some("1")));
/// # Ok::<(), stormguard::policy::PolicyError>(())
/// ```
pub fn changed_fields(old: Option<&PolicyFile>, new: &PolicyFile) -> Vec<FieldChange> {
    let none = PolicyFile::default();
    PolicyDiff::between(old.unwrap_or(&none), new)
        .endpoints
        .into_iter()
        .flat_map(|endpoint| {
            let name = endpoint.endpoint;
            endpoint.fields.into_iter().map(move |f| FieldChange {
                path: format!("endpoints.{name:?}.{}", f.field),
                old: f.old,
                new: f.new,
            })
        })
        .collect()
}

/// What an instance receives: one version's policies, complete (the `data` of a watch
/// event, the body of a poll).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The service.
    pub service: String,
    /// The version's number (also the event's id).
    pub version: u64,
    /// The SHA-256 of `policy`, in hex.
    pub hash: String,
    /// The policies, as canonical TOML.
    pub policy: String,
    /// When the version was published, in milliseconds since the Unix epoch.
    pub created_ms: i64,
}

impl From<crate::store::VersionRow> for Snapshot {
    fn from(row: crate::store::VersionRow) -> Snapshot {
        Snapshot {
            version: row.version(),
            service: row.service,
            hash: row.hash,
            policy: row.policy,
            created_ms: row.created_ms,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn file(text: &str) -> PolicyFile {
        PolicyFile::from_toml(text).expect("valid policy")
    }

    #[test]
    fn the_same_policies_written_differently_hash_the_same() {
        let a = file("[endpoints.pay]\nretry = { max_attempts = 3 }\n");
        let b = file("[endpoints.pay.retry]\nmax_attempts   = 3\n");
        assert_eq!(
            content_hash(&canonical_text(&a)),
            content_hash(&canonical_text(&b))
        );
    }

    #[test]
    fn a_diff_names_added_changed_and_removed_fields() {
        let old = file("[endpoints.pay]\nretry = { max_attempts = 3 }\n[endpoints.old]\n");
        let new = file("[endpoints.pay]\nretry = { max_attempts = 1 }\n[endpoints.new]\n");
        let paths: Vec<_> = changed_fields(Some(&old), &new)
            .into_iter()
            .map(|c| (c.path, c.old.is_some(), c.new.is_some()))
            .collect();
        assert!(paths.contains(&(r#"endpoints."pay".retry.max_attempts"#.into(), true, true)));
        assert!(
            paths
                .iter()
                .any(|(p, old, new)| p.starts_with(r#"endpoints."new""#) && !old && *new)
        );
        assert!(
            paths
                .iter()
                .any(|(p, old, new)| p.starts_with(r#"endpoints."old""#) && *old && !new)
        );
        assert!(changed_fields(Some(&new), &new).is_empty());
    }
}
