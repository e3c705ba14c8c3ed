//! What may be sent again: timeouts and transport errors against the method and the
//! `Idempotency-Key`, over real sockets.
//!
//! The timeout tests run under paused time with the clock held ([`ClockHold`]): the test moves
//! the clock past the per-try timeout once the server holds the request, so the attempt count
//! does not depend on how fast this machine answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/clock_hold.rs"]
mod clock_hold;
mod support;

use clock_hold::ClockHold;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::{HeaderMap, Method, Request, StatusCode};
use stormguard::backoff::{Backoff, Jitter};
use stormguard::retry::{RetryPolicy, StopReason};
use stormguard_tower::client::Error;
use stormguard_tower::retry::RetryLayer;
use tokio::io::AsyncReadExt;
use tower::{ServiceBuilder, ServiceExt};

/// Per-try timeout (virtual time: the tests move the clock past it when they choose).
const PER_TRY: Duration = Duration::from_millis(750);

/// What the server saw, one entry per request: the `Idempotency-Key` and attempt headers.
type Seen = Arc<Mutex<Vec<(Option<String>, Option<String>)>>>;

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).map(|v| v.to_str().unwrap().to_owned())
}

/// `/pay` never answers its first `slow` requests, and answers the others at once; each
/// request's arrival is announced on `arrived`.
async fn payment_server(
    seen: Seen,
    slow: usize,
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<usize>) {
    let (arrived, arrivals) = tokio::sync::mpsc::unbounded_channel();
    let app = Router::new().route(
        "/pay",
        post(move |headers: HeaderMap| {
            let n = {
                let mut seen = seen.lock().unwrap();
                seen.push((
                    header(&headers, "idempotency-key"),
                    header(&headers, "x-stormguard-attempt"),
                ));
                seen.len()
            };
            let _ = arrived.send(n);
            async move {
                if n <= slow {
                    std::future::pending::<()>().await;
                }
                StatusCode::OK
            }
        }),
    );
    (support::serve(app).await, arrivals)
}

/// Three attempts, retried at once (no backoff timer for the held clock to wait on).
fn timed_policy() -> RetryPolicy {
    RetryPolicy::new(3)
        .with_backoff(Backoff::fixed(Duration::ZERO).with_jitter(Jitter::None))
        .with_per_try_timeout(PER_TRY)
}

#[tokio::test(start_paused = true)]
async fn a_post_without_a_key_is_not_retried_after_a_timeout() {
    let mut hold = ClockHold::new();
    let seen = Seen::default();
    let (addr, mut arrivals) = payment_server(seen.clone(), usize::MAX).await;
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(timed_policy()).expect("valid policy"))
        .service(support::client());
    let request = Request::post(format!("http://{addr}/pay"))
        .body(support::full("amount=42"))
        .unwrap();
    let call = tokio::spawn(client.oneshot(request));
    assert_eq!(hold.within(arrivals.recv()).await, Some(1));
    tokio::time::advance(PER_TRY).await;
    let err = hold.within(call).await.unwrap().unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.stop(), Some(StopReason::NotIdempotent));
    assert!(!err.is_exhausted(), "a key-holding caller may still retry");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_post_with_a_key_is_retried_with_the_same_key() {
    let mut hold = ClockHold::new();
    let seen = Seen::default();
    let (addr, mut arrivals) = payment_server(seen.clone(), 2).await;
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(timed_policy()).expect("valid policy"))
        .service(support::client());
    let request = Request::post(format!("http://{addr}/pay"))
        .header("idempotency-key", "\"pay-8812\"")
        .body(support::full("amount=42"))
        .unwrap();
    let call = tokio::spawn(client.oneshot(request));
    // The first two attempts reach the server and hang there until their per-try timeout.
    for attempt in 1..=2 {
        assert_eq!(hold.within(arrivals.recv()).await, Some(attempt));
        tokio::time::advance(PER_TRY).await;
    }
    let response = hold.within(call).await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let key = Some("\"pay-8812\"".to_owned());
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (key.clone(), Some("1".to_owned())),
            (key.clone(), Some("2".to_owned())),
            (key, Some("3".to_owned())),
        ]
    );
}

#[tokio::test]
async fn a_refused_connection_is_retried_for_any_method() {
    // A port nobody listens on: bind, note the address, close.
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(support::quick(3)).expect("valid policy"))
        .service(support::client());
    let request = Request::post(format!("http://{addr}/pay"))
        .body(support::full("amount=42"))
        .unwrap();
    let err = client.oneshot(request).await.unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err}");
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.stop(), Some(StopReason::AttemptsExhausted));
    assert!(err.is_exhausted());
}

/// A server that reads each request's head and then resets the connection: the request
/// was sent, the outcome is unknown. Returns the address and the number of requests read.
async fn resetting_server() -> (SocketAddr, Arc<Mutex<u32>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(Mutex::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                *seen.lock().unwrap() += 1;
            }
            stream.set_zero_linger().unwrap();
            drop(stream);
        }
    });
    (addr, count)
}

async fn send_to_resetting_server(method: Method) -> (Error, u32) {
    let (addr, count) = resetting_server().await;
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(support::quick(3)).expect("valid policy"))
        .service(support::client());
    let request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}/pay"))
        .body(support::full("amount=42"))
        .unwrap();
    let err = client.oneshot(request).await.unwrap_err();
    let seen = *count.lock().unwrap();
    (err, seen)
}

#[tokio::test]
async fn a_reset_after_sending_is_retried_only_when_safe() {
    let (err, seen) = send_to_resetting_server(Method::POST).await;
    assert!(matches!(err, Error::Transport { .. }), "{err}");
    assert_eq!(err.stop(), Some(StopReason::NotIdempotent));
    assert_eq!((err.attempts(), seen), (1, 1));

    let (err, seen) = send_to_resetting_server(Method::PUT).await;
    assert_eq!(err.stop(), Some(StopReason::AttemptsExhausted));
    assert_eq!((err.attempts(), seen), (3, 3));
}
