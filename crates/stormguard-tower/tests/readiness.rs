//! The stack keeps tower's readiness contract with its inner service: the first attempt goes
//! through the service the caller made ready, retries through clones made ready first. A
//! `Buffer` (what a tonic `Channel` is) panics when called on a clone that was never polled
//! ready; before this was fixed, every call through the stack over a tonic channel did.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::policy::EndpointPolicy;
use stormguard::retry::RetryPolicy;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::ClientLayerBuilder;
use tower::buffer::Buffer;
use tower::{Layer, ServiceExt, service_fn};

#[tokio::test(start_paused = true)]
async fn a_buffered_inner_service_is_called_only_when_ready() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    // Fails twice, then answers.
    let flaky = service_fn(move |_req: Request<ReplayBody<Full<Bytes>>>| {
        let status = match counted.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::OK,
        };
        async move {
            let mut response = Response::new(Full::<Bytes>::default());
            *response.status_mut() = status;
            Ok::<_, Infallible>(response)
        }
    });
    let policy = EndpointPolicy::new(
        RetryPolicy::new(3)
            .with_backoff(Backoff::fixed(Duration::from_millis(1)).with_jitter(Jitter::None)),
    );
    let stack = ClientLayerBuilder::single("buffered", policy)
        .with_observer(())
        .build()
        .unwrap()
        .layer(Buffer::new(flaky, 4));
    for _ in 0..2 {
        calls.store(0, Ordering::SeqCst);
        let request = Request::get("http://buffered/")
            .body(Full::default())
            .unwrap();
        let response = stack.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "two retries, each through a ready clone"
        );
    }
}
