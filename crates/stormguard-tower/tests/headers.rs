//! Headers on every attempt, and `Retry-After`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline};
use stormguard_tower::body::ReplayBody;
use stormguard_tower::retry::RetryLayer;
use stormguard_tower::wire::is_exhausted;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt, service_fn};

const CONTEXT: [&str; 5] = [
    "traceparent",
    "tracestate",
    "x-request-id",
    "x-tenant",
    "x-stormguard-attempt",
];

#[tokio::test]
async fn context_headers_reach_every_attempt_with_its_number() {
    let seen: Arc<Mutex<Vec<Vec<Option<String>>>>> = Arc::default();
    let record = seen.clone();
    let app = Router::new().route(
        "/orders/7",
        get(move |headers: HeaderMap| {
            let n = {
                let mut seen = record.lock().unwrap();
                seen.push(
                    CONTEXT
                        .iter()
                        .map(|h| headers.get(*h).map(|v| v.to_str().unwrap().to_owned()))
                        .collect(),
                );
                seen.len()
            };
            async move {
                if n < 3 {
                    StatusCode::BAD_GATEWAY
                } else {
                    StatusCode::OK
                }
            }
        }),
    );
    let addr = support::serve(app).await;
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(support::quick(3)).expect("valid policy"))
        .service(support::client());
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let request = Request::get(format!("http://{addr}/orders/7"))
        .header("traceparent", traceparent)
        .header("tracestate", "congo=t61rcWkgMzE")
        .header("x-request-id", "req-7")
        .header("x-tenant", "acme")
        .body(support::full(""))
        .unwrap();
    let response = client.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for (i, headers) in seen.iter().enumerate() {
        let expected = [traceparent, "congo=t61rcWkgMzE", "req-7", "acme"];
        for (got, want) in headers.iter().zip(expected) {
            assert_eq!(got.as_deref(), Some(want), "attempt {}", i + 1);
        }
        assert_eq!(headers[4], Some((i + 1).to_string()));
    }
}

type Calls = Arc<Mutex<Vec<Instant>>>;

/// The answer of the in-process downstream, ready at once.
type Answer = std::future::Ready<Result<Response<Full<Bytes>>, Infallible>>;

/// An in-process downstream that records when each attempt arrives and answers `first`
/// to the first attempt, 200 to the others.
fn downstream(
    calls: Calls,
    first: Response<Full<Bytes>>,
) -> impl tower::Service<
    Request<ReplayBody<Full<Bytes>>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = Answer,
> + Clone {
    let first = Arc::new(Mutex::new(Some(first)));
    service_fn(move |_req: Request<ReplayBody<Full<Bytes>>>| {
        calls.lock().unwrap().push(Instant::now());
        let response = first
            .lock()
            .unwrap()
            .take()
            .unwrap_or_else(|| Response::new(Full::default()));
        std::future::ready(Ok(response))
    })
}

fn answer(status: StatusCode, retry_after: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("retry-after", retry_after)
        .body(Full::default())
        .unwrap()
}

fn get_request() -> Request<Full<Bytes>> {
    Request::get("http://inventory/items")
        .body(Full::default())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured() {
    for (status, seconds) in [
        (StatusCode::SERVICE_UNAVAILABLE, 2),
        (StatusCode::TOO_MANY_REQUESTS, 1),
    ] {
        let calls = Calls::default();
        let client = ServiceBuilder::new()
            .layer(RetryLayer::new(support::quick(3)).expect("valid policy"))
            .service(downstream(
                calls.clone(),
                answer(status, &seconds.to_string()),
            ));
        let response = client.oneshot(get_request()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let calls = calls.lock().unwrap();
        assert_eq!(calls.len(), 2);
        // Paused time: the retry waited exactly the longer of backoff (1 ms) and Retry-After.
        assert_eq!(
            calls[1] - calls[0],
            Duration::from_secs(seconds),
            "{status}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_past_the_deadline_stops_and_marks() {
    let calls = Calls::default();
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(support::quick(3)).expect("valid policy"))
        .service(downstream(
            calls.clone(),
            answer(StatusCode::SERVICE_UNAVAILABLE, "5"),
        ));
    let deadline = Deadline::after(Duration::from_secs(1), Clock::tokio());
    let response = deadline::scope(deadline, client.oneshot(get_request()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.lock().unwrap().len(), 1);
    // The deadline refused the retry: no layer upstream should try instead.
    assert!(is_exhausted(response.headers()));
}
