//! The reqwest retry middleware against real axum servers on 127.0.0.1.
//!
//! Real sockets, so real time: every assertion is on counts, headers and values the server
//! recorded, never on how long something took (the one lower bound, on `Retry-After`, is
//! computed from instants the server recorded and cannot fail on a slow machine).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body as AxumBody;
use axum::http::{HeaderMap, Response as AxumResponse};
use axum::routing::any;
use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use stormguard::backoff::{Backoff, Jitter};
use stormguard::budget::TokenBucket;
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline};
use stormguard::retry::{Retrier, RetryPolicy, SeededRandom, StopReason};
use stormguard_tower::reqwest::{AttemptTimedOut, RetryMiddleware, RetrySummary};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

/// What the test server answers to its `n`th request (0-based).
#[derive(Clone)]
enum Reply {
    Status(u16, &'static [(&'static str, &'static str)]),
    /// Never answers in time: the client's per-try timeout cuts the attempt.
    Hang,
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
struct Hit {
    attempt: Option<String>,
    key: Option<String>,
    at: Instant,
}

struct Server {
    addr: SocketAddr,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Server {
    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    fn attempts_seen(&self) -> Vec<String> {
        self.hits()
            .into_iter()
            .map(|h| h.attempt.unwrap_or_default())
            .collect()
    }
}

async fn serve(script: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Server {
    let hits = Arc::new(Mutex::new(Vec::<Hit>::new()));
    let script = Arc::new(script);
    let recorded = hits.clone();
    let app = axum::Router::new().fallback(any(move |headers: HeaderMap| {
        let hits = recorded.clone();
        let script = script.clone();
        async move {
            let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
            let n = {
                let mut hits = hits.lock().unwrap();
                hits.push(Hit {
                    attempt: header("x-stormguard-attempt"),
                    key: header("idempotency-key"),
                    at: Instant::now(),
                });
                hits.len() - 1
            };
            let (status, extra) = match script(n) {
                Reply::Status(status, extra) => (status, extra),
                Reply::Hang => {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    (200, &[][..])
                }
            };
            let mut response = AxumResponse::builder().status(status);
            for (name, value) in extra {
                response = response.header(*name, *value);
            }
            response.body(AxumBody::empty()).unwrap()
        }
    }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server { addr, hits }
}

const MS: Duration = Duration::from_millis(1);

/// Short fixed backoff, so retries are quick; seeded jitter.
fn policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::new(max_attempts)
        .with_backoff(Backoff::fixed(5 * MS).with_jitter(Jitter::None))
        .validate()
        .unwrap()
}

fn client_with(
    retrier: Retrier<impl stormguard::budget::RetryBudget + 'static>,
) -> ClientWithMiddleware {
    let retrier = retrier.with_random(SeededRandom::new(7));
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(retrier))
        .build()
}

fn client(policy: RetryPolicy) -> ClientWithMiddleware {
    client_with(Retrier::new(policy))
}

/// Fails the test instead of hanging it.
async fn within<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .expect("test request did not finish within 30 s")
}

fn summary(response: &reqwest::Response) -> RetrySummary {
    *response.extensions().get::<RetrySummary>().unwrap()
}

fn exhausted_mark(response: &reqwest::Response) -> Option<&str> {
    response
        .headers()
        .get("x-retry-exhausted")
        .map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn a_503_is_retried_and_each_attempt_is_numbered() {
    let server = serve(|n| match n {
        0 | 1 => Reply::Status(503, &[]),
        _ => Reply::Status(200, &[]),
    })
    .await;
    let response = within(client(policy(3)).get(server.url()).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(server.attempts_seen(), ["1", "2", "3"]);
    assert_eq!(
        summary(&response),
        RetrySummary {
            attempts: 3,
            stop: StopReason::Succeeded
        }
    );
    assert_eq!(exhausted_mark(&response), None);
}

#[tokio::test]
async fn a_400_is_not_retried() {
    let server = serve(|_| Reply::Status(400, &[])).await;
    let response = within(client(policy(3)).get(server.url()).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(server.attempts_seen(), ["1"]);
    assert_eq!(summary(&response).stop, StopReason::NeverRetry);
    assert_eq!(exhausted_mark(&response), None, "nothing was retried");
}

#[tokio::test]
async fn a_post_without_key_is_not_retried_after_a_timeout() {
    let server = serve(|n| match n {
        0 => Reply::Hang,
        _ => Reply::Status(200, &[]),
    })
    .await;
    let client = client(policy(3).with_per_try_timeout(300 * MS));
    let err = within(client.post(server.url()).body("charge 10 EUR").send())
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(err) = err else {
        panic!("expected the middleware's timeout error, got {err:?}");
    };
    let timed_out = err.downcast_ref::<AttemptTimedOut>().unwrap();
    assert_eq!(timed_out.attempts, 1);
    assert_eq!(timed_out.stop, StopReason::NotIdempotent);
    assert_eq!(timed_out.after, 300 * MS);
    assert_eq!(server.hits().len(), 1);
}

#[tokio::test]
async fn a_keyed_post_is_retried_after_a_timeout_with_the_same_key() {
    let server = serve(|n| match n {
        0 => Reply::Hang,
        _ => Reply::Status(201, &[]),
    })
    .await;
    let client = client(policy(3).with_per_try_timeout(300 * MS));
    let response = within(
        client
            .post(server.url())
            .header("Idempotency-Key", "\"pay-8812\"")
            .body("charge 10 EUR")
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 201);
    let hits = server.hits();
    let keys: Vec<_> = hits.iter().map(|h| h.key.as_deref()).collect();
    assert_eq!(keys, [Some("\"pay-8812\""), Some("\"pay-8812\"")]);
    assert_eq!(server.attempts_seen(), ["1", "2"]);
    assert_eq!(summary(&response).attempts, 2);
}

#[tokio::test]
async fn a_post_without_key_is_not_retried_after_a_503_but_a_keyed_one_is() {
    let server = serve(|_| Reply::Status(503, &[])).await;
    let client = client(policy(3));
    let unkeyed = within(client.post(server.url()).body("charge 10 EUR").send())
        .await
        .unwrap();
    assert_eq!(unkeyed.status(), 503);
    assert_eq!(
        summary(&unkeyed),
        RetrySummary {
            attempts: 1,
            stop: StopReason::NotIdempotent
        },
        "a 503 may follow a side effect: an unkeyed POST is not repeated"
    );
    assert_eq!(exhausted_mark(&unkeyed), None);

    let keyed = within(
        client
            .post(server.url())
            .header("Idempotency-Key", "\"pay-8813\"")
            .body("charge 10 EUR")
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(summary(&keyed).attempts, 3);
    assert_eq!(exhausted_mark(&keyed), Some("true"));
    assert_eq!(server.attempts_seen(), ["1", "1", "2", "3"]);
}

#[tokio::test]
async fn a_budget_refusal_stops_retries() {
    let server = serve(|_| Reply::Status(503, &[])).await;
    // One token: the first request may retry once, the second not at all.
    let budget = Arc::new(TokenBucket::spend_per_retry(1, 0.1).unwrap());
    let client = client_with(Retrier::new(policy(10)).with_budget(budget.clone()));

    let first = within(client.get(server.url()).send()).await.unwrap();
    assert_eq!(
        summary(&first),
        RetrySummary {
            attempts: 2,
            stop: StopReason::BudgetExhausted
        }
    );
    assert_eq!(
        exhausted_mark(&first),
        Some("true"),
        "it retried, then gave up"
    );
    assert_eq!(budget.tokens(), 0.0);

    let second = within(client.get(server.url()).send()).await.unwrap();
    assert_eq!(
        summary(&second),
        RetrySummary {
            attempts: 1,
            stop: StopReason::BudgetExhausted
        }
    );
    assert_eq!(
        exhausted_mark(&second),
        Some("true"),
        "the budget refused its retry: callers further up must not retry either"
    );
    assert_eq!(server.attempts_seen(), ["1", "2", "1"]);
}

#[tokio::test]
async fn a_response_marked_exhausted_is_not_retried() {
    let server = serve(|_| Reply::Status(503, &[("x-retry-exhausted", "true")])).await;
    let response = within(client(policy(3)).get(server.url()).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(server.hits().len(), 1);
    assert_eq!(summary(&response).stop, StopReason::NeverRetry);
    assert_eq!(
        exhausted_mark(&response),
        Some("true"),
        "passed on upstream"
    );
}

#[tokio::test]
async fn giving_up_after_retries_marks_the_response() {
    let server = serve(|_| Reply::Status(502, &[])).await;
    let response = within(client(policy(3)).get(server.url()).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(server.attempts_seen(), ["1", "2", "3"]);
    assert_eq!(summary(&response).stop, StopReason::AttemptsExhausted);
    assert_eq!(exhausted_mark(&response), Some("true"));
}

#[tokio::test]
async fn a_retry_after_beyond_the_deadline_stops_at_once() {
    let server = serve(|_| Reply::Status(503, &[("retry-after", "60")])).await;
    let client = client(policy(5));
    let deadline = Deadline::after(Duration::from_secs(5), Clock::tokio());
    let response = within(deadline::scope(deadline, client.get(server.url()).send()))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(server.hits().len(), 1);
    assert_eq!(
        summary(&response),
        RetrySummary {
            attempts: 1,
            stop: StopReason::DeadlineTooClose
        }
    );
}

#[tokio::test]
async fn a_retry_after_is_waited_out() {
    let server = serve(|n| match n {
        0 => Reply::Status(429, &[("retry-after", "1")]),
        _ => Reply::Status(200, &[]),
    })
    .await;
    let response = within(client(policy(3)).get(server.url()).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    // The server stamped the first hit before answering and the second after the client
    // slept: the gap cannot be shorter than Retry-After (the backoff alone is 5 ms).
    let gap = hits[1].at - hits[0].at;
    assert!(gap >= Duration::from_secs(1), "retried after only {gap:?}");
}

#[tokio::test]
async fn a_stream_body_is_sent_once() {
    let server = serve(|_| Reply::Status(503, &[])).await;
    let body = reqwest::Body::wrap(String::from("streamed"));
    let response = within(client(policy(3)).put(server.url()).body(body).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(server.attempts_seen(), ["1"]);
    assert_eq!(summary(&response).stop, StopReason::NeverRetry);
}

#[tokio::test]
async fn a_refused_connection_is_retried_even_for_a_post() {
    // A port that was just free: nothing listens on it.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let client = client(policy(3));
    let request = client
        .post(format!("http://{addr}/"))
        .body("nothing was sent")
        .build()
        .unwrap();
    let mut extensions = Extensions::new();
    let err = within(client.execute_with_extensions(request, &mut extensions))
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    assert_eq!(
        extensions.get::<RetrySummary>(),
        Some(&RetrySummary {
            attempts: 3,
            stop: StopReason::AttemptsExhausted
        })
    );
}

/// Accepts connections, reads one request head from each, then drops the connection
/// without answering: the request was sent and its fate is unknown.
async fn resetting_server() -> (SocketAddr, Arc<Mutex<u32>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(Mutex::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            *counted.lock().unwrap() += 1;
            drop(socket);
        }
    });
    (addr, requests)
}

#[tokio::test]
async fn a_connection_lost_after_sending_is_in_doubt() {
    let (addr, requests) = resetting_server().await;
    let client = client(policy(3));
    let url = format!("http://{addr}/");

    let mut extensions = Extensions::new();
    let request = client.post(&url).body("in doubt").build().unwrap();
    let err = within(client.execute_with_extensions(request, &mut extensions))
        .await
        .unwrap_err();
    assert!(!err.is_connect(), "{err:?}");
    assert_eq!(
        extensions.get::<RetrySummary>().map(|s| s.stop),
        Some(StopReason::NotIdempotent)
    );
    assert_eq!(*requests.lock().unwrap(), 1);

    let mut extensions = Extensions::new();
    let request = client.get(&url).build().unwrap();
    within(client.execute_with_extensions(request, &mut extensions))
        .await
        .unwrap_err();
    assert_eq!(
        extensions.get::<RetrySummary>().map(|s| s.stop),
        Some(StopReason::AttemptsExhausted)
    );
    assert_eq!(*requests.lock().unwrap(), 1 + 3);
}
