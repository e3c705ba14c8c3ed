//! The API's errors: each a status and a JSON body `{"status": 409, "error": "…"}` that says
//! what was wrong.
//!
//! A store failure is the exception: what the driver says (host names, SQL, the database's
//! own messages) is for the operator, not for every caller with a token. The center logs it
//! with a short random id and answers 503 naming only which store is unavailable and that
//! id, so a caller's report can be matched to the log line.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::store::StoreError;

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No token, or one the center does not know (401).
    #[error("unauthorized: {0}")]
    Unauthorized(&'static str),
    /// The token's role does not allow the request (403).
    #[error("forbidden: {0}")]
    Forbidden(&'static str),
    /// A field of the request is wrong (400), named with the rule it breaks.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The policy does not validate (422); the message names the field.
    #[error("invalid policy: {0}")]
    InvalidPolicy(String),
    /// No such service or version (404).
    #[error("not found: {0}")]
    NotFound(String),
    /// The publish was based on a version that is no longer the latest (409).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The store failed (503): nothing was changed, except after an abandoned
    /// acknowledgement ([`StoreError::Abandoned`]), which may have been written. The cause
    /// is in the center's log under `id`.
    #[error("the {store} is unavailable (error id {id}; the center's log has the cause)")]
    Store {
        /// Which store: `SQLite store`, `PostgreSQL store`.
        store: String,
        /// The id of the log line that holds the cause.
        id: String,
    },
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> ApiError {
        match error {
            StoreError::Conflict { .. } => ApiError::Conflict(error.to_string()),
            other => {
                let id = error_id();
                let store = match &other {
                    StoreError::Database { store, .. } => store.to_string(),
                    _ => "store".to_owned(),
                };
                tracing::error!(error_id = %id, error = %other, "stormguard center: store error");
                ApiError::Store { store, id }
            }
        }
    }
}

/// Eight random hex digits naming one logged error.
fn error_id() -> String {
    use rand::RngCore as _;
    format!("{:08x}", rand::rng().next_u32())
}

impl ApiError {
    /// The HTTP status of the error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::InvalidPolicy(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Store { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = serde_json::json!({ "status": status.as_u16(), "error": self.to_string() });
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::StoreKind;

    #[test]
    fn a_store_error_names_the_store_and_an_id_but_not_the_cause() {
        let cause = sqlx::Error::Protocol("secret host db-7.internal refused".to_owned());
        let error = ApiError::from(StoreError::Database {
            store: StoreKind::Postgres,
            source: cause,
        });
        assert_eq!(error.status(), StatusCode::SERVICE_UNAVAILABLE);
        let text = error.to_string();
        assert!(text.contains("PostgreSQL store is unavailable"), "{text}");
        assert!(!text.contains("db-7"), "{text}");
        let ApiError::Store { id, .. } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(id.len(), 8);
        assert!(text.contains(id.as_str()));
    }
}
