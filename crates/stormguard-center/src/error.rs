//! The API's errors: each a status and a JSON body `{"status": 409, "error": "…"}` that says
//! what was wrong.

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
    /// The store failed (503): nothing was changed.
    #[error("store unavailable: {0}")]
    Store(String),
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> ApiError {
        match error {
            StoreError::Conflict { .. } => ApiError::Conflict(error.to_string()),
            other => {
                tracing::warn!(error = %other, "stormguard center: store error");
                ApiError::Store(other.to_string())
            }
        }
    }
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
            ApiError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
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
