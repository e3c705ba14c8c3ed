//! The problem+json (RFC 9457) responses the layer answers with.
//!
//! Each has a stable `type` URI (a URN, so it needs no web page) that clients can match on,
//! a `title`, the `status`, and a `detail` for people.

use axum::body::Body;
use http::{HeaderValue, Response, StatusCode, header};

/// `400`: the endpoint requires an `Idempotency-Key` and the request has none.
pub const MISSING_KEY: &str = "urn:stormguard:idempotency:missing-key";
/// `400`: the `Idempotency-Key` header is malformed.
pub const MALFORMED_KEY: &str = "urn:stormguard:idempotency:malformed-key";
/// `401`: the tenant extractor found no principal to scope the key with.
pub const NO_TENANT: &str = "urn:stormguard:idempotency:no-tenant";
/// `409`: a request with this key is still being processed.
pub const IN_FLIGHT: &str = "urn:stormguard:idempotency:in-flight";
/// `409`: the request with this key completed, but its response was too large to keep.
pub const RESPONSE_NOT_STORED: &str = "urn:stormguard:idempotency:response-not-stored";
/// `413`: the request body is larger than the layer buffers to fingerprint it.
pub const REQUEST_TOO_LARGE: &str = "urn:stormguard:idempotency:request-too-large";
/// `422`: the key was used before with a different request.
pub const KEY_REUSED: &str = "urn:stormguard:idempotency:key-reused";
/// `503`: the idempotency store failed; the request was not processed.
pub const STORE_UNAVAILABLE: &str = "urn:stormguard:idempotency:store-unavailable";
/// `400`: the request body could not be read.
pub const BAD_BODY: &str = "urn:stormguard:idempotency:unreadable-body";
/// `504`: the request's deadline (from its headers) passed before or while it was processed.
pub const DEADLINE_EXCEEDED: &str = "urn:stormguard:idempotency:deadline-exceeded";
/// `502`: the handler's response body failed while it was being stored.
pub const BAD_RESPONSE: &str = "urn:stormguard:idempotency:response-failed";

/// The content type of every problem response.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// A problem+json response.
pub fn response(status: StatusCode, type_uri: &str, title: &str, detail: &str) -> Response<Body> {
    let body = serde_json::json!({
        "type": type_uri,
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut res = Response::new(Body::from(body.to_string()));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    res
}
