//! `CenterWatch` against a stand-in center (a real axum server on 127.0.0.1) that answers
//! what a real center must not: a snapshot whose policy does not match its hash, and a
//! watch shed with 503 and `Retry-After`. Real time; each wait ends on a condition.
#![allow(clippy::unwrap_used)]

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use stormguard::backoff::{Backoff, Jitter};
use stormguard_center::content_hash;
use stormguard_tower::client::{CenterWatch, CenterWatchConfig, ClientLayer};
use support::{attempts, client_stack};
use tokio::time::timeout;

const GIVE_UP: Duration = Duration::from_secs(30);

#[derive(Clone, Default)]
struct Fake {
    /// When each watch request arrived.
    watches: Arc<Mutex<Vec<Instant>>>,
    /// When each poll arrived.
    polls: Arc<Mutex<Vec<Instant>>>,
    acks: Arc<Mutex<Vec<Value>>>,
    /// Signalled on each ACK or NACK.
    acked: Arc<tokio::sync::Notify>,
    /// Watches answered 503 before one is let in.
    shed: usize,
    /// The hash the snapshot claims (its policy's true one when `None`).
    hash: Option<String>,
}

impl Fake {
    fn snapshot(&self) -> Value {
        let policy = attempts(5);
        json!({
            "service": "orders",
            "version": 1,
            "hash": self.hash.clone().unwrap_or_else(|| content_hash(&policy)),
            "policy": policy,
            "created_ms": 0,
        })
    }
}

async fn watch(State(fake): State<Fake>) -> Response {
    let calls = {
        let mut watches = fake.watches.lock().unwrap();
        watches.push(Instant::now());
        watches.len()
    };
    if calls <= fake.shed {
        return (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")]).into_response();
    }
    let event = Event::default()
        .event("policy")
        .id("1")
        .data(fake.snapshot().to_string());
    let events = futures_util::stream::once(async move { Ok::<_, Infallible>(event) })
        .chain(futures_util::stream::pending());
    Sse::new(events).into_response()
}

async fn poll(State(fake): State<Fake>) -> StatusCode {
    fake.polls.lock().unwrap().push(Instant::now());
    StatusCode::NOT_MODIFIED
}

async fn ack(State(fake): State<Fake>, body: String) -> StatusCode {
    fake.acks
        .lock()
        .unwrap()
        .push(serde_json::from_str(&body).unwrap());
    fake.acked.notify_waiters();
    StatusCode::NO_CONTENT
}

/// The first ACK or NACK the fake center received, waiting (bounded) for it.
async fn first_ack(fake: &Fake) -> Value {
    timeout(GIVE_UP, async {
        loop {
            // Registered before the check: an ACK between the two is not missed.
            let acked = fake.acked.notified();
            tokio::pin!(acked);
            acked.as_mut().enable();
            if let Some(first) = fake.acks.lock().unwrap().first().cloned() {
                return first;
            }
            acked.await;
        }
    })
    .await
    .expect("no ACK or NACK reached the center")
}

async fn serve(fake: Fake) -> String {
    let router = Router::new()
        .route("/v1/services/orders/watch", get(watch))
        .route("/v1/services/orders/policy", get(poll))
        .route("/v1/services/orders/acks", post(ack))
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

fn start(url: &str, layer: &ClientLayer) -> CenterWatch {
    let config = CenterWatchConfig::new(url, "orders", "orders-1", "sg_token")
        .with_poll_interval(Duration::from_secs(3600))
        .with_backoff(
            Backoff::exponential(Duration::from_millis(1))
                .with_cap(Duration::from_millis(10))
                .with_jitter(Jitter::Full),
        )
        .with_seed(7);
    CenterWatch::start(layer.policies(), config).unwrap()
}

fn layer() -> ClientLayer {
    client_stack(2)
}

fn max_attempts(layer: &ClientLayer) -> u32 {
    layer
        .policies()
        .current()
        .endpoint("default")
        .unwrap()
        .retry()
        .max_attempts()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_whose_policy_does_not_match_its_hash_is_nacked_and_not_applied() {
    let fake = Fake {
        hash: Some("0".repeat(64)),
        ..Fake::default()
    };
    let url = serve(fake.clone()).await;
    let layer = layer();
    let watch = start(&url, &layer);
    let state = timeout(GIVE_UP, watch.wait_for(|s| s.refused == 1))
        .await
        .expect("the snapshot was never refused");
    assert_eq!(state.applied, None);
    assert_eq!(max_attempts(&layer), 2, "the policies in use stay");
    let nack = first_ack(&fake).await;
    assert_eq!(
        (&nack["version"], &nack["applied"]),
        (&json!(1), &json!(false))
    );
    let reason = nack["reason"].as_str().unwrap();
    assert!(reason.contains("content hash mismatch"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_watch_waits_for_retry_after_and_sends_no_poll_meanwhile() {
    let fake = Fake {
        shed: 2,
        ..Fake::default()
    };
    let url = serve(fake.clone()).await;
    let layer = layer();
    let watch = start(&url, &layer);
    timeout(GIVE_UP, watch.wait_for(|s| s.applied == Some(1)))
        .await
        .expect("never applied");
    assert_eq!(max_attempts(&layer), 5);
    let watches = fake.watches.lock().unwrap().clone();
    assert_eq!(watches.len(), 3, "two shed, the third let in");
    // The backoff alone would come back within 10 ms; Retry-After says a second.
    for pair in watches.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= Duration::from_secs(1), "came back after {gap:?}");
    }
    assert!(
        fake.polls.lock().unwrap().is_empty(),
        "a poll was sent to a center that shed the watch"
    );
    // The version arrived and was acknowledged.
    assert_eq!(first_ack(&fake).await["applied"], true);
}
