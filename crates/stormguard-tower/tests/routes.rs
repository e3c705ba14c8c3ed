//! Per-route policies from a policy file (in process, paused time), and what each attempt
//! carries to the transport.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use stormguard::policy::PolicyFile;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::{ClientLayer, ConnectTimeout};
use stormguard_tower::retry::RetryLayer;
use stormguard_tower::wire::is_exhausted;
use tower::{ServiceBuilder, ServiceExt, service_fn};

const POLICIES: &str = r#"
    [endpoints.default]
    retry = { max_attempts = 1 }

    [endpoints."GET /search/*"]
    retry = { max_attempts = 4 }
    backoff = { kind = "fixed", base = "1ms", cap = "1ms", jitter = "none" }

    [endpoints."POST /search/*"]
    idempotency = "idempotent"
    retry = { max_attempts = 2 }
    backoff = { kind = "fixed", base = "1ms", cap = "1ms", jitter = "none" }
    budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }

    [endpoints."/slow"]
    timeouts = { overall = "100ms" }
    retry = { max_attempts = 5 }
    backoff = { kind = "fixed", base = "60ms", cap = "60ms", jitter = "none" }
"#;

#[tokio::test(start_paused = true)]
async fn each_route_gets_its_policy() {
    let file = PolicyFile::from_toml(POLICIES).unwrap();
    let layer = RetryLayer::routed(&file).build().expect("valid policies");
    let calls: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let seen = calls.clone();
    let downstream = service_fn(move |req: Request<ReplayBody<Full<Bytes>>>| {
        *seen
            .lock()
            .unwrap()
            .entry(format!("{} {}", req.method(), req.uri().path()))
            .or_default() += 1;
        let mut response = Response::new(Full::<Bytes>::default());
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        std::future::ready(Ok::<_, Infallible>(response))
    });
    let client = ServiceBuilder::new().layer(layer).service(downstream);
    for (method, path, marked) in [
        (Method::GET, "/search/books", true),
        (Method::POST, "/search/books", true),
        (Method::GET, "/other", false),
        (Method::GET, "/slow", true),
    ] {
        let request = Request::builder()
            .method(method)
            .uri(format!("http://catalog{path}"))
            .body(Full::default())
            .unwrap();
        let response = client.clone().oneshot(request).await.unwrap();
        assert_eq!(is_exhausted(response.headers()), marked, "{path}");
    }
    let calls = calls.lock().unwrap();
    assert_eq!(calls["GET /search/books"], 4);
    // POST is retried because the route says it is idempotent.
    assert_eq!(calls["POST /search/books"], 2);
    assert_eq!(calls["GET /other"], 1);
    // 100 ms overall: a retry after 60 ms fits, a second one (at 120 ms) does not.
    assert_eq!(calls["GET /slow"], 2);
}

/// The path and connect timeout of each attempt the transport was given.
type Seen = Vec<(String, Option<ConnectTimeout>)>;

#[tokio::test(start_paused = true)]
async fn every_attempt_carries_its_routes_connect_timeout_to_the_transport() {
    let routes = |connect: &str| {
        let toml = r#"
            [endpoints."GET /bounded/*"]
            timeouts = { connect = "CONNECT" }
            retry = { max_attempts = 3 }
            backoff = { kind = "fixed", base = "1ms", cap = "1ms", jitter = "none" }

            [endpoints."GET /plain/*"]
            retry = { max_attempts = 2 }
            backoff = { kind = "fixed", base = "1ms", cap = "1ms", jitter = "none" }
        "#;
        PolicyFile::from_toml(&toml.replace("CONNECT", connect)).unwrap()
    };
    let layer = ClientLayer::from_policy_file(&routes("100ms")).expect("valid policies");
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let record = seen.clone();
    let downstream = service_fn(move |req: Request<ReplayBody<Full<Bytes>>>| {
        let connect = req.extensions().get::<ConnectTimeout>().copied();
        record
            .lock()
            .unwrap()
            .push((req.uri().path().to_owned(), connect));
        let mut response = Response::new(Full::<Bytes>::default());
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        std::future::ready(Ok::<_, Infallible>(response))
    });
    let client = ServiceBuilder::new()
        .layer(layer.clone())
        .service(downstream);
    let get = |path: &str| {
        Request::get(format!("http://catalog{path}"))
            .body(Full::default())
            .unwrap()
    };
    let _ = client.clone().oneshot(get("/bounded/1")).await.unwrap();
    let _ = client.clone().oneshot(get("/plain/1")).await.unwrap();
    // After a swap, the next call carries the new value.
    layer.policies().swap(&routes("250ms")).expect("swap");
    let _ = client.clone().oneshot(get("/bounded/2")).await.unwrap();

    let bounded = Some(ConnectTimeout(Duration::from_millis(100)));
    let swapped = Some(ConnectTimeout(Duration::from_millis(250)));
    let seen = seen.lock().unwrap().clone();
    let expected: Seen = [
        ("/bounded/1", bounded),
        ("/bounded/1", bounded),
        ("/bounded/1", bounded),
        ("/plain/1", None),
        ("/plain/1", None),
        ("/bounded/2", swapped),
        ("/bounded/2", swapped),
        ("/bounded/2", swapped),
    ]
    .into_iter()
    .map(|(path, connect)| (path.to_owned(), connect))
    .collect();
    assert_eq!(seen, expected);
}
