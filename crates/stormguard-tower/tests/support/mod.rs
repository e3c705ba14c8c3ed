//! Shared helpers of the integration tests: servers on 127.0.0.1:0, hyper clients, policies.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http_body::Body;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stormguard::backoff::{Backoff, Jitter};
use stormguard::retry::RetryPolicy;
use stormguard_tower::wire::BoxError;

/// Serves `app` on a fresh port of 127.0.0.1 and returns the address.
pub(crate) async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("server runs");
    });
    addr
}

/// hyper-util's legacy client over HTTP/1.
pub(crate) fn client<B>() -> Client<HttpConnector, B>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    Client::builder(TokioExecutor::new()).build_http()
}

/// hyper-util's legacy client over HTTP/2 without TLS (prior knowledge), as gRPC uses.
pub(crate) fn h2_client<B>() -> Client<HttpConnector, B>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// `attempts` attempts, 1 ms apart (no jitter): fast tests whose counts do not depend on
/// timing.
pub(crate) fn quick(attempts: u32) -> RetryPolicy {
    RetryPolicy::new(attempts)
        .with_backoff(Backoff::fixed(Duration::from_millis(1)).with_jitter(Jitter::None))
}

/// A body of `Bytes`.
pub(crate) fn full(bytes: impl Into<Bytes>) -> http_body_util::Full<Bytes> {
    http_body_util::Full::new(bytes.into())
}
