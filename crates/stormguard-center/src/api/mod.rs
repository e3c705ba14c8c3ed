//! The HTTP API: routes, and the checks every handler shares (names, labels).

pub(crate) mod admin;
mod versions;
mod watch;

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use std::time::Duration;
use stormguard::limit::{Aimd, LimiterConfig};
use stormguard_tower::limit::AdaptiveLimitLayer;

use crate::error::ApiError;
use crate::server::Center;

/// The longest service name, instance id, label key or value.
const MAX_NAME: usize = 128;
/// The most labels one instance may carry.
const MAX_LABELS: usize = 32;

pub(crate) fn router(center: Center) -> Router {
    let limit = center.config().body_limit;
    let admissions = center.config().watch_admissions.max(1);
    let admission = AdaptiveLimitLayer::builder(LimiterConfig::new(
        Aimd::new().with_limits(admissions, admissions, admissions),
    ))
    .with_retry_after(Duration::from_secs(1))
    .build();
    let watch = match admission {
        Ok(admission) => get(watch::watch).route_layer(admission),
        // A fixed limit of at least one is always valid; without it, admit everyone.
        Err(_) => get(watch::watch),
    };
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(admin::metrics))
        .route("/v1/audit", get(admin::audit))
        .route("/v1/tokens", post(admin::create_token))
        .route(
            "/v1/services/{service}/versions",
            get(versions::history).post(versions::publish),
        )
        .route(
            "/v1/services/{service}/versions/{version}",
            get(versions::one),
        )
        .route("/v1/services/{service}/rollback", post(versions::rollback))
        .route(
            "/v1/services/{service}/canary/promote",
            post(versions::promote),
        )
        .route("/v1/services/{service}/canary/abort", post(versions::abort))
        .route("/v1/services/{service}/status", get(admin::status))
        .route("/v1/services/{service}/policy", get(watch::poll))
        .route("/v1/services/{service}/watch", watch)
        .route("/v1/services/{service}/acks", post(watch::acknowledge))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(center)
}

/// A name the center stores and shows: 1 to 128 characters of `A-Z a-z 0-9 . _ -` (a
/// service, an instance id, a label key).
pub(crate) fn check_name(what: &str, name: &str) -> Result<(), ApiError> {
    let good = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if good {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "{what} {:?}: expected 1 to {MAX_NAME} characters of A-Z a-z 0-9 . _ -",
            cut(name)
        )))
    }
}

/// Parses `zone=a,tier=web` (the `labels` query parameter of a watch or poll).
pub(crate) fn parse_labels(text: Option<&str>) -> Result<BTreeMap<String, String>, ApiError> {
    let mut labels = BTreeMap::new();
    let Some(text) = text.filter(|t| !t.is_empty()) else {
        return Ok(labels);
    };
    for pair in text.split(',') {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            ApiError::BadRequest(format!("label {:?}: expected key=value", cut(pair)))
        })?;
        check_name("label key", key)?;
        if value.len() > MAX_NAME {
            return Err(ApiError::BadRequest(format!(
                "label {key:?}: the value is longer than {MAX_NAME} bytes"
            )));
        }
        labels.insert(key.to_owned(), value.to_owned());
        if labels.len() > MAX_LABELS {
            return Err(ApiError::BadRequest(format!(
                "more than {MAX_LABELS} labels"
            )));
        }
    }
    Ok(labels)
}

/// At most 40 characters of `text`, for quoting a bad value in an error.
fn cut(text: &str) -> String {
    text.chars().take(40).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn labels_parse_or_fail_without_panicking(text in ".{0,200}") {
            let _ = parse_labels(Some(&text));
        }

        #[test]
        fn written_labels_read_back(labels in proptest::collection::btree_map("[a-z]{1,8}", "[a-z0-9]{0,8}", 0..5)) {
            let text = labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
            prop_assert_eq!(parse_labels(Some(&text)).unwrap(), labels);
        }
    }

    #[test]
    fn bad_names_and_labels_are_named() {
        assert!(check_name("service", "").is_err());
        assert!(check_name("service", "a/b").is_err());
        assert!(check_name("service", &"a".repeat(129)).is_err());
        assert!(check_name("service", "pay-api.v2_eu").is_ok());
        let error = parse_labels(Some("zone")).unwrap_err().to_string();
        assert!(error.contains("zone"), "{error}");
    }
}
