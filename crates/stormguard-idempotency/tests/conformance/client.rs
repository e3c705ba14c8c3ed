//! Our own retrying client in front of our own idempotency server: the two read the
//! `Idempotency-Key` with one parser and agree on what an in-flight duplicate means.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::policy::EndpointPolicy;
use stormguard::retry::RetryPolicy;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::ClientLayerBuilder;
use tower::{Layer as _, ServiceExt as _};

use crate::suite::{Probe, layer, routes};
use crate::support::{TestEnv, serve};

/// A keyed POST whose first attempt hits its per-try timeout on a slow handler: the handler
/// runs to its end although the client gave up on that attempt, the retry is answered `409`
/// with `Retry-After` while it runs (which our client honours instead of failing), and the
/// client ends with the stored answer of the one execution.
pub(crate) async fn c01_a_keyed_retry_after_a_timeout_gets_the_stored_answer(env: &TestEnv) {
    let probe = Probe::gated();
    // The handler's first execution waits until the client's second request arrives, so that
    // the first attempt has timed out by then.
    let arrivals = Arc::new(AtomicUsize::new(0));
    let opener = {
        let probe = Arc::clone(&probe);
        let arrivals = Arc::clone(&arrivals);
        move |request: Request, next: Next| {
            let probe = Arc::clone(&probe);
            let arrivals = Arc::clone(&arrivals);
            async move {
                if arrivals.fetch_add(1, Ordering::SeqCst) == 1 {
                    probe.open_gate();
                }
                next.run(request).await
            }
        }
    };
    let app: Router = routes(&probe)
        .route_layer(layer(env))
        .layer(middleware::from_fn(opener));
    let addr = serve(app).await;

    let retry = RetryPolicy::new(6)
        .with_per_try_timeout(Duration::from_millis(50))
        .with_backoff(Backoff::fixed(Duration::from_millis(1)).with_jitter(Jitter::None));
    // No deadline on the wire: the server knows no deadline and runs the handler to its end.
    let stack = ClientLayerBuilder::single("payments", EndpointPolicy::new(retry))
        .without_propagation()
        .build()
        .expect("valid policy");
    let client =
        stack.layer(Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Full<Bytes>>>());
    let request = http::Request::post(format!("http://{addr}/pay"))
        .header("idempotency-key", "\"order-c01\"")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"amount\":10}")))
        .expect("request");
    let response = client.oneshot(request).await.expect("an answer");
    let status = response.status();
    let replayed = response.headers().get("idempotent-replayed").cloned();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(status, StatusCode::CREATED, "{body:?}");
    assert_eq!(replayed.as_ref().map(|v| v.as_bytes()), Some(&b"true"[..]));
    assert!(
        String::from_utf8_lossy(&body).contains("\"execution\":1"),
        "{body:?}"
    );
    assert_eq!(probe.runs(), 1, "the handler ran once");
    assert!(arrivals.load(Ordering::SeqCst) >= 2, "the client retried");
}
