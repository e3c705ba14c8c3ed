//! The policy center's HTTP API fed any request body and query: a real center (in-memory
//! SQLite) behind its real router. Whatever the bytes, the answer is a success or a 4xx with
//! the documented JSON error (`{"status": …, "error": "…"}`, the same status), never a 5xx
//! and never a panic. The first byte picks the route (publish, rollback, canary steps,
//! ACK/NACK, tokens, poll, status, history, audit), the rest is the body (or the query).
#![no_main]

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{Request, header};
use libfuzzer_sys::fuzz_target;
use stormguard_center::{Center, CenterConfig, Role, Store};
use tower::ServiceExt as _;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
    admin: String,
    instance: String,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (router, admin, instance) = runtime.block_on(async {
            let store = Store::open("sqlite::memory:").await.expect("store");
            let center = Center::new(store, CenterConfig::default())
                .await
                .expect("center");
            let admin = center.create_token("fuzz", Role::Admin, None).await.expect("token");
            let instance = center
                .create_token("fleet", Role::Instance, Some("orders"))
                .await
                .expect("token");
            (center.router(), admin, instance)
        });
        Fixture {
            runtime,
            router,
            admin,
            instance,
        }
    })
}

/// (method, path, whether the input is the query, whether the instance token is used)
const ROUTES: [(&str, &str, bool, bool); 11] = [
    ("POST", "/v1/services/orders/versions", false, false),
    ("POST", "/v1/services/orders/rollback", false, false),
    ("POST", "/v1/services/orders/canary/promote", false, false),
    ("POST", "/v1/services/orders/canary/abort", false, false),
    ("POST", "/v1/services/orders/acks", false, true),
    ("POST", "/v1/tokens", false, false),
    ("GET", "/v1/services/orders/policy", true, true),
    ("GET", "/v1/services/orders/versions", true, false),
    ("GET", "/v1/audit", true, false),
    ("GET", "/v1/services/orders/status", true, false),
    ("GET", "/v1/services/orders/versions/", false, false),
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    let fixture = fixture();
    let (method, path, query, as_instance) = ROUTES[usize::from(pick) % ROUTES.len()];
    let token = if as_instance {
        &fixture.instance
    } else {
        &fixture.admin
    };
    let uri = if query || path.ends_with('/') {
        // A query or a path segment: only what a URI may hold gets that far.
        let text: String = input
            .iter()
            .map(|&b| char::from(b))
            .filter(|c| c.is_ascii_graphic() && *c != '#')
            .collect();
        if query {
            format!("{path}?{text}")
        } else {
            format!("{path}{}", text.replace(['?', '/'], ""))
        }
    } else {
        path.to_owned()
    };
    let Ok(request) = Request::builder()
        .method(method)
        .uri(&uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(input.to_vec()))
    else {
        return; // not a URI the HTTP layer would pass on
    };
    let router = fixture.router.clone();
    fixture.runtime.block_on(async move {
        let response = router.oneshot(request).await.expect("infallible");
        let status = response.status();
        assert!(
            !status.is_server_error(),
            "{method} {uri}: {status} for {input:?}"
        );
        if status.is_client_error() {
            let is_json = response
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
            let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .expect("the error body");
            assert!(is_json, "{method} {uri}: {status} is not JSON");
            let error: serde_json::Value =
                serde_json::from_slice(&body).expect("the error body is JSON");
            assert_eq!(error["status"], status.as_u16(), "{error}");
            assert!(
                error["error"].as_str().is_some_and(|e| !e.is_empty()),
                "{error}"
            );
        }
    });
});
