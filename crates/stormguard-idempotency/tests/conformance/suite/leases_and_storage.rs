//! Behaviours 7 to 12: leases and fencing, what is stored and for how long, store failures,
//! oversized responses, and duplicates under load.

use super::*;

pub(crate) async fn b07_crashed_holder_lease_expires_and_a_retry_takes_over(env: &TestEnv) {
    let probe = Probe::hanging();
    let (layer, manual) = manual_layer(env);
    let router = app(&probe, layer);
    let key = unique_key("b07");
    // The holder "crashes": its request is in the handler when its task is killed.
    let holder = tokio::spawn(router.clone().oneshot(pay_request(&key)));
    probe.entered.notified().await;
    holder.abort();
    assert!(holder.await.expect_err("aborted").is_cancelled());
    // Within the lease: 409.
    let (status, _, _) = read(
        router
            .clone()
            .oneshot(pay_request(&key))
            .await
            .expect("infallible"),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    manual.advance(LEASE - Duration::from_millis(1));
    let (status, _, _) = read(
        router
            .clone()
            .oneshot(pay_request(&key))
            .await
            .expect("infallible"),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "lease not yet expired");
    // After the lease: the retry takes over and runs.
    manual.advance(Duration::from_millis(2));
    let (status, headers, body) = read(
        router
            .clone()
            .oneshot(pay_request(&key))
            .await
            .expect("infallible"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(probe.runs(), 2);
    // And its result is what later duplicates get.
    let (status, headers, again) = read(
        router
            .clone()
            .oneshot(pay_request(&key))
            .await
            .expect("infallible"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(again, body);
    assert_eq!(probe.runs(), 2);
}

pub(crate) async fn b07_stale_holder_cannot_complete(env: &TestEnv) {
    let probe = Probe::gated();
    let (layer, manual) = manual_layer(env);
    let router = app(&probe, layer);
    let key = unique_key("b07s");
    // A slow holder, not a dead one: it is still in the handler when its lease expires.
    let stale = tokio::spawn(router.clone().oneshot(pay_request(&key)));
    probe.entered.notified().await;
    manual.advance(LEASE + Duration::from_millis(1));
    let (status, _, new_body) = read(
        router
            .clone()
            .oneshot(pay_request(&key))
            .await
            .expect("infallible"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "the retry takes over");
    // The stale holder finishes now; its completion must be refused by the fencing token.
    probe.open_gate();
    let (status, _, stale_body) = read(stale.await.expect("join").expect("infallible")).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "its own client still gets its answer"
    );
    assert_ne!(stale_body, new_body);
    let (_, headers, replay) = read(
        router
            .clone()
            .oneshot(pay_request(&key))
            .await
            .expect("infallible"),
    )
    .await;
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        replay, new_body,
        "the record is the new holder's, not the stale one's"
    );
    assert_eq!(probe.runs(), 2);
}

pub(crate) fn scoped(tag: &str) -> ScopedKey {
    ScopedKey::new(
        "tenant",
        IdempotencyKey::new(&unique_key(tag)).expect("key"),
    )
}

pub(crate) fn fp(n: u8) -> Fingerprint {
    Fingerprint([n; 32])
}

pub(crate) fn begin_at<'a>(
    key: &'a ScopedKey,
    f: &'a Fingerprint,
    token: LeaseToken,
    now: i64,
) -> BeginRequest<'a> {
    BeginRequest {
        key,
        fingerprint: f,
        token,
        now,
        lease_until: now + 1_000,
        expires_at: now + 100_000,
    }
}

pub(crate) fn response(body: &'static str) -> Completion {
    Completion::Response(StoredResponse {
        status: StatusCode::OK,
        headers: vec![(
            http::HeaderName::from_static("content-type"),
            http::HeaderValue::from_static("text/plain"),
        )],
        body: Bytes::from_static(body.as_bytes()),
    })
}

pub(crate) async fn b07_store_level_fencing(env: &TestEnv) {
    let store = env.store();
    let t0 = WallClock::system().now_millis();
    let key = scoped("b07f");
    let f = fp(7);
    let a = LeaseToken::random();
    let b = LeaseToken::random();
    let c = LeaseToken::random();
    assert_eq!(
        store
            .begin(begin_at(&key, &f, a, t0))
            .await
            .expect("begin a"),
        Begin::Acquired { took_over: false }
    );
    assert!(
        matches!(store.begin(begin_at(&key, &f, b, t0 + 999)).await.expect("b early"), Begin::InFlight { lease_until } if lease_until == t0 + 1_000)
    );
    assert_eq!(
        store
            .begin(begin_at(&key, &f, b, t0 + 1_000))
            .await
            .expect("b takes over"),
        Begin::Acquired { took_over: true }
    );
    // A third caller sees b's live lease, not a's.
    assert!(matches!(
        store
            .begin(begin_at(&key, &f, c, t0 + 1_500))
            .await
            .expect("c"),
        Begin::InFlight { .. }
    ));
    // a is stale: it can neither complete nor release.
    assert_eq!(
        store
            .complete(&key, a, &response("from a"), t0 + 1_600, t0 + 100_000)
            .await
            .expect("a"),
        Finish::LeaseLost
    );
    assert_eq!(
        store.release(&key, a).await.expect("a release"),
        Finish::LeaseLost
    );
    assert_eq!(
        store
            .complete(&key, b, &response("from b"), t0 + 1_700, t0 + 100_000)
            .await
            .expect("b"),
        Finish::Done
    );
    // Completing twice is refused too.
    assert_eq!(
        store
            .complete(&key, b, &response("again"), t0 + 1_800, t0 + 100_000)
            .await
            .expect("b twice"),
        Finish::LeaseLost
    );
    assert_eq!(
        store
            .begin(begin_at(&key, &f, c, t0 + 2_000))
            .await
            .expect("replay"),
        Begin::Completed(response("from b"))
    );
    // After a release and a fresh begin, the old token does not match the new record.
    let key2 = scoped("b07r");
    assert_eq!(
        store.begin(begin_at(&key2, &f, a, t0)).await.expect("a"),
        Begin::Acquired { took_over: false }
    );
    assert_eq!(
        store.release(&key2, a).await.expect("release"),
        Finish::Done
    );
    assert_eq!(
        store.begin(begin_at(&key2, &f, b, t0)).await.expect("b"),
        Begin::Acquired { took_over: false }
    );
    assert_eq!(
        store
            .complete(&key2, a, &response("a"), t0, t0 + 100_000)
            .await
            .expect("a"),
        Finish::LeaseLost
    );
    // Mismatch is reported for in-flight and completed records alike.
    assert_eq!(
        store
            .begin(begin_at(&key2, &fp(8), c, t0))
            .await
            .expect("mismatch"),
        Begin::Mismatch
    );
    assert_eq!(
        store
            .begin(begin_at(&key, &fp(8), c, t0 + 2_000))
            .await
            .expect("mismatch"),
        Begin::Mismatch
    );
}

// 8 ---------------------------------------------------------------------------------------

pub(crate) async fn b08_refusals_before_the_handler_are_not_stored(env: &TestEnv) {
    // Authentication outside the layer (the recommended order): a refusal never reaches it.
    let probe = Probe::new();
    let inner = app(
        &probe,
        layer(env).with_store_policy(StorePolicy::success_only().with_client_errors(true)),
    );
    let guarded = inner.layer(axum::middleware::from_fn(
        |req: Request<Body>, next: axum::middleware::Next| async move {
            if req.headers().get("authorization").is_none() {
                return StatusCode::UNAUTHORIZED.into_response();
            }
            next.run(req).await
        },
    ));
    let client = Http::new(serve(guarded).await);
    let key = unique_key("b08");
    let k = format!("\"{key}\"");
    let r = client
        .send(Method::POST, "/pay", &[("idempotency-key", &k)], "{}")
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = client
        .send(
            Method::POST,
            "/pay",
            &[("idempotency-key", &k), ("authorization", "Bearer t")],
            "{}",
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(!r.replayed(), "the refused attempt did not consume the key");
    assert_eq!(probe.runs(), 1);

    // A rate limiter and validation *inside* the layer: 429 is never stored, nor a response
    // marked DoNotStore, even with 4xx storage on; the key is released and a retry runs.
    let probe = Probe::new();
    let limited = Arc::new(AtomicUsize::new(1));
    let router = routes(&probe)
        .route_layer(axum::middleware::from_fn(
            move |req: Request<Body>, next: axum::middleware::Next| {
                let limited = Arc::clone(&limited);
                async move {
                    if limited.fetch_sub(1, Ordering::SeqCst) > 0 {
                        return StatusCode::TOO_MANY_REQUESTS.into_response();
                    }
                    next.run(req).await
                }
            },
        ))
        // Added last, so it wraps the limiter.
        .route_layer(
            layer(env).with_store_policy(StorePolicy::success_only().with_client_errors(true)),
        );
    let client = Http::new(serve(router).await);
    let key = unique_key("b08r");
    let first = client.post("/pay", &key, "{}").await;
    assert_eq!(first.status, StatusCode::TOO_MANY_REQUESTS);
    let second = client.post("/pay", &key, "{}").await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(!second.replayed());
    assert_eq!(probe.runs(), 1);

    let probe = Probe::new();
    let client = http(
        &probe,
        layer(env).with_store_policy(StorePolicy::success_only().with_client_errors(true)),
    )
    .await;
    let key = unique_key("b08v");
    for _ in 0..2 {
        let r = client.post("/validate", &key, "{}").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert!(!r.replayed());
    }
    assert_eq!(probe.runs(), 2, "a DoNotStore refusal releases the key");
}

async fn status_twice(
    client: &Http,
    status: u16,
) -> (crate::support::Reply, crate::support::Reply) {
    let key = format!("\"{}\"", unique_key("b08s"));
    let s = status.to_string();
    let h = [
        ("idempotency-key", key.as_str()),
        ("x-want-status", s.as_str()),
    ];
    let a = client.send(Method::POST, "/status", &h, "").await;
    let b = client.send(Method::POST, "/status", &h, "").await;
    assert_eq!(a.status.as_u16(), status);
    assert_eq!(b.status.as_u16(), status);
    (a, b)
}

pub(crate) async fn b08_stored_statuses_are_configurable(env: &TestEnv) {
    // Default: 2xx stored; 4xx and 5xx run again.
    let probe = Probe::new();
    let client = http(&probe, layer(env)).await;
    let (_, b) = status_twice(&client, 200).await;
    assert!(b.replayed());
    assert_eq!(probe.runs(), 1);
    let (_, b) = status_twice(&client, 400).await;
    assert!(!b.replayed());
    assert_eq!(probe.runs(), 3);
    let (_, b) = status_twice(&client, 500).await;
    assert!(!b.replayed());
    assert_eq!(probe.runs(), 5);
    // Client errors stored; server errors still not.
    let probe = Probe::new();
    let policy = StorePolicy::success_only().with_client_errors(true);
    let client = http(&probe, layer(env).with_store_policy(policy)).await;
    let (a, b) = status_twice(&client, 409).await;
    assert!(b.replayed());
    assert_eq!(a.body, b.body);
    assert_eq!(probe.runs(), 1);
    let (_, b) = status_twice(&client, 503).await;
    assert!(!b.replayed());
    assert_eq!(probe.runs(), 3);
    // 401/403/429 are never stored.
    let (_, b) = status_twice(&client, 403).await;
    assert!(!b.replayed());
    assert_eq!(probe.runs(), 5);
    // Server errors stored when asked to.
    let probe = Probe::new();
    let policy = StorePolicy::success_only().with_server_errors(true);
    let client = http(&probe, layer(env).with_store_policy(policy)).await;
    let (a, b) = status_twice(&client, 500).await;
    assert!(b.replayed());
    assert_eq!(a.body, b.body);
    assert_eq!(probe.runs(), 1);
    let (_, b) = status_twice(&client, 422).await;
    assert!(!b.replayed());
}

// 9 ---------------------------------------------------------------------------------------

pub(crate) async fn b09_keys_expire_after_retention(env: &TestEnv) {
    let probe = Probe::new();
    let (layer, manual) = manual_layer(env);
    let client = http(&probe, layer).await; // default retention: 24 h
    let key = unique_key("b09");
    let first = client.post("/pay", &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    manual.advance(Duration::from_secs(24 * 3600) - Duration::from_secs(1));
    let replay = client.post("/pay", &key, "{}").await;
    assert!(replay.replayed(), "still within retention");
    manual.advance(Duration::from_secs(2));
    let rerun = client.post("/pay", &key, "{}").await;
    assert_eq!(rerun.status, StatusCode::CREATED);
    assert!(!rerun.replayed(), "expired key runs again");
    assert_eq!(probe.runs(), 2);
    // An expired key may even be reused for another request.
    manual.advance(Duration::from_secs(24 * 3600 + 1));
    let other = client.post("/pay", &key, r#"{"different":true}"#).await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!(probe.runs(), 3);
}

pub(crate) async fn b09_reaper_is_bounded_per_pass(env: &TestEnv) {
    let store = env.store();
    let manual = ManualClock::new();
    let wall = WallClock::from_clock(manual.clock());
    let t0 = wall.now_millis();
    let f = fp(9);
    let mut old = Vec::new();
    for _ in 0..7 {
        let key = scoped("b09old");
        let token = LeaseToken::random();
        store
            .begin(begin_at(&key, &f, token, t0))
            .await
            .expect("begin");
        store
            .complete(&key, token, &response("old"), t0, t0 + 10_000)
            .await
            .expect("complete");
        old.push(key);
    }
    // One in flight that was abandoned: reaped once its retention ends too.
    let abandoned = scoped("b09abandoned");
    store
        .begin(begin_at(&abandoned, &f, LeaseToken::random(), t0))
        .await
        .expect("begin");
    let mut fresh = Vec::new();
    for _ in 0..3 {
        let key = scoped("b09fresh");
        let token = LeaseToken::random();
        store
            .begin(begin_at(&key, &f, token, t0))
            .await
            .expect("begin");
        store
            .complete(&key, token, &response("fresh"), t0, t0 + 10_000_000)
            .await
            .expect("complete");
        fresh.push(key);
    }
    manual.advance(Duration::from_secs(200));
    let reaper = Reaper::new(Arc::clone(&store))
        .with_clock(wall.clone())
        .with_batch(3)
        .with_max_batches(1);
    let mut removed = 0;
    for _ in 0..10_000 {
        let pass = reaper.run_pass().await.expect("reap");
        assert!(pass.removed <= 3, "a pass is bounded: {pass:?}");
        removed += pass.removed;
        if !pass.more && removed >= 8 {
            break;
        }
    }
    assert_eq!(removed, 8, "7 completed + 1 abandoned expired records");
    // Fresh records survive and still replay; expired ones are gone (a begin acquires).
    let now = wall.now_millis();
    for key in &fresh {
        assert_eq!(
            store
                .begin(begin_at(key, &f, LeaseToken::random(), now))
                .await
                .expect("fresh"),
            Begin::Completed(response("fresh"))
        );
    }
    for key in &old {
        assert_eq!(
            store
                .begin(begin_at(key, &fp(1), LeaseToken::random(), now))
                .await
                .expect("old"),
            Begin::Acquired { took_over: false }
        );
    }
}

// 10 --------------------------------------------------------------------------------------

pub(crate) async fn b10_store_failure_fails_closed(env: &TestEnv) {
    let probe = Probe::new();
    let broken = env.broken_store().await;
    let layer = IdempotencyLayer::from_arc(broken).with_store_timeout(Duration::from_secs(3));
    let client = http(&probe, layer).await;
    let r = client.post("/pay", &unique_key("b10"), "{}").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.problem_type(), problem::STORE_UNAVAILABLE);
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    assert!(
        v["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("not processed")
    );
    assert_eq!(probe.runs(), 0, "never run unprotected by default");
}

#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub(crate) async fn b10_fail_open_is_explicit(env: &TestEnv) {
    let probe = Probe::new();
    let broken = env.broken_store().await;
    let layer = IdempotencyLayer::from_arc(broken)
        .with_store_timeout(Duration::from_secs(3))
        .with_failure_mode(FailureMode::Open);
    let router = app(&probe, layer);
    let key = unique_key("b10o");
    // The request runs on this thread, so a thread-local subscriber sees the layer's events.
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    let (status, _, _) = read(
        router
            .clone()
            .oneshot(pay_request(&key))
            .await
            .expect("infallible"),
    )
    .await;
    drop(guard);
    assert_eq!(status, StatusCode::CREATED);
    let text =
        String::from_utf8_lossy(&logs.0.lock().map(|v| v.clone()).unwrap_or_default()).into_owned();
    assert!(
        text.contains("WARN") && text.contains("WITHOUT idempotency protection"),
        "fail-open must be logged as a warning: {text:?}"
    );
    let (status, headers, _) =
        read(router.oneshot(pay_request(&key)).await.expect("infallible")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(
        headers.get("idempotent-replayed").is_none(),
        "nothing can be stored"
    );
    assert_eq!(probe.runs(), 2);
}

// 11 --------------------------------------------------------------------------------------

pub(crate) async fn b11_oversized_response_is_marked_not_truncated(env: &TestEnv) {
    let probe = Probe::new();
    let client = http(&probe, layer(env).with_max_response(1024, Oversize::Mark)).await;
    let key = format!("\"{}\"", unique_key("b11"));
    let h = [("idempotency-key", key.as_str()), ("x-size", "65536")];
    let first = client.send(Method::POST, "/big", &h, "").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.body.len(), 65_536, "never truncated");
    let dup = client.send(Method::POST, "/big", &h, "").await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.problem_type(), problem::RESPONSE_NOT_STORED);
    assert!(dup.replayed());
    assert_eq!(probe.runs(), 1, "marked: the handler does not run again");
    // At the cap exactly, the response is stored.
    let key = format!("\"{}\"", unique_key("b11c"));
    let h = [("idempotency-key", key.as_str()), ("x-size", "1024")];
    let a = client.send(Method::POST, "/big", &h, "").await;
    let b = client.send(Method::POST, "/big", &h, "").await;
    assert!(b.replayed());
    assert_eq!(a.body, b.body);
}

pub(crate) async fn b11_oversized_response_can_release_the_key(env: &TestEnv) {
    let probe = Probe::new();
    let client = http(
        &probe,
        layer(env).with_max_response(1024, Oversize::Release),
    )
    .await;
    let key = format!("\"{}\"", unique_key("b11r"));
    let h = [("idempotency-key", key.as_str()), ("x-size", "65536")];
    let first = client.send(Method::POST, "/big", &h, "").await;
    assert_eq!(first.body.len(), 65_536, "never truncated");
    let again = client.send(Method::POST, "/big", &h, "").await;
    assert_eq!(again.status, StatusCode::OK);
    assert!(!again.replayed());
    assert_eq!(again.body.len(), 65_536);
    assert_eq!(probe.runs(), 2, "released: the next request runs");
}

// 12 --------------------------------------------------------------------------------------

pub(crate) async fn b12_two_hundred_concurrent_duplicates_run_once(env: &TestEnv) {
    let probe = Probe::new();
    let client = http(&probe, layer(env)).await;
    let key = unique_key("b12");
    let mut tasks = tokio::task::JoinSet::new();
    let start = std::time::Instant::now();
    for _ in 0..200 {
        let (client, key) = (client.clone(), key.clone());
        tasks.spawn(async move { client.post("/pay", &key, r#"{"amount":1}"#).await });
    }
    let mut fresh = 0;
    let mut replays = 0;
    let mut conflicts = 0;
    let mut bodies = std::collections::HashSet::new();
    while let Some(r) = tasks.join_next().await {
        let r = r.expect("task");
        match r.status {
            StatusCode::CREATED if r.replayed() => {
                replays += 1;
                bodies.insert(r.body);
            }
            StatusCode::CREATED => {
                fresh += 1;
                bodies.insert(r.body);
            }
            StatusCode::CONFLICT => conflicts += 1,
            other => panic!("unexpected {other}: {r:?}"),
        }
    }
    let _ = writeln_stderr(&format!(
        "{:?}: 200 concurrent duplicates in {:?}: 1 run, {replays} replays, {conflicts} conflicts",
        env.backend,
        start.elapsed()
    ));
    assert_eq!(probe.runs(), 1, "the handler ran exactly once");
    assert_eq!(fresh, 1);
    assert_eq!(fresh + replays + conflicts, 200);
    assert_eq!(
        bodies.len(),
        1,
        "every 201 carries the one execution's body"
    );
}

fn writeln_stderr(s: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    writeln!(std::io::stderr(), "{s}")
}

pub(crate) async fn b12_thousand_sequential_duplicates_run_once(env: &TestEnv) {
    let probe = Probe::new();
    let client = http(&probe, layer(env)).await;
    let key = unique_key("b12s");
    let first = client.post("/pay", &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    for _ in 1..1000 {
        let r = client.post("/pay", &key, "{}").await;
        assert!(r.replayed());
        assert_eq!(r.body, first.body);
    }
    assert_eq!(probe.runs(), 1);
}
