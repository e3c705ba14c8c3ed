//! gRPC: status in trailers or trailers-only headers, A6 codes, pushback, and
//! `grpc-previous-rpc-attempts`, against a hand-built HTTP/2 server (no codegen).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::{TokioExecutor, TokioIo};
use stormguard_tower::body::ReplayBody;
use stormguard_tower::retry::RetryLayer;
use stormguard_tower::wire::is_exhausted;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt, service_fn};

type Body = BoxBody<Bytes, Infallible>;

/// A length-prefixed gRPC message.
fn message(payload: &[u8]) -> Bytes {
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(payload);
    Bytes::from(framed)
}

/// A unary gRPC response: one message, then trailers with `status` (and `extra`).
fn unary(payload: &[u8], status: u8, extra: &[(&'static str, &'static str)]) -> Response<Body> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(u16::from(status)));
    for (name, value) in extra {
        trailers.insert(*name, HeaderValue::from_static(value));
    }
    let frames = vec![
        Ok(Frame::data(message(payload))),
        Ok(Frame::trailers(trailers)),
    ];
    Response::builder()
        .header("content-type", "application/grpc")
        .body(StreamBody::new(futures::stream::iter(frames)).boxed())
        .unwrap()
}

/// A trailers-only response: the status in the headers, no body.
fn trailers_only(status: u8, extra: &[(&'static str, &'static str)]) -> Response<Body> {
    let mut response = Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", HeaderValue::from(u16::from(status)));
    for (name, value) in extra {
        response = response.header(*name, *value);
    }
    response.body(Full::default().boxed()).unwrap()
}

/// What the server saw per method: the `grpc-previous-rpc-attempts` header of each call.
type Seen = Arc<Mutex<HashMap<String, Vec<Option<String>>>>>;

/// An HTTP/2 server whose methods fail as their names say, then succeed.
async fn grpc_server(seen: Seen) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let previous = req
                    .headers()
                    .get("grpc-previous-rpc-attempts")
                    .map(|v| v.to_str().unwrap().to_owned());
                let method = req.uri().path().to_owned();
                let n = {
                    let mut seen = seen.lock().unwrap();
                    let calls = seen.entry(method.clone()).or_default();
                    calls.push(previous);
                    calls.len()
                };
                let response = match (method.as_str(), n) {
                    ("/shop.Orders/Unavailable", 1) => unary(b"", 14, &[]),
                    ("/shop.Orders/Unavailable", _) => unary(b"order-7", 0, &[]),
                    ("/shop.Orders/TrailersOnly", 1) => trailers_only(14, &[]),
                    ("/shop.Orders/TrailersOnly", _) => unary(b"order-8", 0, &[]),
                    ("/shop.Orders/Invalid", _) => unary(b"", 3, &[]),
                    ("/shop.Orders/Big", _) => unary(&[7u8; 1000], 14, &[]),
                    _ => trailers_only(12, &[]),
                };
                async move { Ok::<_, Infallible>(response) }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn grpc_request(addr: SocketAddr, method: &str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(message(b"get order")))
        .unwrap()
}

/// The response's data and trailers.
async fn read<B>(response: Response<B>) -> (Bytes, HeaderMap)
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    (collected.to_bytes(), trailers)
}

#[tokio::test]
async fn grpc_statuses_over_http2() {
    let seen = Seen::default();
    let addr = grpc_server(seen.clone()).await;
    let layer = RetryLayer::builder(support::quick(3))
        .with_grpc_response_limit(256)
        .build()
        .expect("valid policy");
    let client = ServiceBuilder::new()
        .layer(layer)
        .service(support::h2_client());
    let call = |method: &'static str| client.clone().oneshot(grpc_request(addr, method));

    // UNAVAILABLE in the trailers, then OK: retried, and the caller reads the buffered
    // response — message and trailers — as sent.
    let response = call("/shop.Orders/Unavailable").await.unwrap();
    assert!(!is_exhausted(response.headers()));
    let (data, trailers) = read(response).await;
    assert_eq!(data, message(b"order-7"));
    assert_eq!(trailers["grpc-status"], "0");

    // UNAVAILABLE in a trailers-only response, then OK.
    let (data, trailers) = read(call("/shop.Orders/TrailersOnly").await.unwrap()).await;
    assert_eq!(data, message(b"order-8"));
    assert_eq!(trailers["grpc-status"], "0");

    // INVALID_ARGUMENT: not retried, not marked.
    let response = call("/shop.Orders/Invalid").await.unwrap();
    assert!(!is_exhausted(response.headers()));
    assert_eq!(read(response).await.1["grpc-status"], "3");

    // A response over the read limit is committed: handed on unread, not retried.
    let (data, trailers) = read(call("/shop.Orders/Big").await.unwrap()).await;
    assert_eq!(data, message(&[7u8; 1000]));
    assert_eq!(trailers["grpc-status"], "14");

    let seen = seen.lock().unwrap();
    let previous = |method: &str| seen[method].clone();
    let on_retry = vec![None, Some("1".to_owned())];
    assert_eq!(previous("/shop.Orders/Unavailable"), on_retry);
    assert_eq!(previous("/shop.Orders/TrailersOnly"), on_retry);
    assert_eq!(previous("/shop.Orders/Invalid"), vec![None]);
    assert_eq!(previous("/shop.Orders/Big"), vec![None]);
}

#[tokio::test]
async fn configured_codes_are_retried_until_exhausted_and_marked() {
    let addr = grpc_server(Seen::default()).await;
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(support::quick(3)).expect("valid policy"))
        .service(support::h2_client());
    // Unknown methods answer UNIMPLEMENTED; with UNIMPLEMENTED retryable, three attempts.
    let layer = RetryLayer::builder(support::quick(3))
        .with_grpc_codes(stormguard::classify::GrpcCodeSet::of(&[
            stormguard::classify::GrpcCode::Unimplemented,
        ]))
        .build()
        .expect("valid policy");
    let retrying = ServiceBuilder::new()
        .layer(layer)
        .service(support::h2_client());
    let response = retrying
        .oneshot(grpc_request(addr, "/shop.Orders/Nope"))
        .await
        .unwrap();
    assert!(is_exhausted(response.headers()));
    assert_eq!(response.headers()["grpc-status"], "12");
    // With the default codes it is not retried (and not marked).
    let response = client
        .oneshot(grpc_request(addr, "/shop.Orders/Nope"))
        .await
        .unwrap();
    assert!(!is_exhausted(response.headers()));
}

type Calls = Arc<Mutex<Vec<(Instant, Option<String>)>>>;

/// The answer of the in-process service, ready at once.
type Answer = std::future::Ready<Result<Response<Body>, Infallible>>;

/// In process: answers `first` to the first call, OK to the others.
fn pushing_back(
    calls: Calls,
    first: Response<Body>,
) -> impl tower::Service<
    Request<ReplayBody<Full<Bytes>>>,
    Response = Response<Body>,
    Error = Infallible,
    Future = Answer,
> + Clone {
    let first = Arc::new(Mutex::new(Some(first)));
    service_fn(move |req: Request<ReplayBody<Full<Bytes>>>| {
        let previous = req
            .headers()
            .get("grpc-previous-rpc-attempts")
            .map(|v| v.to_str().unwrap().to_owned());
        calls.lock().unwrap().push((Instant::now(), previous));
        let response = first
            .lock()
            .unwrap()
            .take()
            .unwrap_or_else(|| unary(b"ok", 0, &[]));
        std::future::ready(Ok(response))
    })
}

fn local_request() -> Request<Full<Bytes>> {
    Request::post("http://shop/shop.Orders/Get")
        .header("content-type", "application/grpc")
        .body(Full::new(message(b"get")))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn pushback_is_honoured() {
    let calls = Calls::default();
    let first = unary(b"", 14, &[("grpc-retry-pushback-ms", "3000")]);
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(support::quick(3)).expect("valid policy"))
        .service(pushing_back(calls.clone(), first));
    let response = client.oneshot(local_request()).await.unwrap();
    assert_eq!(read(response).await.1["grpc-status"], "0");
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].0 - calls[0].0, Duration::from_millis(3000));
    assert_eq!(calls[1].1.as_deref(), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn negative_pushback_means_do_not_retry() {
    let calls = Calls::default();
    let first = trailers_only(14, &[("grpc-retry-pushback-ms", "-1")]);
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(support::quick(3)).expect("valid policy"))
        .service(pushing_back(calls.clone(), first));
    let response = client.oneshot(local_request()).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
    assert!(!is_exhausted(response.headers()));
    assert_eq!(calls.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_http_failure_without_grpc_status_maps_to_unavailable() {
    let calls = Calls::default();
    let first = Response::builder()
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .body(Full::default().boxed())
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(support::quick(3)).expect("valid policy"))
        .service(pushing_back(calls.clone(), first));
    let response = client.oneshot(local_request()).await.unwrap();
    assert_eq!(read(response).await.1["grpc-status"], "0");
    assert_eq!(calls.lock().unwrap().len(), 2);
}
