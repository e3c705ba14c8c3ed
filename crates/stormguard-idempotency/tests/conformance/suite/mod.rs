//! One function per behaviour; each gets a fresh store namespace.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{HeaderMap, Method, Request, StatusCode};
use stormguard::clock::ManualClock;
use stormguard::deadline::WallClock;
use stormguard::retry::IdempotencyKey;
use stormguard_idempotency::problem;
use stormguard_idempotency::{
    Begin, BeginRequest, Completion, DoNotStore, FailureMode, Fingerprint, Finish,
    IdempotencyLayer, InFlight, LeaseToken, Oversize, Reaper, ScopedKey, Store, StorePolicy,
    StoredResponse,
};
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt as _;

use crate::support::{Http, TestEnv, serve};

mod leases_and_storage;
pub(crate) use leases_and_storage::*;

pub(crate) const LEASE: Duration = Duration::from_secs(30);

/// What the handlers saw.
pub(crate) struct Probe {
    pub(crate) runs: AtomicUsize,
    pub(crate) entered: Notify,
    /// Execution number 1 waits for a permit here when `gate_first` is set.
    gate: Semaphore,
    gate_first: bool,
    /// Execution number 1 never finishes (a crash in the middle of the request).
    hang_first: bool,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            runs: AtomicUsize::new(0),
            entered: Notify::new(),
            gate: Semaphore::new(0),
            gate_first: false,
            hang_first: false,
        }
    }
}

impl Probe {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Probe::default())
    }

    pub(crate) fn gated() -> Arc<Self> {
        Arc::new(Probe {
            gate_first: true,
            ..Probe::default()
        })
    }

    pub(crate) fn hanging() -> Arc<Self> {
        Arc::new(Probe {
            hang_first: true,
            ..Probe::default()
        })
    }

    pub(crate) fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    pub(crate) fn open_gate(&self) {
        self.gate.add_permits(1_000);
    }

    pub(crate) async fn start(&self) -> usize {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        self.entered.notify_one();
        if n == 1 && self.hang_first {
            std::future::pending::<()>().await;
        }
        if n == 1 && self.gate_first {
            let _permit = self.gate.acquire().await;
        }
        n
    }
}

/// `/pay` (POST and PATCH) and `/other`: 201 with a body naming the execution, headers that
/// are and are not allow-listed. `/status`: answers the status in `x-want-status`.
/// `/big`: a body of `x-size` bytes. `/validate`: 400 with [`DoNotStore`].
pub(crate) fn app(probe: &Arc<Probe>, layer: IdempotencyLayer) -> Router {
    routes(probe).route_layer(layer)
}

pub(crate) fn routes(probe: &Arc<Probe>) -> Router {
    let pay = {
        let p = Arc::clone(probe);
        move |body: Bytes| {
            let p = Arc::clone(&p);
            async move {
                let n = p.start().await;
                let body = format!(
                    "{{\"execution\":{n},\"echo\":{}}}",
                    serde_json::to_string(&String::from_utf8_lossy(&body)).unwrap_or_default()
                );
                Response::builder()
                    .status(StatusCode::CREATED)
                    .header("content-type", "application/json")
                    .header("location", format!("/payments/{n}"))
                    .header("etag", format!("\"v{n}\""))
                    .header("x-exec", n.to_string())
                    .header("set-cookie", "session=secret")
                    .body(Body::from(body))
                    .unwrap_or_default()
            }
        }
    };
    let status = {
        let p = Arc::clone(probe);
        move |headers: HeaderMap| {
            let p = Arc::clone(&p);
            async move {
                let n = p.start().await;
                let code = headers
                    .get("x-want-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u16>().ok())
                    .and_then(|v| StatusCode::from_u16(v).ok())
                    .unwrap_or(StatusCode::OK);
                (code, format!("status {} run {n}", code.as_u16())).into_response()
            }
        }
    };
    let big = {
        let p = Arc::clone(probe);
        move |headers: HeaderMap| {
            let p = Arc::clone(&p);
            async move {
                let n = p.start().await;
                let size: usize = headers
                    .get("x-size")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let body: Vec<u8> = (0..size).map(|i| b'a' + ((i + n) % 26) as u8).collect();
                (StatusCode::OK, body).into_response()
            }
        }
    };
    let validate = {
        let p = Arc::clone(probe);
        move || {
            let p = Arc::clone(&p);
            async move {
                p.start().await;
                (
                    StatusCode::BAD_REQUEST,
                    axum::Extension(DoNotStore),
                    "amount is missing",
                )
                    .into_response()
            }
        }
    };
    Router::new()
        .route(
            "/pay",
            post(pay.clone())
                .patch(pay.clone())
                .get(|| async { "listing" }),
        )
        .route("/other", post(pay))
        .route("/status", post(status))
        .route("/big", post(big))
        .route("/validate", post(validate))
}

pub(crate) fn layer(env: &TestEnv) -> IdempotencyLayer {
    IdempotencyLayer::from_arc(env.store()).with_lease(LEASE)
}

pub(crate) fn manual_layer(env: &TestEnv) -> (IdempotencyLayer, ManualClock) {
    let manual = ManualClock::new();
    let layer = layer(env).with_clock(WallClock::from_clock(manual.clock()));
    (layer, manual)
}

pub(crate) async fn http(probe: &Arc<Probe>, layer: IdempotencyLayer) -> Http {
    Http::new(serve(app(probe, layer)).await)
}

pub(crate) fn unique_key(tag: &str) -> String {
    format!("{tag}-{:016x}", rand_u64())
}

fn rand_u64() -> u64 {
    LeaseToken::random().0 as u64
}

// 1 ---------------------------------------------------------------------------------------

pub(crate) async fn b01_missing_key_is_400(env: &TestEnv) {
    let probe = Probe::new();
    let client = http(&probe, layer(env)).await;
    let r = client
        .send(
            Method::POST,
            "/pay",
            &[("content-type", "application/json")],
            "{}",
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.problem_type(), problem::MISSING_KEY);
    assert_eq!(probe.runs(), 0, "the handler must not run");
    // Methods the layer does not cover pass through without a key.
    let r = client.send(Method::GET, "/pay", &[], "").await;
    assert_eq!(r.status, StatusCode::OK);
    // An optional key lets the request through unprotected.
    let client = http(&probe, layer(env).with_key_required(false)).await;
    let r = client.send(Method::POST, "/pay", &[], "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(probe.runs(), 1);
}

// 2 ---------------------------------------------------------------------------------------

pub(crate) async fn b02_malformed_key_is_400(env: &TestEnv) {
    let probe = Probe::new();
    let client = http(&probe, layer(env)).await;
    let too_long = format!("\"{}\"", "k".repeat(256));
    let cases: Vec<Vec<&str>> = vec![
        vec!["bare-token"],
        vec!["42"],
        vec!["\"\""],
        vec![too_long.as_str()],
        vec!["\"unterminated"],
        vec!["\"a\", \"b\""],
        vec!["\"same\"", "\"same\""],
    ];
    for values in cases {
        let mut headers: Vec<(&str, &str)> =
            values.iter().map(|v| ("idempotency-key", *v)).collect();
        headers.push(("content-type", "application/json"));
        let r = client.send(Method::POST, "/pay", &headers, "{}").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{values:?}");
        assert_eq!(r.problem_type(), problem::MALFORMED_KEY, "{values:?}");
    }
    assert_eq!(probe.runs(), 0, "the handler must not run");
    // 255 characters is still fine.
    let longest = "k".repeat(255);
    let r = client.post("/pay", &longest, "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
}

// 3 ---------------------------------------------------------------------------------------

pub(crate) async fn b03_first_runs_duplicate_replays_byte_for_byte(env: &TestEnv) {
    let probe = Probe::new();
    let client = http(&probe, layer(env)).await;
    let key = unique_key("b03");
    let first = client
        .post("/pay", &key, r#"{"amount":10,"currency":"EUR"}"#)
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.headers["x-exec"], "1");
    // The same request, its JSON keys in another order: the same fingerprint.
    let again = client
        .post("/pay", &key, r#"{ "currency":"EUR", "amount":10 }"#)
        .await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed(), "missing Idempotent-Replayed: {again:?}");
    assert_eq!(again.body, first.body, "replay must be byte for byte");
    // Every end-to-end header comes back (the handler's own x-exec too), but not the
    // first caller's cookie.
    for h in ["content-type", "location", "etag", "x-exec"] {
        assert_eq!(again.headers.get(h), first.headers.get(h), "{h}");
    }
    assert!(
        again.headers.get("set-cookie").is_none(),
        "set-cookie is never replayed by default"
    );
    assert_eq!(probe.runs(), 1);
    // A new key runs again.
    let other = client
        .post("/pay", &unique_key("b03"), r#"{"amount":10}"#)
        .await;
    assert!(!other.replayed());
    assert_eq!(probe.runs(), 2);
}

// 4 ---------------------------------------------------------------------------------------

pub(crate) async fn b04_in_flight_duplicate_is_409(env: &TestEnv) {
    let probe = Probe::gated();
    let client = http(&probe, layer(env)).await;
    let key = unique_key("b04");
    let first = tokio::spawn({
        let (client, key) = (client.clone(), key.clone());
        async move { client.post("/pay", &key, "{}").await }
    });
    probe.entered.notified().await;
    let dup = client.post("/pay", &key, "{}").await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.problem_type(), problem::IN_FLIGHT);
    assert!(dup.headers.get("retry-after").is_some());
    probe.open_gate();
    let first = first.await.expect("first");
    assert_eq!(first.status, StatusCode::CREATED);
    let later = client.post("/pay", &key, "{}").await;
    assert!(later.replayed());
    assert_eq!(later.body, first.body);
    assert_eq!(probe.runs(), 1);
}

/// Delegates to the test's store and tells when a `begin` found the key in flight.
struct Spy {
    inner: Arc<dyn Store>,
    saw_in_flight: Notify,
}

impl Store for Spy {
    fn begin<'a>(
        &'a self,
        req: BeginRequest<'a>,
    ) -> stormguard_idempotency::store::StoreFuture<'a, Begin> {
        Box::pin(async move {
            let r = self.inner.begin(req).await;
            if matches!(r, Ok(Begin::InFlight { .. })) {
                self.saw_in_flight.notify_one();
            }
            r
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a ScopedKey,
        token: LeaseToken,
        completion: &'a Completion,
        now: i64,
        expires_at: i64,
    ) -> stormguard_idempotency::store::StoreFuture<'a, Finish> {
        self.inner.complete(key, token, completion, now, expires_at)
    }

    fn release<'a>(
        &'a self,
        key: &'a ScopedKey,
        token: LeaseToken,
    ) -> stormguard_idempotency::store::StoreFuture<'a, Finish> {
        self.inner.release(key, token)
    }

    fn reap(
        &self,
        now: i64,
        limit: u32,
    ) -> stormguard_idempotency::store::StoreFuture<'_, stormguard_idempotency::Reaped> {
        self.inner.reap(now, limit)
    }
}

pub(crate) async fn b04_in_flight_duplicate_can_wait_for_the_result(env: &TestEnv) {
    let probe = Probe::gated();
    let spy = Arc::new(Spy {
        inner: env.store(),
        saw_in_flight: Notify::new(),
    });
    let layer = IdempotencyLayer::from_arc(spy.clone())
        .with_lease(LEASE)
        .with_in_flight(InFlight::Wait {
            max: Duration::from_secs(20),
            poll: Duration::from_millis(5),
        });
    let client = http(&probe, layer).await;
    let key = unique_key("b04w");
    let first = tokio::spawn({
        let (client, key) = (client.clone(), key.clone());
        async move { client.post("/pay", &key, "{}").await }
    });
    probe.entered.notified().await;
    let waiter = tokio::spawn({
        let (client, key) = (client.clone(), key.clone());
        async move { client.post("/pay", &key, "{}").await }
    });
    // The waiter has found the key in flight (and is now polling) before the first finishes.
    spy.saw_in_flight.notified().await;
    probe.open_gate();
    let first = first.await.expect("first");
    let waited = waiter.await.expect("waiter");
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(waited.status, StatusCode::CREATED, "{waited:?}");
    assert!(waited.replayed());
    assert_eq!(waited.body, first.body);
    assert_eq!(probe.runs(), 1);

    // A bounded wait: still 409 when the holder outlasts it.
    let probe = Probe::gated();
    let layer = self::layer(env).with_in_flight(InFlight::Wait {
        max: Duration::from_millis(50),
        poll: Duration::from_millis(5),
    });
    let client = http(&probe, layer).await;
    let key = unique_key("b04w2");
    let first = tokio::spawn({
        let (client, key) = (client.clone(), key.clone());
        async move { client.post("/pay", &key, "{}").await }
    });
    probe.entered.notified().await;
    let dup = client.post("/pay", &key, "{}").await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    probe.open_gate();
    assert_eq!(first.await.expect("first").status, StatusCode::CREATED);
}

// 5 ---------------------------------------------------------------------------------------

pub(crate) async fn b05_other_fingerprint_is_422(env: &TestEnv) {
    let probe = Probe::new();
    let client = http(&probe, layer(env)).await;
    let key = unique_key("b05");
    let first = client.post("/pay", &key, r#"{"amount":10}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let body = client.post("/pay", &key, r#"{"amount":11}"#).await;
    assert_eq!(body.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body.problem_type(), problem::KEY_REUSED);
    let path = client.post("/other", &key, r#"{"amount":10}"#).await;
    assert_eq!(path.status, StatusCode::UNPROCESSABLE_ENTITY);
    let k = format!("\"{key}\"");
    let method = client
        .send(
            Method::PATCH,
            "/pay",
            &[
                ("idempotency-key", &k),
                ("content-type", "application/json"),
            ],
            r#"{"amount":10}"#,
        )
        .await;
    assert_eq!(method.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(probe.runs(), 1, "the handler must not run on a mismatch");

    // A user-extended fingerprint: a header joins the fingerprint.
    let probe = Probe::new();
    let fp = stormguard_idempotency::DefaultFingerprinter::new()
        .with_header(http::HeaderName::from_static("x-api-version"));
    let client = http(&probe, layer(env).with_fingerprinter(fp)).await;
    let key = unique_key("b05h");
    let k = format!("\"{key}\"");
    let v1 = client
        .send(
            Method::POST,
            "/pay",
            &[("idempotency-key", &k), ("x-api-version", "1")],
            "{}",
        )
        .await;
    assert_eq!(v1.status, StatusCode::CREATED);
    let v2 = client
        .send(
            Method::POST,
            "/pay",
            &[("idempotency-key", &k), ("x-api-version", "2")],
            "{}",
        )
        .await;
    assert_eq!(v2.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(probe.runs(), 1);
}

// 6 ---------------------------------------------------------------------------------------

pub(crate) async fn b06_tenants_are_isolated(env: &TestEnv) {
    let probe = Probe::new();
    let layer = layer(env).with_tenant(|parts| {
        parts
            .headers
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    let client = http(&probe, layer).await;
    let key = unique_key("b06");
    let k = format!("\"{key}\"");
    let send = |tenant: &'static str| {
        let (client, k) = (client.clone(), k.clone());
        async move {
            client
                .send(
                    Method::POST,
                    "/pay",
                    &[("idempotency-key", &k), ("x-tenant", tenant)],
                    "{}",
                )
                .await
        }
    };
    let a = send("tenant-a").await;
    let b = send("tenant-b").await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!a.replayed() && !b.replayed());
    assert_ne!(a.body, b.body, "each tenant ran its own request");
    assert_eq!(probe.runs(), 2);
    let a2 = send("tenant-a").await;
    let b2 = send("tenant-b").await;
    assert!(a2.replayed() && b2.replayed());
    assert_eq!(a2.body, a.body, "tenant a gets its own response");
    assert_eq!(b2.body, b.body, "tenant b gets its own response");
    assert_eq!(probe.runs(), 2);
    // No principal: refused, nothing runs.
    let none = client
        .send(Method::POST, "/pay", &[("idempotency-key", &k)], "{}")
        .await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.problem_type(), problem::NO_TENANT);
    assert_eq!(probe.runs(), 2);
}

// 7 ---------------------------------------------------------------------------------------

pub(crate) fn pay_request(key: &str) -> Request<Body> {
    Request::post("/pay")
        .header("idempotency-key", format!("\"{key}\""))
        .header("content-type", "application/json")
        .body(Body::from("{\"amount\":5}"))
        .unwrap_or_default()
}

pub(crate) async fn read(res: Response) -> (StatusCode, HeaderMap, Bytes) {
    let (parts, body) = res.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.expect("body");
    (parts.status, parts.headers, body)
}
