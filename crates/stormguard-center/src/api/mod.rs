//! The HTTP API: routes, and the checks every handler shares (names, labels).

pub(crate) mod admin;
mod rules;
pub(crate) mod versions;
mod watch;

use std::collections::BTreeMap;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Method, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use stormguard::limit::{Aimd, LimiterConfig};
use stormguard_tower::limit::AdaptiveLimitLayer;

use crate::error::ApiError;
use crate::server::{Center, CenterConfig};
use Verb::{Delete, Get, Post, Put};

/// The longest service name, instance id, label key or value.
const MAX_NAME: usize = 128;
/// The most labels one instance may carry.
const MAX_LABELS: usize = 32;

/// The OpenAPI 3.1 document of the API, served at `GET /openapi.json`.
pub(crate) const OPENAPI: &str = include_str!("../../openapi.json");

pub(crate) fn router(center: Center) -> Router {
    let limit = center.config().body_limit;
    routes(center.config())
        .router
        .fallback(no_route)
        .layer(axum::middleware::map_response(json_errors))
        // After the JSON error layer: the dashboard's errors are pages.
        .merge(crate::dashboard::router())
        .layer(DefaultBodyLimit::max(limit))
        .with_state(center)
}

/// The HTTP methods the API uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verb {
    Get,
    Post,
    Put,
    Delete,
}

impl Verb {
    fn filter(self) -> MethodFilter {
        match self {
            Verb::Get => MethodFilter::GET,
            Verb::Post => MethodFilter::POST,
            Verb::Put => MethodFilter::PUT,
            Verb::Delete => MethodFilter::DELETE,
        }
    }

    /// The method's name, lowercase as an OpenAPI path item names it.
    #[cfg(test)]
    pub(crate) fn openapi_name(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::Post => "post",
            Verb::Put => "put",
            Verb::Delete => "delete",
        }
    }
}

/// The routes, and the list of them: built together, so the list (which the OpenAPI
/// document is checked against) cannot miss one.
pub(crate) struct Routes {
    router: Router<Center>,
    pub(crate) table: Vec<(Verb, &'static str)>,
}

impl Routes {
    fn add(
        mut self,
        verb: Verb,
        path: &'static str,
        endpoint: impl FnOnce(MethodFilter) -> MethodRouter<Center>,
    ) -> Routes {
        self.router = self.router.route(path, endpoint(verb.filter()));
        self.table.push((verb, path));
        self
    }
}

pub(crate) fn routes(config: &CenterConfig) -> Routes {
    let admissions = config.watch_admissions.max(1);
    let admission = AdaptiveLimitLayer::builder(LimiterConfig::new(
        Aimd::new().with_limits(admissions, admissions, admissions),
    ))
    .with_retry_after(Duration::from_secs(1))
    .build();
    let watch = |filter| match admission {
        Ok(admission) => on(filter, watch::watch).route_layer(admission),
        // A fixed limit of at least one is always valid; without it, admit everyone.
        Err(_) => on(filter, watch::watch),
    };
    Routes {
        router: Router::new(),
        table: Vec::new(),
    }
    .add(Get, "/healthz", |m| on(m, || async { "ok" }))
    .add(Get, "/openapi.json", |m| on(m, openapi))
    .add(Get, "/metrics", |m| on(m, admin::metrics))
    .add(Get, "/v1/audit", |m| on(m, admin::audit))
    .add(Post, "/v1/tokens", |m| on(m, admin::create_token))
    .add(Get, "/v1/services/{service}/versions", |m| {
        on(m, versions::history)
    })
    .add(Post, "/v1/services/{service}/versions", |m| {
        on(m, versions::publish)
    })
    .add(Get, "/v1/services/{service}/versions/{version}", |m| {
        on(m, versions::one)
    })
    .add(Post, "/v1/services/{service}/rollback", |m| {
        on(m, versions::rollback)
    })
    .add(Post, "/v1/services/{service}/canary/promote", |m| {
        on(m, versions::promote)
    })
    .add(Post, "/v1/services/{service}/canary/abort", |m| {
        on(m, versions::abort)
    })
    .add(Get, "/v1/services/{service}/status", |m| {
        on(m, admin::status)
    })
    .add(Get, "/v1/services/{service}/policy", |m| on(m, watch::poll))
    .add(Get, "/v1/services/{service}/watch", watch)
    .add(Post, "/v1/services/{service}/acks", |m| {
        on(m, watch::acknowledge)
    })
    .add(Get, "/v1/services/{service}/rules", |m| on(m, rules::list))
    .add(Put, "/v1/services/{service}/rules/{name}", |m| {
        on(m, rules::put)
    })
    .add(Delete, "/v1/services/{service}/rules/{name}", |m| {
        on(m, rules::delete)
    })
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route {method} {}", uri.path()))
}

/// Rewrites an error that axum answered itself as the API's JSON error: a body that is not
/// JSON or not the expected fields (400, 415, 422), a path parameter of the wrong type, a
/// method the route lacks (405), a body over the limit (413). Its text becomes `error`; the
/// status and the other headers (`Allow`, `Retry-After`) stay.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 4096)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
        .unwrap_or_default();
    let error = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase()
    } else {
        text
    };
    let body = serde_json::json!({ "status": status.as_u16(), "error": error }).to_string();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body))
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

    /// The OpenAPI document names exactly the routes the router serves: a route added,
    /// removed or renamed on one side only fails here.
    #[test]
    fn the_openapi_document_lists_exactly_the_routes() {
        let document: serde_json::Value = serde_json::from_str(OPENAPI).unwrap();
        assert!(document["openapi"].as_str().unwrap().starts_with("3."));
        let mut documented: Vec<(String, String)> = document["paths"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(path, item)| {
                item.as_object()
                    .unwrap()
                    .keys()
                    .filter(|key| {
                        [
                            "get", "put", "post", "delete", "patch", "head", "options", "trace",
                        ]
                        .contains(&key.as_str())
                    })
                    .map(move |method| (method.clone(), path.clone()))
            })
            .collect();
        let mut served: Vec<(String, String)> = routes(&CenterConfig::default())
            .table
            .into_iter()
            .map(|(verb, path)| (verb.openapi_name().to_owned(), path.to_owned()))
            .collect();
        documented.sort();
        served.sort();
        assert_eq!(documented, served);
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
