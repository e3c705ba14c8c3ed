//! gRPC through the proxy over h2c: an HTTP/2 caller is forwarded over HTTP/2, trailers
//! (where gRPC carries its status) pass through, and a retryable status is retried.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use http::{HeaderMap, Request, Response, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Barrier;

use common::*;

/// A length-prefixed gRPC message of two bytes.
const MESSAGE: &[u8] = b"\0\0\0\0\x02hi";

/// An h2c upstream answering every call with one message and `grpc-status` in the trailers:
/// `UNAVAILABLE` (14) to the first `fail_first` calls, then `OK` (0); each call waits at
/// `together` first, when given (so that many calls are in flight at once).
async fn grpc_upstream(
    fail_first: u32,
    together: Option<Arc<Barrier>>,
) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let calls = Arc::clone(&counted);
            let together = together.clone();
            let service = tower::service_fn(move |request: Request<Incoming>| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                let together = together.clone();
                async move {
                    if let Some(together) = together {
                        together.wait().await;
                    }
                    assert_eq!(request.version(), Version::HTTP_2, "forwarded over HTTP/2");
                    let _ = request.into_body().collect().await;
                    let status = if n < fail_first { "14" } else { "0" };
                    let mut trailers = HeaderMap::new();
                    trailers.insert("grpc-status", status.parse().expect("value"));
                    let body = Full::new(Bytes::from_static(MESSAGE))
                        .with_trailers(async move { Some(Ok::<_, Infallible>(trailers)) });
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "application/grpc")
                            .body(body)
                            .expect("response"),
                    )
                }
            });
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                    .await;
            });
        }
    });
    (addr, calls)
}

/// One unary call over h2c to `addr`: the body and the trailers.
async fn call(addr: SocketAddr) -> (Bytes, HeaderMap) {
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    call_with(&client, addr).await
}

/// One unary call over `client`'s h2c connection to `addr`: the body and the trailers.
async fn call_with(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
) -> (Bytes, HeaderMap) {
    let request = Request::post(format!("http://{addr}/relay.Relay/Call"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(MESSAGE)))
        .expect("request");
    let response = client.request(request).await.expect("an answer");
    assert_eq!(response.version(), Version::HTTP_2);
    let collected = response.into_body().collect().await.expect("body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    (collected.to_bytes(), trailers)
}

#[tokio::test]
async fn a_grpc_call_passes_through_h2c_with_its_trailers() {
    let (up, calls) = grpc_upstream(0, None).await;
    let proxy = egress(Some(up), "").await;

    let (body, trailers) = call(proxy.local_addr()).await;

    assert_eq!(&body[..], MESSAGE);
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_unavailable_grpc_call_is_retried_by_its_policy() {
    let (up, calls) = grpc_upstream(1, None).await;
    let proxy = egress(
        Some(up),
        r#"
        [endpoints."POST /relay.Relay/*"]
        idempotency = "idempotent"
        retry = { max_attempts = 3 }
        backoff = { kind = "fixed", base = "1ms" }
    "#,
    )
    .await;

    let (_, trailers) = call(proxy.local_addr()).await;

    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// HTTP/2 streams of one connection overlap in the proxy: each is called on the connection's
/// copy of the service (`Serve`), and the upstream answers neither until both have arrived.
#[tokio::test]
async fn overlapping_streams_of_one_connection_are_all_served() {
    let (up, calls) = grpc_upstream(0, Some(Arc::new(Barrier::new(3)))).await;
    let proxy = egress(Some(up), "").await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let addr = proxy.local_addr();
    // A bound in case they do not overlap (the upstream would wait for ever), not a timing.
    let answers = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(
            call_with(&client, addr),
            call_with(&client, addr),
            call_with(&client, addr)
        )
    })
    .await
    .expect("the three calls were in flight together");
    for (body, trailers) in [answers.0, answers.1, answers.2] {
        assert_eq!(&body[..], MESSAGE);
        assert_eq!(trailers["grpc-status"], "0");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}
