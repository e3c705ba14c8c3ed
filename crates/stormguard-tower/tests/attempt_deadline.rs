//! Every attempt of the client stack, the first included, calls the service below inside the
//! attempt's deadline scope: a layer that reads the task's deadline when it is called (a
//! deadline propagator, an admission layer, a tonic interceptor) sees the per-try deadline,
//! not the call's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use stormguard::deadline;
use stormguard::policy::PolicyFile;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::ClientLayer;
use tower::{Layer, ServiceExt, service_fn};

/// Calls the stack once under `policy` over a service that answers 503 until its third call
/// and notes, for each call, the task's deadline as seen inside `call` itself.
async fn deadlines_seen_when_called(policy: &str) -> Vec<Option<Duration>> {
    let file = PolicyFile::from_toml(policy).expect("a valid policy");
    let seen: Arc<Mutex<Vec<Option<Duration>>>> = Arc::default();
    let record = Arc::clone(&seen);
    let service = service_fn(move |_req: Request<ReplayBody<Full<Bytes>>>| {
        // This runs in `call`, before the returned future is polled.
        let calls = {
            let mut seen = record.lock().expect("not poisoned");
            seen.push(deadline::current().map(|d| d.remaining()));
            seen.len()
        };
        let status = if calls < 3 {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        };
        async move {
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .status(status)
                    .body(Full::new(Bytes::new()))
                    .expect("a valid response"),
            )
        }
    });
    let client = ClientLayer::from_policy_file(&file)
        .expect("valid policies")
        .layer(service);
    let request = Request::get("http://orders/orders/7")
        .body(Full::new(Bytes::new()))
        .expect("a valid request");
    let response = client.oneshot(request).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::OK);
    seen.lock().expect("not poisoned").clone()
}

/// Asserts that each of the three calls saw a deadline, and none further than `limit`.
fn assert_each_saw_at_most(seen: &[Option<Duration>], limit: Duration) {
    assert_eq!(seen.len(), 3, "{seen:?}");
    for (call, left) in seen.iter().enumerate() {
        let left = left.unwrap_or_else(|| panic!("call {} saw no deadline", call + 1));
        assert!(
            left <= limit,
            "call {} saw {left:?}, over {limit:?}",
            call + 1
        );
    }
}

#[tokio::test(start_paused = true)]
async fn every_retried_attempt_is_called_under_its_per_try_deadline() {
    let seen = deadlines_seen_when_called(
        r#"
        [endpoints.default]
        idempotency = "idempotent"
        timeouts = { per_try = "200ms", overall = "5s" }
        retry = { max_attempts = 3 }
        backoff = { kind = "fixed", base = "1ms" }
        "#,
    )
    .await;
    assert_each_saw_at_most(&seen, Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn every_hedged_copy_is_called_under_the_calls_deadline() {
    // Hedged copies race under the call's deadline, with no per-try limit of their own.
    let seen = deadlines_seen_when_called(
        r#"
        [endpoints.default]
        idempotency = "idempotent"
        timeouts = { per_try = "200ms", overall = "5s" }
        hedge = { max_attempts = 3, delay = "20ms" }
        "#,
    )
    .await;
    assert_each_saw_at_most(&seen, Duration::from_secs(5));
}
