//! The behaviours of issue 18, on every store: one-to-one tenant scopes, number-exact JSON
//! fingerprints, leases that follow the request's deadline, replayed headers, and what the
//! client gets when the store fails after the handler ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{HeaderMap, HeaderName, Request, StatusCode};
use sha2::{Digest as _, Sha256};
use stormguard::deadline::WallClock;
use stormguard::deadline::{self, Deadline};
use stormguard_idempotency::store::StoreFuture;
use stormguard_idempotency::{
    Begin, BeginRequest, Completion, Finish, IdempotencyLayer, LeaseToken, Reaped, ReplayedHeaders,
    ScopedKey, Store, StoreError, problem,
};
use tower::ServiceExt as _;

use crate::suite::{LEASE, Probe, app, http, layer, manual_layer, pay_request, read, unique_key};
use crate::support::{Fault, FaultyStore, TestEnv};

/// The layer's default margin after a deadline.
const MARGIN: Duration = Duration::from_secs(1);

async fn call(router: &Router, req: Request<Body>) -> (StatusCode, HeaderMap, Bytes) {
    read(router.clone().oneshot(req).await.expect("infallible")).await
}

fn post_with(key: &str, headers: &[(&str, &str)], body: &str) -> Request<Body> {
    let mut req = Request::post("/pay")
        .header("idempotency-key", format!("\"{key}\""))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Body::from(body.to_owned())).unwrap_or_default()
}

fn problem_type(body: &Bytes) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).expect("problem json");
    v["type"].as_str().unwrap_or_default().to_owned()
}

// 1 ---------------------------------------------------------------------------------------

/// A tenant longer than 255 bytes is stored as `sha256:<hex>`; a short tenant that spells
/// exactly that string must not share its scope (it used to receive the long tenant's
/// stored response).
pub(crate) async fn h01_a_tenant_spelling_a_hash_gets_its_own_scope(env: &TestEnv) {
    let probe = Probe::new();
    let layer = layer(env).with_tenant(|parts| {
        parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    let client = http(&probe, layer).await;
    let long = "k".repeat(300);
    let spoof = format!(
        "sha256:{}",
        Sha256::digest(long.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let key = format!("\"{}\"", unique_key("h01"));
    let send = |tenant: String| {
        let (client, key) = (client.clone(), key.clone());
        async move {
            client
                .send(
                    http::Method::POST,
                    "/pay",
                    &[("idempotency-key", &key), ("x-api-key", &tenant)],
                    "{}",
                )
                .await
        }
    };
    let first = send(long.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = send(spoof).await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert!(
        !other.replayed(),
        "another tenant received the long tenant's stored response"
    );
    assert_ne!(other.body, first.body);
    assert_eq!(probe.runs(), 2);
    // The long tenant itself still gets its own replay.
    let again = send(long).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
}

// 2 ---------------------------------------------------------------------------------------

/// JSON bodies that differ only past f64 precision are different requests: 422, not a replay.
pub(crate) async fn h02_json_numbers_keep_every_digit(env: &TestEnv) {
    let probe = Probe::new();
    let client = http(&probe, layer(env)).await;
    for (first, second) in [
        (
            r#"{"amount":100000000000000000001}"#,
            r#"{"amount":100000000000000000002}"#,
        ),
        (r#"{"amount":0.1}"#, r#"{"amount":0.10000000000000001}"#),
    ] {
        let key = unique_key("h02");
        let a = client.post("/pay", &key, first).await;
        assert_eq!(a.status, StatusCode::CREATED);
        let b = client.post("/pay", &key, second).await;
        assert_eq!(
            b.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{second} was answered with the stored response of {first}"
        );
        assert_eq!(b.problem_type(), problem::KEY_REUSED);
    }
    // Key order and whitespace still do not matter, big numbers or not.
    let key = unique_key("h02o");
    let a = client
        .post(
            "/pay",
            &key,
            r#"{"amount":100000000000000000001,"currency":"EUR"}"#,
        )
        .await;
    let b = client
        .post(
            "/pay",
            &key,
            r#"{ "currency" : "EUR", "amount" : 100000000000000000001 }"#,
        )
        .await;
    assert!(b.replayed());
    assert_eq!(a.body, b.body);
    assert_eq!(probe.runs(), 3);
}

// 3 ---------------------------------------------------------------------------------------

/// With `DeadlineLayer` upstream (the task's current deadline), a request's lease ends a
/// margin after its deadline, not after the configured 30 s: the client's retry after its
/// deadline takes over.
pub(crate) async fn h03_the_lease_follows_the_current_deadline(env: &TestEnv) {
    let probe = Probe::hanging();
    let (layer, manual) = manual_layer(env);
    let router = app(&probe, layer);
    let key = unique_key("h03");
    let deadline = Deadline::after(Duration::from_secs(2), manual.clock());
    // The first attempt is cancelled at its deadline (DeadlineLayer drops the handler).
    let holder = tokio::spawn(deadline::scope(
        deadline,
        router.clone().oneshot(pay_request(&key)),
    ));
    probe.entered.notified().await;
    holder.abort();
    let _ = holder.await;
    manual.advance(Duration::from_secs(2) + MARGIN - Duration::from_millis(1));
    let (status, _, _) = call(&router, pay_request(&key)).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "deadline + margin not yet over"
    );
    manual.advance(Duration::from_millis(2));
    let (status, headers, _) = call(&router, pay_request(&key)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a retry after the deadline and its margin takes the key over (not {LEASE:?} later)"
    );
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(probe.runs(), 2);
}

/// Without `DeadlineLayer`, the request's deadline header bounds the lease, and this layer
/// enforces it: the handler is cut at the deadline (504), and an already expired request is
/// refused before anything runs.
pub(crate) async fn h03_the_lease_follows_a_deadline_header(env: &TestEnv) {
    let probe = Probe::hanging();
    let (layer, manual) = manual_layer(env);
    let router = app(&probe, layer);
    let key = unique_key("h03h");
    let holder = tokio::spawn(router.clone().oneshot(post_with(
        &key,
        &[("grpc-timeout", "2S")],
        "{\"amount\":5}",
    )));
    probe.entered.notified().await;
    holder.abort();
    let _ = holder.await;
    manual.advance(Duration::from_secs(1));
    let (status, _, _) = call(&router, pay_request(&key)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    manual.advance(Duration::from_secs(2) + MARGIN);
    let (status, _, _) = call(&router, pay_request(&key)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "taken over after deadline + margin"
    );
    assert_eq!(probe.runs(), 2);

    // Enforced: a hanging handler is cut at its 50 ms deadline.
    let probe = Probe::hanging();
    let (layer, manual) = manual_layer(env);
    let router = app(&probe, layer);
    let key = unique_key("h03e");
    let (status, _, body) = call(
        &router,
        post_with(&key, &[("grpc-timeout", "50m")], "{\"amount\":5}"),
    )
    .await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(problem_type(&body), problem::DEADLINE_EXCEEDED);
    manual.advance(Duration::from_millis(50) + MARGIN + Duration::from_millis(1));
    let (status, _, _) = call(&router, pay_request(&key)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(probe.runs(), 2);

    // Already expired on arrival (an absolute deadline one second ago): refused, not run.
    let past = (WallClock::from_clock(manual.clock()).now_millis() - 1_000).to_string();
    let (status, _, body) = call(
        &router,
        post_with(&unique_key("h03x"), &[("x-request-deadline", &past)], "{}"),
    )
    .await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(problem_type(&body), problem::DEADLINE_EXCEEDED);
    assert_eq!(probe.runs(), 2);
}

// 8 ---------------------------------------------------------------------------------------

fn header_app(probe: &Arc<Probe>, layer: IdempotencyLayer) -> Router {
    let p = Arc::clone(probe);
    Router::new()
        .route(
            "/pay",
            post(move || {
                let p = Arc::clone(&p);
                async move {
                    let n = p.start().await;
                    Response::builder()
                        .status(StatusCode::CREATED)
                        .header("content-type", "application/json")
                        .header("x-exec", n.to_string())
                        .header("x-trace", "a")
                        .header("x-trace", "b")
                        .header("set-cookie", "session=secret")
                        .header("connection", "x-hop")
                        .header("x-hop", "per-connection")
                        .header("keep-alive", "timeout=5")
                        .body(Body::from(format!("{{\"execution\":{n}}}")))
                        .unwrap_or_default()
                }
            }),
        )
        .route_layer(layer)
}

/// A replay carries every end-to-end header of the first answer, repeated ones included, and
/// never the hop-by-hop ones or the first caller's cookie; both lists are configurable.
pub(crate) async fn h08_replays_keep_the_handlers_headers(env: &TestEnv) {
    let probe = Probe::new();
    let router = header_app(&probe, layer(env));
    let key = unique_key("h08");
    let (_, first, _) = call(&router, pay_request(&key)).await;
    let (status, again, _) = call(&router, pay_request(&key)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(again["idempotent-replayed"], "true");
    assert_eq!(again.get("x-exec"), first.get("x-exec"));
    assert_eq!(again["content-type"], "application/json");
    let traces: Vec<_> = again.get_all("x-trace").iter().collect();
    assert_eq!(traces, ["a", "b"]);
    for dropped in ["set-cookie", "connection", "x-hop", "keep-alive"] {
        assert!(again.get(dropped).is_none(), "{dropped} was replayed");
    }
    assert_eq!(probe.runs(), 1);

    // An allow-list, and a deny-list on top of the default.
    let probe = Probe::new();
    let only = ReplayedHeaders::only([
        HeaderName::from_static("content-type"),
        HeaderName::from_static("set-cookie"),
    ]);
    let router = header_app(&probe, layer(env).with_replayed_headers(only));
    let key = unique_key("h08o");
    call(&router, pay_request(&key)).await;
    let (_, again, _) = call(&router, pay_request(&key)).await;
    assert_eq!(again["set-cookie"], "session=secret");
    assert!(again.get("x-exec").is_none());
    let without = ReplayedHeaders::end_to_end().without(HeaderName::from_static("x-trace"));
    let router = header_app(&probe, layer(env).with_replayed_headers(without));
    let key = unique_key("h08w");
    call(&router, pay_request(&key)).await;
    let (_, again, _) = call(&router, pay_request(&key)).await;
    assert!(again.get("x-trace").is_none());
    assert!(again.get("x-exec").is_some());
}

// 9 ---------------------------------------------------------------------------------------

/// `/pay` through a faulty store: the handler (execution `n`) switches the store to `fault`
/// before answering, so every store call after it meets the fault. `/status` does the same
/// and answers the status in `x-want-status`.
fn faulting_app(
    probe: &Arc<Probe>,
    faulty: &Arc<FaultyStore>,
    fault: Fault,
    layer: IdempotencyLayer,
) -> Router {
    let handler = {
        let (p, f) = (Arc::clone(probe), Arc::clone(faulty));
        move |headers: HeaderMap| {
            let (p, f) = (Arc::clone(&p), Arc::clone(&f));
            async move {
                let n = p.start().await;
                if n == 1 {
                    f.set(fault).await;
                }
                let status = headers
                    .get("x-want-status")
                    .and_then(|v| v.to_str().ok()?.parse::<u16>().ok())
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .unwrap_or(StatusCode::CREATED);
                (status, format!("{{\"execution\":{n}}}")).into_response()
            }
        }
    };
    Router::new()
        .route("/pay", post(handler))
        .route_layer(layer)
}

async fn faulty_layer(
    env: &TestEnv,
) -> (
    Arc<FaultyStore>,
    IdempotencyLayer,
    stormguard::clock::ManualClock,
) {
    let faulty = Arc::new(env.faulty_store().await);
    let manual = stormguard::clock::ManualClock::new();
    let layer = IdempotencyLayer::from_arc(Arc::clone(&faulty.store))
        .with_lease(LEASE)
        .with_clock(WallClock::from_clock(manual.clock()))
        .with_store_timeout(Duration::from_millis(400));
    (faulty, layer, manual)
}

/// `complete` fails (or hangs) after the handler ran: the client still gets the handler's
/// answer; while the store is down duplicates get 503 and while the lease holds 409, so
/// nothing runs twice; only after the lease does a retry take over, as after a crash.
async fn store_dies_before_complete(env: &TestEnv, fault: Fault) {
    let probe = Probe::new();
    let (faulty, layer, manual) = faulty_layer(env).await;
    let router = faulting_app(&probe, &faulty, fault, layer);
    let key = unique_key("h09c");
    let (status, _, body) = call(&router, pay_request(&key)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the handler's answer is not lost"
    );
    assert_eq!(body, r#"{"execution":1}"#);
    let (status, _, body) = call(&router, pay_request(&key)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(problem_type(&body), problem::STORE_UNAVAILABLE);
    faulty.set(Fault::Healthy).await;
    let (status, headers, body) = call(&router, pay_request(&key)).await;
    // A write held by a hanging store may still arrive once it heals: then the key is
    // completed after all and replays. It never runs again.
    let stored_late = fault == Fault::Hanging && status == StatusCode::CREATED;
    if stored_late {
        assert_eq!(headers["idempotent-replayed"], "true");
        assert_eq!(body, r#"{"execution":1}"#);
    } else {
        assert_eq!(
            status,
            StatusCode::CONFLICT,
            "the key stays in flight for its lease"
        );
    }
    assert_eq!(probe.runs(), 1, "nothing ran twice");
    manual.advance(LEASE + Duration::from_millis(1));
    let (status, headers, _) = call(&router, pay_request(&key)).await;
    assert_eq!(status, StatusCode::CREATED);
    if stored_late {
        assert_eq!(headers["idempotent-replayed"], "true");
        assert_eq!(probe.runs(), 1);
    } else {
        assert!(headers.get("idempotent-replayed").is_none());
        assert_eq!(
            probe.runs(),
            2,
            "after the lease, a retry takes over as after a crash"
        );
    }
}

pub(crate) async fn h09_complete_fails_after_the_handler_ran(env: &TestEnv) {
    store_dies_before_complete(env, Fault::Failing).await;
}

pub(crate) async fn h09_store_hangs_after_the_handler_ran(env: &TestEnv) {
    store_dies_before_complete(env, Fault::Hanging).await;
}

/// A store that hangs at `begin`: 503 after the store timeout, and the handler never runs.
pub(crate) async fn h09_store_hangs_at_begin(env: &TestEnv) {
    let probe = Probe::new();
    let (faulty, layer, _) = faulty_layer(env).await;
    let router = faulting_app(&probe, &faulty, Fault::Healthy, layer);
    faulty.set(Fault::Hanging).await;
    let (status, _, body) = call(&router, pay_request(&unique_key("h09b"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(problem_type(&body), problem::STORE_UNAVAILABLE);
    assert_eq!(probe.runs(), 0);
    faulty.set(Fault::Healthy).await;
}

/// `release` fails after an answer that is not stored (500): the client gets the 500;
/// duplicates get 503, then 409 until the lease ends, then run again (the outcome was never
/// stored, so running again is what a retry is for).
pub(crate) async fn h09_release_fails_after_the_handler_ran(env: &TestEnv) {
    let probe = Probe::new();
    let (faulty, layer, manual) = faulty_layer(env).await;
    let router = faulting_app(&probe, &faulty, Fault::Failing, layer);
    let key = unique_key("h09r");
    let failing = || post_with(&key, &[("x-want-status", "500")], "{}");
    let (status, _, body) = call(&router, failing()).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body, r#"{"execution":1}"#);
    let (status, _, _) = call(&router, failing()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    faulty.set(Fault::Healthy).await;
    let (status, _, _) = call(&router, failing()).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(probe.runs(), 1);
    manual.advance(LEASE + Duration::from_millis(1));
    let (status, _, body) = call(&router, failing()).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body, r#"{"execution":2}"#);
}

/// A stored record that no longer decodes: duplicates get 503 (fail closed), nothing is
/// replayed and nothing runs again.
pub(crate) async fn h09_a_corrupt_record_fails_closed(env: &TestEnv) {
    let probe = Probe::new();
    let router = app(&probe, layer(env));
    let key = unique_key("h09x");
    let (status, _, _) = call(&router, pay_request(&key)).await;
    assert_eq!(status, StatusCode::CREATED);
    let scoped = ScopedKey::new(
        "",
        stormguard::retry::IdempotencyKey::new(&key).expect("key"),
    );
    env.corrupt(&scoped).await;
    for _ in 0..2 {
        let (status, headers, body) = call(&router, pay_request(&key)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(problem_type(&body), problem::STORE_UNAVAILABLE);
        assert!(headers.get("idempotent-replayed").is_none());
    }
    assert_eq!(probe.runs(), 1);
}

/// The handler's response body fails: the client gets 502; the request was processed, so a
/// retry with the key gets 409 "response not stored" instead of running it again.
pub(crate) async fn h09_a_failing_response_body_is_not_run_again(env: &TestEnv) {
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = Arc::clone(&runs);
        move || {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                    Ok(Bytes::from_static(b"{\"partial\":")),
                    Err(std::io::Error::other(format!("upstream reset in run {n}"))),
                ];
                (
                    StatusCode::CREATED,
                    Body::from_stream(futures::stream::iter(chunks)),
                )
                    .into_response()
            }
        }
    };
    let router = Router::new()
        .route("/pay", post(handler))
        .route_layer(layer(env));
    let key = unique_key("h09f");
    let (status, _, body) = call(&router, pay_request(&key)).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(problem_type(&body), problem::BAD_RESPONSE);
    let (status, headers, body) = call(&router, pay_request(&key)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem_type(&body), problem::RESPONSE_NOT_STORED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

/// Delegates to a store, failing the first `complete` with a backend error.
struct FirstCompleteFails {
    inner: Arc<dyn Store>,
    failed: AtomicUsize,
}

impl Store for FirstCompleteFails {
    fn begin<'a>(&'a self, req: BeginRequest<'a>) -> StoreFuture<'a, Begin> {
        self.inner.begin(req)
    }

    fn complete<'a>(
        &'a self,
        key: &'a ScopedKey,
        token: LeaseToken,
        completion: &'a Completion,
        now: i64,
        expires_at: i64,
    ) -> StoreFuture<'a, Finish> {
        if self.failed.fetch_add(1, Ordering::SeqCst) == 0 {
            return Box::pin(async {
                Err(StoreError::backend(std::io::Error::other(
                    "connection reset by peer",
                )))
            });
        }
        self.inner.complete(key, token, completion, now, expires_at)
    }

    fn release<'a>(&'a self, key: &'a ScopedKey, token: LeaseToken) -> StoreFuture<'a, Finish> {
        self.inner.release(key, token)
    }

    fn reap(&self, now: i64, limit: u32) -> StoreFuture<'_, Reaped> {
        self.inner.reap(now, limit)
    }
}

/// A `complete` that fails once (a dropped connection) is tried again, so the response is
/// stored and replayed instead of leaving the key in flight for its whole lease.
pub(crate) async fn h09_a_transient_complete_failure_is_retried(env: &TestEnv) {
    let probe = Probe::new();
    let store = Arc::new(FirstCompleteFails {
        inner: env.store(),
        failed: AtomicUsize::new(0),
    });
    let router = app(
        &probe,
        IdempotencyLayer::from_arc(store.clone()).with_lease(LEASE),
    );
    let key = unique_key("h09t");
    let (_, _, first) = call(&router, pay_request(&key)).await;
    let (status, headers, again) = call(&router, pay_request(&key)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(again, first);
    assert_eq!(
        store.failed.load(Ordering::SeqCst),
        2,
        "one failure, one retry"
    );
    assert_eq!(probe.runs(), 1);
}
