//! `breaker.isolated` in the live stack: a policy (an operator's, or a rule's published by the
//! policy center) holds an endpoint's breaker open — no call reaches the downstream, the
//! fallback answers where there is one — and the next policy without it lets the breaker go.
//! A policy that is refused changes no breaker; a time window can hold one open for its
//! length.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use stormguard::breaker::BreakerState;
use stormguard::deadline::WallClock;
use stormguard::policy::PolicyFile;
use stormguard::retry::StopReason;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::{
    Client, ClientLayer, ClientLayerBuilder, FALLBACK_HEADER, FallbackRequest,
};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt, service_fn};

type Body = Full<Bytes>;
type Svc = BoxCloneService<Request<ReplayBody<Body>>, Response<Body>, std::convert::Infallible>;

const BREAKER: &str = r#"breaker = { count = 10, minimum_throughput = 10, open = "1h" }"#;

fn policy(image: &str) -> PolicyFile {
    PolicyFile::from_toml(&format!(
        r#"
        [endpoints."GET /img/*"]
        retry = {{ max_attempts = 3 }}
        {image}

        [endpoints."GET /rates"]
        retry = {{ max_attempts = 2 }}
        "#
    ))
    .unwrap()
}

/// A downstream that answers 200 and counts the requests that reach it.
fn downstream(reached: Arc<AtomicUsize>) -> Svc {
    BoxCloneService::new(service_fn(move |_: Request<ReplayBody<Body>>| {
        reached.fetch_add(1, Ordering::SeqCst);
        async { Ok(Response::new(Full::new(Bytes::from_static(b"cdn")))) }
    }))
}

/// The status of the answer and whether the fallback gave it, or why the stack stopped.
async fn call(client: &Client<Svc>, path: &str) -> Result<Answer, StopReason> {
    let request = Request::builder()
        .uri(format!("http://svc{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    match client.clone().oneshot(request).await {
        Ok(response) => Ok(Answer {
            status: response.status(),
            from_fallback: response.headers().contains_key(FALLBACK_HEADER),
        }),
        Err(error) => Err(error.stop().expect("a stop reason")),
    }
}

#[derive(Debug, PartialEq)]
struct Answer {
    status: StatusCode,
    from_fallback: bool,
}

const OK: Answer = Answer {
    status: StatusCode::OK,
    from_fallback: false,
};

fn image_breaker(layer: &ClientLayer) -> Option<BreakerState> {
    layer
        .policies()
        .endpoint_status()
        .into_iter()
        .find(|e| e.name == "GET /img/*")
        .and_then(|e| e.breaker)
}

fn stack(file: &PolicyFile) -> (ClientLayer, Client<Svc>, Arc<AtomicUsize>) {
    let reached = Arc::new(AtomicUsize::new(0));
    let layer = ClientLayerBuilder::routes(file)
        .with_seed(1)
        .build()
        .unwrap();
    let client = layer.layer(downstream(Arc::clone(&reached)));
    (layer, client, reached)
}

#[tokio::test(start_paused = true)]
async fn a_policy_holds_the_breaker_open_and_the_next_one_without_it_lets_go() {
    let (layer, client, reached) = stack(&policy(BREAKER));
    assert_eq!(call(&client, "/img/a.png").await, Ok(OK));
    assert_eq!(reached.load(Ordering::SeqCst), 1);

    let held = format!("{}\n", BREAKER.replace(" }", ", isolated = true }"));
    layer.policies().swap(&policy(&held)).unwrap();
    assert_eq!(image_breaker(&layer), Some(BreakerState::Isolated));
    for _ in 0..5 {
        assert_eq!(
            call(&client, "/img/a.png").await.err(),
            Some(StopReason::BreakerOpen)
        );
    }
    assert_eq!(
        reached.load(Ordering::SeqCst),
        1,
        "nothing reached the downstream"
    );
    // Other endpoints go on.
    assert_eq!(call(&client, "/rates").await, Ok(OK));
    assert_eq!(reached.load(Ordering::SeqCst), 2);

    // A later change that keeps `isolated` keeps the breaker held.
    let held_longer = held.replace("max_attempts = 3", "max_attempts = 1");
    let file = PolicyFile::from_toml(&format!(
        "[endpoints.\"GET /img/*\"]\nretry = {{ max_attempts = 1 }}\n{held_longer}"
    ))
    .unwrap();
    layer.policies().swap(&file).unwrap();
    assert_eq!(image_breaker(&layer), Some(BreakerState::Isolated));
    assert_eq!(
        call(&client, "/img/a.png").await.err(),
        Some(StopReason::BreakerOpen)
    );

    // The policy without it closes the breaker: calls reach the downstream again.
    layer.policies().swap(&policy(BREAKER)).unwrap();
    assert_eq!(image_breaker(&layer), Some(BreakerState::Closed));
    assert_eq!(call(&client, "/img/a.png").await, Ok(OK));
    assert_eq!(reached.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_held_breaker_is_answered_by_the_fallback() {
    let reached = Arc::new(AtomicUsize::new(0));
    let held = BREAKER.replace(" }", ", isolated = true }");
    let layer = ClientLayerBuilder::routes(&policy(&held))
        .with_seed(1)
        .with_fallback(|_: &FallbackRequest<'_>| Some(Response::new(Bytes::from_static(b"backup"))))
        .build()
        .unwrap();
    // Held open from the first policy on.
    assert_eq!(image_breaker(&layer), Some(BreakerState::Isolated));
    let client = layer.layer(downstream(Arc::clone(&reached)));
    assert_eq!(
        call(&client, "/img/a.png").await,
        Ok(Answer {
            status: StatusCode::OK,
            from_fallback: true
        })
    );
    assert_eq!(reached.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_refused_policy_holds_no_breaker() {
    let (layer, client, reached) = stack(&policy(BREAKER));
    let held = BREAKER.replace(" }", ", isolated = true }");
    // The file reads, but its second endpoint is no route the stack can follow (built after
    // the image endpoint, which is held open in the table being checked): refused whole.
    let bad = PolicyFile::from_toml(&format!(
        r#"
        [endpoints."GET /img/*"]
        {held}

        [endpoints."GET no-slash"]
        retry = {{ max_attempts = 2 }}
        "#
    ))
    .unwrap();
    assert!(layer.policies().swap(&bad).is_err());
    assert_eq!(image_breaker(&layer), Some(BreakerState::Closed));
    assert_eq!(call(&client, "/img/a.png").await, Ok(OK));
    assert_eq!(reached.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_time_window_holds_the_breaker_open_for_its_length() {
    // 01:59 UTC; the window is 02:00–03:00 UTC (a nightly maintenance of the CDN).
    let origin = SystemTime::UNIX_EPOCH + Duration::from_secs(20_000 * 86_400 + 2 * 3600 - 60);
    let start = tokio::time::Instant::now();
    let wall = WallClock::from_fn(move || origin + (tokio::time::Instant::now() - start));
    let file = PolicyFile::from_toml(&format!(
        r#"
        [endpoints."GET /img/*"]
        {BREAKER}

        [[endpoints."GET /img/*".windows]]
        start = "02:00"
        end = "03:00"
        time_zone = "UTC"
        overrides = {{ breaker = {{ isolated = true }} }}
        "#
    ))
    .unwrap();
    let reached = Arc::new(AtomicUsize::new(0));
    let layer = ClientLayerBuilder::routes(&file)
        .with_wall_clock(wall)
        .with_seed(1)
        .build()
        .unwrap();
    let client = layer.layer(downstream(Arc::clone(&reached)));
    assert_eq!(call(&client, "/img/a.png").await, Ok(OK));

    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(
        call(&client, "/img/a.png").await.err(),
        Some(StopReason::BreakerOpen)
    );
    assert_eq!(image_breaker(&layer), Some(BreakerState::Isolated));

    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(call(&client, "/img/a.png").await, Ok(OK));
    assert_eq!(image_breaker(&layer), Some(BreakerState::Closed));
    assert_eq!(reached.load(Ordering::SeqCst), 2);
}
