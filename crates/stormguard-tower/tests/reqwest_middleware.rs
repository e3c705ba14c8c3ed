//! The client stack as a reqwest middleware, against real axum servers on 127.0.0.1.
//!
//! Real sockets, so real time: every assertion is on counts, headers and values the server
//! recorded or the observer saw, never on how long something took (the one lower bound, on
//! `Retry-After`, is computed from instants the server recorded and cannot fail on a slow
//! machine; the deadlines compared are the ones the downstream received).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body as AxumBody, Bytes};
use axum::http::{HeaderMap, Response as AxumResponse};
use axum::routing::any;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use stormguard::admission::Refusal;
use stormguard::budget::{RetryBudget, TokenBucket};
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline, parse_grpc_timeout};
use stormguard::policy::{EndpointPolicy, PolicyFile};
use stormguard::retry::StopReason;
use stormguard_tower::client::{self, ClientLayerBuilder, DEFAULT_ROUTE};
use stormguard_tower::observe::{
    AttemptEnd, AttemptStart, CallEnd, CallInfo, HedgeEvent, Observer,
};
use stormguard_tower::reqwest::ClientMiddleware;
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
    grpc_timeout: Option<Duration>,
    body: Bytes,
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
    let app = axum::Router::new().fallback(any(move |headers: HeaderMap, body: Bytes| {
        let hits = recorded.clone();
        let script = script.clone();
        async move {
            let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
            let n = {
                let mut hits = hits.lock().unwrap();
                hits.push(Hit {
                    attempt: header("x-stormguard-attempt"),
                    key: header("idempotency-key"),
                    // The downstream checks what it was given: a well-formed grpc-timeout.
                    grpc_timeout: headers
                        .get("grpc-timeout")
                        .map(|v| parse_grpc_timeout(v.as_bytes()).expect("a valid grpc-timeout")),
                    body,
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

/// A policy file of one endpoint (the default route): a short fixed backoff, and `extra`.
fn policy(extra: &str) -> EndpointPolicy {
    let text = format!(
        "[endpoints.default]\nbackoff = {{ kind = \"fixed\", base = \"5ms\", cap = \"5ms\", jitter = \"none\" }}\n{extra}\n"
    );
    let file = PolicyFile::from_toml(&text).unwrap();
    file.endpoint(DEFAULT_ROUTE).unwrap().clone()
}

fn retrying(max_attempts: u32) -> EndpointPolicy {
    policy(&format!("retry = {{ max_attempts = {max_attempts} }}"))
}

/// Everything the stack reported, counted.
#[derive(Default)]
struct Counts {
    started: AtomicU32,
    retries: AtomicU32,
    ended: AtomicU32,
    budget_refused: AtomicU32,
    refused: Mutex<Vec<&'static str>>,
    calls: Mutex<Vec<CallEnd>>,
    hedges: Mutex<Vec<HedgeEvent>>,
}

#[derive(Clone, Default)]
struct Probe(Arc<Counts>);

impl Observer for Probe {
    fn attempt_started(&self, _: &CallInfo<'_>, attempt: &AttemptStart) {
        self.0.started.fetch_add(1, Ordering::SeqCst);
        if attempt.retry.is_some() {
            self.0.retries.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn attempt_ended(&self, _: &CallInfo<'_>, _: &AttemptEnd) {
        self.0.ended.fetch_add(1, Ordering::SeqCst);
    }
    fn call_finished(&self, _: &CallInfo<'_>, end: &CallEnd) {
        self.0.calls.lock().unwrap().push(*end);
    }
    fn budget_refused(&self, _: &CallInfo<'_>) {
        self.0.budget_refused.fetch_add(1, Ordering::SeqCst);
    }
    fn refused(&self, _: &CallInfo<'_>, refusal: &Refusal) {
        self.0.refused.lock().unwrap().push(refusal.label());
    }
    fn hedge(&self, _: &CallInfo<'_>, event: HedgeEvent) {
        self.0.hedges.lock().unwrap().push(event);
    }
}

impl Probe {
    fn calls(&self) -> Vec<CallEnd> {
        self.0.calls.lock().unwrap().clone()
    }

    fn last(&self) -> CallEnd {
        *self.calls().last().expect("a call finished")
    }
}

/// A client whose stack has `policy`, reports to a probe and draws seeded jitter.
fn client_with(
    policy: EndpointPolicy,
    budget: Option<Arc<dyn RetryBudget>>,
) -> (ClientWithMiddleware, Probe) {
    let probe = Probe::default();
    let mut builder = ClientLayerBuilder::single(DEFAULT_ROUTE, policy)
        .with_seed(7)
        .with_observer(probe.clone());
    if let Some(budget) = budget {
        builder = builder.with_budget(budget);
    }
    let middleware = ClientMiddleware::from(builder.build().unwrap());
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    (ClientBuilder::new(http).with(middleware).build(), probe)
}

fn client(policy: EndpointPolicy) -> (ClientWithMiddleware, Probe) {
    client_with(policy, None)
}

/// Fails the test instead of hanging it.
async fn within<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .expect("test request did not finish within 30 s")
}

fn exhausted_mark(response: &reqwest::Response) -> Option<&str> {
    response
        .headers()
        .get("x-retry-exhausted")
        .map(|v| v.to_str().unwrap())
}

/// The stack's own error inside a middleware error.
fn stack_error(err: &reqwest_middleware::Error) -> &client::Error {
    match err {
        reqwest_middleware::Error::Middleware(e) => e
            .downcast_ref::<client::Error>()
            .unwrap_or_else(|| panic!("not the stack's error: {e:?}")),
        other => panic!("expected the stack's error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_503_is_retried_each_attempt_is_numbered_and_the_observer_counts_match() {
    let server = serve(|n| match n {
        0 | 1 => Reply::Status(503, &[]),
        _ => Reply::Status(200, &[]),
    })
    .await;
    let (client, probe) = client(retrying(3));
    let response = within(client.get(server.url()).send()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.url().as_str(),
        server.url(),
        "the response keeps its URL"
    );
    assert_eq!(server.attempts_seen(), ["1", "2", "3"]);
    assert_eq!(exhausted_mark(&response), None);
    // What the observer saw is what the server saw.
    let c = &probe.0;
    assert_eq!(c.started.load(Ordering::SeqCst), 3);
    assert_eq!(c.ended.load(Ordering::SeqCst), 3);
    assert_eq!(c.retries.load(Ordering::SeqCst), 2);
    let end = probe.last();
    assert_eq!((end.attempts, end.stop), (3, StopReason::Succeeded));
    assert!(!end.marked_exhausted);
}

#[tokio::test]
async fn a_400_is_not_retried() {
    let server = serve(|_| Reply::Status(400, &[])).await;
    let (client, probe) = client(retrying(3));
    let response = within(client.get(server.url()).send()).await.unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(server.attempts_seen(), ["1"]);
    assert_eq!(probe.last().stop, StopReason::NeverRetry);
    assert_eq!(exhausted_mark(&response), None, "nothing was retried");
}

#[tokio::test]
async fn a_post_without_key_is_not_retried_after_a_timeout() {
    let server = serve(|n| match n {
        0 => Reply::Hang,
        _ => Reply::Status(200, &[]),
    })
    .await;
    let (client, probe) = client(policy(
        "retry = { max_attempts = 3 }\ntimeouts = { per_try = \"300ms\" }",
    ));
    let err = within(client.post(server.url()).body("charge 10 EUR").send())
        .await
        .unwrap_err();
    let err = stack_error(&err);
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.stop(), Some(StopReason::NotIdempotent));
    assert!(
        !err.is_exhausted(),
        "a keyed caller upstream may still retry"
    );
    assert_eq!(server.hits().len(), 1);
    assert_eq!(probe.last().stop, StopReason::NotIdempotent);
}

#[tokio::test]
async fn a_keyed_post_is_retried_after_a_timeout_with_the_same_key_and_body() {
    let server = serve(|n| match n {
        0 => Reply::Hang,
        _ => Reply::Status(201, &[]),
    })
    .await;
    let (client, _) = client(policy(
        "retry = { max_attempts = 3 }\ntimeouts = { per_try = \"300ms\" }",
    ));
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
    assert!(hits.iter().all(|h| h.body == "charge 10 EUR"));
    assert_eq!(server.attempts_seen(), ["1", "2"]);
}

#[tokio::test]
async fn a_post_without_key_is_not_retried_after_a_503_but_a_keyed_one_is() {
    let server = serve(|_| Reply::Status(503, &[])).await;
    let (client, probe) = client(retrying(3));
    let unkeyed = within(client.post(server.url()).body("charge 10 EUR").send())
        .await
        .unwrap();
    assert_eq!(unkeyed.status(), 503);
    let end = probe.last();
    assert_eq!(
        (end.attempts, end.stop),
        (1, StopReason::NotIdempotent),
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
    assert_eq!(probe.last().attempts, 3);
    assert_eq!(exhausted_mark(&keyed), Some("true"));
    assert_eq!(server.attempts_seen(), ["1", "1", "2", "3"]);
}

#[tokio::test]
async fn a_budget_refusal_stops_retries_and_marks_the_answer() {
    let server = serve(|_| Reply::Status(503, &[])).await;
    // One token: the first request may retry once, the second not at all.
    let budget = Arc::new(TokenBucket::spend_per_retry(1, 0.1).unwrap());
    let (client, probe) = client_with(retrying(10), Some(budget.clone()));

    let first = within(client.get(server.url()).send()).await.unwrap();
    let end = probe.last();
    assert_eq!((end.attempts, end.stop), (2, StopReason::BudgetExhausted));
    assert_eq!(
        exhausted_mark(&first),
        Some("true"),
        "it retried, then gave up"
    );
    assert_eq!(budget.tokens(), 0.0);

    let second = within(client.get(server.url()).send()).await.unwrap();
    let end = probe.last();
    assert_eq!((end.attempts, end.stop), (1, StopReason::BudgetExhausted));
    assert_eq!(
        exhausted_mark(&second),
        Some("true"),
        "the budget refused its retry: callers further up must not retry either"
    );
    assert_eq!(server.attempts_seen(), ["1", "2", "1"]);
    assert_eq!(probe.0.budget_refused.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_open_breaker_is_never_retried_into_nor_charged_to_the_budget() {
    let server = serve(|_| Reply::Status(503, &[])).await;
    let budget = Arc::new(TokenBucket::spend_per_retry(10, 0.1).unwrap());
    let (client, probe) = client_with(
        policy(
            "retry = { max_attempts = 4 }\nbreaker = { count = 2, minimum_throughput = 2, open = \"60s\" }",
        ),
        Some(budget.clone()),
    );
    // Two failed attempts open the breaker; the third is refused before it is sent.
    let err = within(client.get(server.url()).send()).await.unwrap_err();
    let err = stack_error(&err);
    assert!(
        matches!(err.refusal(), Some(Refusal::BreakerOpen(_))),
        "{err:?}"
    );
    assert!(err.is_exhausted(), "a refusal is marked exhausted");
    assert_eq!(server.attempts_seen(), ["1", "2"]);
    assert_eq!(
        budget.tokens(),
        9.0,
        "one retry sent, the refused one not charged"
    );
    assert_eq!(probe.last().stop, StopReason::BreakerOpen);

    // While it is open, nothing is sent and nothing is charged.
    for _ in 0..3 {
        let err = within(client.get(server.url()).send()).await.unwrap_err();
        let err = stack_error(&err);
        assert_eq!(err.attempts(), 0);
        assert_eq!(err.stop(), Some(StopReason::BreakerOpen));
        assert!(err.is_exhausted());
    }
    assert_eq!(server.hits().len(), 2);
    assert_eq!(budget.tokens(), 9.0);
    let refused = probe.0.refused.lock().unwrap().clone();
    assert_eq!(refused.len(), 4, "{refused:?}");
    assert_eq!(probe.0.budget_refused.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn each_attempt_carries_its_own_shrinking_deadline_downstream() {
    let server = serve(|_| Reply::Hang).await;
    // 1 s for the call, 600 ms per try, 10 % of each attempt's time kept as the hop's reserve.
    let (client, probe) = client(policy(
        "retry = { max_attempts = 3, min_call = \"50ms\" }\n\
         timeouts = { per_try = \"600ms\", overall = \"1s\" }\n\
         deadline = { reserve = 0.1 }",
    ));
    let err = within(client.get(server.url()).send()).await.unwrap_err();
    let err = stack_error(&err);
    assert!(err.is_timeout(), "{err:?}");
    let seen: Vec<Duration> = server
        .hits()
        .iter()
        .map(|h| h.grpc_timeout.expect("every attempt carries its deadline"))
        .collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    // The first attempt: its per-try timeout, less the reserve.
    assert_eq!(seen[0], 540 * MS);
    // The second: what was left of the second, less the reserve — shorter than the first.
    assert!(seen[1] < seen[0], "{seen:?}");
    assert!(seen[1] <= (1000 - 600) * 9 / 10 * MS, "{seen:?}");
    assert_eq!(probe.last().stop, StopReason::DeadlineTooClose);
    assert!(err.is_exhausted());
}

#[tokio::test]
async fn the_callers_deadline_bounds_every_attempt() {
    let server = serve(|n| match n {
        0 => Reply::Status(503, &[]),
        _ => Reply::Status(200, &[]),
    })
    .await;
    let (client, _) = client(retrying(3));
    let deadline = Deadline::after(Duration::from_secs(2), Clock::tokio());
    let response = within(deadline::scope(deadline, client.get(server.url()).send()))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seen: Vec<Duration> = server
        .hits()
        .iter()
        .map(|h| h.grpc_timeout.unwrap())
        .collect();
    assert!(
        seen.iter().all(|d| *d <= Duration::from_secs(2)),
        "{seen:?}"
    );
    assert!(seen[1] < seen[0], "{seen:?}");
}

#[tokio::test]
async fn a_response_marked_exhausted_is_not_retried() {
    let server = serve(|_| Reply::Status(503, &[("x-retry-exhausted", "true")])).await;
    let (client, probe) = client(retrying(3));
    let response = within(client.get(server.url()).send()).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(server.hits().len(), 1);
    assert_eq!(probe.last().stop, StopReason::NeverRetry);
    assert_eq!(
        exhausted_mark(&response),
        Some("true"),
        "passed on upstream"
    );
}

#[tokio::test]
async fn giving_up_after_retries_marks_the_response() {
    let server = serve(|_| Reply::Status(502, &[])).await;
    let (client, probe) = client(retrying(3));
    let response = within(client.get(server.url()).send()).await.unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(server.attempts_seen(), ["1", "2", "3"]);
    assert_eq!(probe.last().stop, StopReason::AttemptsExhausted);
    assert!(probe.last().marked_exhausted);
    assert_eq!(exhausted_mark(&response), Some("true"));
}

#[tokio::test]
async fn a_retry_after_beyond_the_deadline_stops_at_once() {
    let server = serve(|_| Reply::Status(503, &[("retry-after", "60")])).await;
    let (client, probe) = client(retrying(5));
    let deadline = Deadline::after(Duration::from_secs(5), Clock::tokio());
    let response = within(deadline::scope(deadline, client.get(server.url()).send()))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(server.hits().len(), 1);
    let end = probe.last();
    assert_eq!((end.attempts, end.stop), (1, StopReason::DeadlineTooClose));
    assert_eq!(exhausted_mark(&response), Some("true"));
}

#[tokio::test]
async fn a_retry_after_is_waited_out() {
    let server = serve(|n| match n {
        0 => Reply::Status(429, &[("retry-after", "1")]),
        _ => Reply::Status(200, &[]),
    })
    .await;
    let (client, _) = client(retrying(3));
    let response = within(client.get(server.url()).send()).await.unwrap();
    assert_eq!(response.status(), 200);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    // The server stamped the first hit before answering and the second after the client
    // slept: the gap cannot be shorter than Retry-After (the backoff alone is 5 ms).
    let gap = hits[1].at - hits[0].at;
    assert!(gap >= Duration::from_secs(1), "retried after only {gap:?}");
}

#[tokio::test]
async fn a_stream_over_the_replay_limit_is_sent_once() {
    let server = serve(|_| Reply::Status(503, &[])).await;
    let probe = Probe::default();
    let layer = ClientLayerBuilder::single(DEFAULT_ROUTE, retrying(3))
        .with_body_limit(4)
        .with_observer(probe.clone())
        .build()
        .unwrap();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(ClientMiddleware::from(layer))
        .build();
    let body = reqwest::Body::wrap(String::from("streamed"));
    let response = within(client.put(server.url()).body(body).send())
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(server.attempts_seen(), ["1"]);
    assert_eq!(server.hits()[0].body, "streamed");
    assert_eq!(probe.last().stop, StopReason::NeverRetry);
}

#[tokio::test]
async fn a_cloneable_body_is_hedged_and_the_first_answer_wins() {
    let server = serve(|n| match n {
        0 => Reply::Hang,
        _ => Reply::Status(200, &[]),
    })
    .await;
    let (client, probe) = client(policy(
        "idempotency = \"idempotent\"\nhedge = { max_attempts = 2, delay = \"20ms\" }",
    ));
    let response = within(client.put(server.url()).body("put me").send())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    assert!(hits.iter().all(|h| h.body == "put me"), "{hits:?}");
    let hedges = probe.0.hedges.lock().unwrap().clone();
    assert!(
        hedges.contains(&HedgeEvent::Sent { attempt: 2 }),
        "{hedges:?}"
    );
    assert!(
        hedges.contains(&HedgeEvent::Won { attempt: 2 }),
        "{hedges:?}"
    );
    assert!(
        hedges.contains(&HedgeEvent::Cancelled { attempt: 1 }),
        "{hedges:?}"
    );
    assert_eq!(probe.last().stop, StopReason::Succeeded);
}

#[tokio::test]
async fn a_refused_connection_is_retried_even_for_a_post() {
    // A port that was just free: nothing listens on it.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let (client, probe) = client(retrying(3));
    let err = within(
        client
            .post(format!("http://{addr}/"))
            .body("nothing was sent")
            .send(),
    )
    .await
    .unwrap_err();
    assert!(err.is_connect(), "reqwest's own error: {err:?}");
    let end = probe.last();
    assert_eq!((end.attempts, end.stop), (3, StopReason::AttemptsExhausted));
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
    let (client, probe) = client(retrying(3));
    let url = format!("http://{addr}/");

    let err = within(client.post(&url).body("in doubt").send())
        .await
        .unwrap_err();
    assert!(!err.is_connect(), "{err:?}");
    assert_eq!(probe.last().stop, StopReason::NotIdempotent);
    assert_eq!(*requests.lock().unwrap(), 1);

    within(client.get(&url).send()).await.unwrap_err();
    assert_eq!(probe.last().stop, StopReason::AttemptsExhausted);
    assert_eq!(*requests.lock().unwrap(), 1 + 3);
}
