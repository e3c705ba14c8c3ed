//! Only one layer of a call chain retries: a three-hop chain over real sockets, a RetryLayer
//! at every hop, a bottom service that always answers 503.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use http::{Request, StatusCode};
use stormguard::budget::{RetryBudget, TokenBucket};
use stormguard_tower::retry::RetryLayer;
use stormguard_tower::wire::{is_exhausted, mark_exhausted};
use tower::{ServiceBuilder, ServiceExt};

fn counter() -> Arc<AtomicU32> {
    Arc::new(AtomicU32::new(0))
}

/// The bottom: counts requests and always answers 503.
async fn bottom(hits: Arc<AtomicU32>) -> SocketAddr {
    let app = Router::new().route(
        "/",
        any(move || {
            hits.fetch_add(1, Ordering::SeqCst);
            async { StatusCode::SERVICE_UNAVAILABLE }
        }),
    );
    support::serve(app).await
}

/// A hop: its handler calls `next` through a hyper client wrapped in `layer`, and answers
/// with the downstream's status — forwarding the exhausted mark when `forward_mark`.
async fn hop(
    next: SocketAddr,
    layer: RetryLayer,
    hits: Arc<AtomicU32>,
    forward_mark: bool,
) -> SocketAddr {
    let client = ServiceBuilder::new()
        .layer(layer)
        .service(support::client());
    let app = Router::new().route(
        "/",
        any(move || {
            hits.fetch_add(1, Ordering::SeqCst);
            let client = client.clone();
            async move {
                let request = Request::get(format!("http://{next}/"))
                    .body(support::full(""))
                    .unwrap();
                let (status, exhausted) = match client.oneshot(request).await {
                    Ok(response) => (response.status(), is_exhausted(response.headers())),
                    Err(e) => (StatusCode::BAD_GATEWAY, e.is_exhausted()),
                };
                let mut response: Response = status.into_response();
                if forward_mark && exhausted {
                    mark_exhausted(response.headers_mut());
                }
                response
            }
        }),
    );
    support::serve(app).await
}

struct Chain {
    entry: SocketAddr,
    /// Requests seen by A, B, C and the bottom.
    hits: [Arc<AtomicU32>; 4],
}

impl Chain {
    /// A → B → C → bottom; `layers[0]` is A's client layer.
    async fn new(layers: [RetryLayer; 3], forward_mark: bool) -> Chain {
        let hits = [counter(), counter(), counter(), counter()];
        let [a, b, c] = layers;
        let bottom = bottom(hits[3].clone()).await;
        let c = hop(bottom, c, hits[2].clone(), forward_mark).await;
        let b = hop(c, b, hits[1].clone(), forward_mark).await;
        let entry = hop(b, a, hits[0].clone(), forward_mark).await;
        Chain { entry, hits }
    }

    /// Sends one request to A with a plain client (no retries) and returns the response.
    async fn call(&self) -> http::Response<hyper::body::Incoming> {
        let request = Request::get(format!("http://{}/", self.entry))
            .body(support::full(""))
            .unwrap();
        support::client().request(request).await.unwrap()
    }

    fn counts(&self) -> [u32; 4] {
        self.hits.each_ref().map(|h| h.load(Ordering::SeqCst))
    }
}

#[tokio::test]
async fn the_bottom_sees_one_layers_attempts_not_the_product() {
    let layers = [(); 3].map(|_| RetryLayer::new(support::quick(3)).expect("valid policy"));
    let chain = Chain::new(layers, true).await;
    let response = chain.call().await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        is_exhausted(response.headers()),
        "the mark reaches the entry"
    );
    // C's layer retried (3 attempts) and marked its answer; B's and A's did not retry it.
    assert_eq!(chain.counts(), [1, 1, 1, 3]);
}

#[tokio::test]
async fn without_forwarding_the_mark_every_layer_multiplies() {
    let layers = [(); 3].map(|_| RetryLayer::new(support::quick(3)).expect("valid policy"));
    let chain = Chain::new(layers, false).await;
    let response = chain.call().await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(chain.counts(), [1, 3, 9, 27]);
}

#[tokio::test]
async fn a_budget_bounds_the_bottom_further() {
    // gRPC A6 buckets (10 tokens, 0.1 per success): a failure costs a token, and a retry is
    // allowed while more than 5 are left.
    let buckets = [(); 3].map(|_| Arc::new(TokenBucket::grpc(10, 0.1).unwrap()));
    let layers = buckets.each_ref().map(|bucket| {
        RetryLayer::builder(support::quick(3))
            .with_budget(bucket.clone() as Arc<dyn RetryBudget>)
            .build()
            .expect("valid policy")
    });
    let chain = Chain::new(layers, true).await;
    for _ in 0..5 {
        let response = chain.call().await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(is_exhausted(response.headers()));
    }
    // C's bucket: request 1 sends 3 attempts (10 → 7 tokens), request 2 sends 2 (→ 5, the
    // retry is refused), requests 3 to 5 one each: 3 + 2 + 1 + 1 + 1 = 8, not 15.
    assert_eq!(chain.counts(), [5, 5, 5, 8]);
    // A marked response is never retried, nor counted against the upstream budgets.
    assert_eq!(buckets[2].tokens(), 2.0);
    assert_eq!(buckets[1].tokens(), 10.0);
    assert_eq!(buckets[0].tokens(), 10.0);
}
