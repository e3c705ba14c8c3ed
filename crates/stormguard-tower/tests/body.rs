//! Request bodies: replayed identically within the limit, sent once over it (real sockets).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, StreamBody};
use stormguard_tower::retry::RetryLayer;
use stormguard_tower::wire::BoxError;
use stormguard_tower::wire::is_exhausted;
use tower::{ServiceBuilder, ServiceExt};

type Body = BoxBody<Bytes, BoxError>;

/// `/upload` records every body it receives and answers 503 to the first `failures`.
async fn upload_server(bodies: Arc<Mutex<Vec<Bytes>>>, failures: usize) -> SocketAddr {
    let app = Router::new().route(
        "/upload",
        post(move |body: Bytes| {
            let n = {
                let mut bodies = bodies.lock().unwrap();
                bodies.push(body);
                bodies.len()
            };
            async move {
                if n <= failures {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                }
            }
        }),
    );
    support::serve(app).await
}

fn keyed_post(addr: SocketAddr, body: Body) -> Request<Body> {
    Request::post(format!("http://{addr}/upload"))
        .header("idempotency-key", "\"upload-1\"")
        .body(body)
        .unwrap()
}

/// A body streamed in `chunks` pieces of `size` bytes, without a length known up front.
fn streamed(chunks: usize, size: usize) -> Body {
    let frames = (0..chunks).map(move |i| {
        let byte = b'a' + (i % 26) as u8;
        Ok::<_, Infallible>(Frame::data(Bytes::from(vec![byte; size])))
    });
    StreamBody::new(futures::stream::iter(frames))
        .map_err(|never| match never {})
        .boxed()
}

#[tokio::test]
async fn a_small_body_is_replayed_identically() {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let addr = upload_server(bodies.clone(), 2).await;
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(support::quick(3)).expect("valid policy"))
        .service(support::client::<stormguard_tower::body::ReplayBody<Body>>());
    let response = client
        .oneshot(keyed_post(addr, streamed(4, 8)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bodies = bodies.lock().unwrap();
    assert_eq!(bodies.len(), 3);
    assert_eq!(bodies[0].len(), 32);
    assert_eq!(&bodies[0][..9], b"aaaaaaaab");
    assert!(bodies.iter().all(|b| *b == bodies[0]));
}

#[tokio::test]
async fn a_body_over_the_limit_is_sent_once_and_not_retried() {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let addr = upload_server(bodies.clone(), 2).await;
    let layer = RetryLayer::builder(support::quick(3))
        .with_body_limit(64)
        .build()
        .expect("valid policy");
    let client = ServiceBuilder::new()
        .layer(layer)
        .service(support::client::<stormguard_tower::body::ReplayBody<Body>>());
    // Streamed (the layer reads past the limit, then sends what it read and the rest) …
    let response = client
        .clone()
        .oneshot(keyed_post(addr, streamed(10, 100)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!is_exhausted(response.headers()), "it did not retry");
    // … and with a known length (the layer does not read it at all).
    let whole = support::full(vec![b'z'; 65])
        .map_err(|never| match never {})
        .boxed();
    let response = client.oneshot(keyed_post(addr, whole)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let bodies = bodies.lock().unwrap();
    assert_eq!(bodies.len(), 2, "one attempt each");
    assert_eq!(bodies[0].len(), 1000);
    assert_eq!(&bodies[0][95..105], b"aaaaabbbbb");
    assert_eq!(bodies[1].len(), 65);
}
