//! The ingress direction over real servers on 127.0.0.1: deadlines read and enforced,
//! idempotency keys, admission by the adaptive limit, in front of a scriptable upstream.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use stormguard::limit::{Aimd, LimiterConfig};
use stormguard_proxy::{IdempotencyConfig, IngressConfig, open_store};
use stormguard_tower::DeadlineLayer;
use stormguard_tower::deadline::MalformedPolicy;

use common::*;

#[tokio::test]
async fn an_expired_request_is_refused_before_the_service() {
    let up = upstream().await;
    let proxy = ingress(up.addr, IngressConfig::default()).await;
    let past = SystemTime::now()
        .checked_sub(Duration::from_secs(1))
        .expect("time")
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis();
    let mut request = get("/work");
    request.headers_mut().insert(
        "x-request-deadline",
        past.to_string().parse().expect("value"),
    );

    let answer = send(proxy.local_addr(), request).await;

    assert_eq!(answer.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(up.script.count(), 0, "the service never saw it");
}

#[tokio::test]
async fn a_request_that_already_passed_this_ingress_is_refused_as_a_loop() {
    let up = upstream().await;
    let proxy = ingress(up.addr, IngressConfig::default()).await;
    assert_eq!(
        send(proxy.local_addr(), get("/work")).await.status,
        StatusCode::OK
    );
    // The ingress's own Via entry, as the service saw it: a request coming back with it
    // went round (an upstream leading back here) and is not forwarded again.
    let via = up.script.seen()[0].headers["via"].clone();
    let mut again = get("/work");
    again.headers_mut().insert("via", via);

    let answer = send(proxy.local_addr(), again).await;

    assert_eq!(answer.status, StatusCode::LOOP_DETECTED, "{answer:?}");
    assert_eq!(answer.header(stormguard_proxy::REASON_HEADER), Some("loop"));
    assert_eq!(up.script.count(), 1, "the service saw only the first");
}

#[tokio::test]
async fn the_service_gets_the_time_left() {
    let up = upstream().await;
    let proxy = ingress(up.addr, IngressConfig::default()).await;
    let mut request = get("/work");
    request
        .headers_mut()
        .insert("grpc-timeout", "5S".parse().expect("value"));

    let answer = send(proxy.local_addr(), request).await;

    assert_eq!(answer.status, StatusCode::OK);
    let seen = up.script.seen();
    let timeout = seen[0].headers["grpc-timeout"].as_bytes();
    let left = stormguard::deadline::parse_grpc_timeout(timeout).expect("a grpc-timeout");
    assert!(
        left < Duration::from_secs(5),
        "less than the caller gave: {left:?}"
    );
    assert!(left > Duration::ZERO);
}

#[tokio::test]
async fn a_malformed_deadline_is_refused() {
    let up = upstream().await;
    let config = IngressConfig {
        deadline: DeadlineLayer::new().with_malformed(MalformedPolicy::Reject),
        ..IngressConfig::default()
    };
    let proxy = ingress(up.addr, config).await;
    let mut request = get("/work");
    request
        .headers_mut()
        .insert("grpc-timeout", "soon".parse().expect("value"));

    let answer = send(proxy.local_addr(), request).await;

    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(up.script.count(), 0);
}

async fn keyed(required: bool) -> IngressConfig {
    IngressConfig {
        idempotency: Some(IdempotencyConfig {
            store: open_store("memory").await.expect("an in-memory store"),
            key_required: required,
        }),
        ..IngressConfig::default()
    }
}

#[tokio::test]
async fn a_keyed_duplicate_is_answered_from_the_store() {
    let up = upstream().await;
    let proxy = ingress(up.addr, keyed(false).await).await;

    let first = send(proxy.local_addr(), post("/pay", Some("order-1"))).await;
    let again = send(proxy.local_addr(), post("/pay", Some("order-1"))).await;

    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(up.script.count(), 1, "the service ran it once");

    let unkeyed = send(proxy.local_addr(), post("/pay", None)).await;
    assert_eq!(unkeyed.status, StatusCode::OK, "keys are optional here");
}

#[tokio::test]
async fn a_missing_key_is_refused_when_required() {
    let up = upstream().await;
    let proxy = ingress(up.addr, keyed(true).await).await;

    let answer = send(proxy.local_addr(), post("/pay", None)).await;

    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(up.script.count(), 0);
}

#[tokio::test]
async fn requests_are_admitted_by_the_adaptive_limit() {
    let up = upstream().await;
    let config = IngressConfig {
        limit: Some(LimiterConfig::new(Aimd::new().with_limits(1, 4, 8))),
        ..IngressConfig::default()
    };
    let proxy = ingress(up.addr, config).await;

    let answer = send(proxy.local_addr(), get("/work")).await;

    assert_eq!(answer.status, StatusCode::OK);
    let limit = proxy.limit().expect("admission is on");
    assert_eq!(limit.stats().admitted, 1);
    let status = status(proxy.admin_addr().expect("admin")).await;
    assert_eq!(status["direction"], "ingress");
    assert_eq!(status["limit"]["limit"], 4);
}

#[tokio::test]
async fn an_ingress_needs_an_upstream() {
    let error = stormguard_proxy::Proxy::start(stormguard_proxy::ProxyConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        admin: None,
        upstream: None,
        direction: stormguard_proxy::Direction::Ingress(IngressConfig::default()),
        pool: stormguard_proxy::PoolConfig::default(),
    })
    .await
    .expect_err("no upstream");
    assert!(matches!(error, stormguard_proxy::ProxyError::NoUpstream));
}

/// An ingress whose limit admits one request at a time and learns the service time from
/// every window (one sample each).
async fn one_at_a_time(up: &TestUpstream) -> stormguard_proxy::Proxy {
    let config = IngressConfig {
        limit: Some(
            LimiterConfig::new(Aimd::new().with_limits(1, 1, 1))
                .with_window(Duration::from_millis(1), 1),
        ),
        ..IngressConfig::default()
    };
    ingress(up.addr, config).await
}

fn with_timeout(
    mut request: http::Request<http_body_util::Full<axum::body::Bytes>>,
    grpc_timeout: &str,
) -> http::Request<http_body_util::Full<axum::body::Bytes>> {
    request
        .headers_mut()
        .insert("grpc-timeout", grpc_timeout.parse().expect("value"));
    request
}

#[tokio::test]
async fn under_overload_the_ingress_sheds_with_retry_after_before_the_service() {
    let up = upstream().await;
    let proxy = one_at_a_time(&up).await;
    let addr = proxy.local_addr();
    // The one slot is taken by a request the service never answers.
    let held = tokio::spawn(send(addr, get("/hang/1")));
    let limit = proxy.limit().expect("admission is on");
    eventually(async || up.script.count() == 1).await;

    let shed = send(addr, get("/work")).await;

    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE, "{shed:?}");
    let retry_after: u64 = shed
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!(retry_after >= 1);
    assert_eq!(
        up.script.count(),
        1,
        "the shed request never reached the service"
    );
    let stats = limit.stats();
    assert_eq!((stats.admitted, stats.shed()), (1, 1), "{stats:?}");

    // gRPC callers get RESOURCE_EXHAUSTED with a pushback instead.
    let mut grpc = get("/svc.Api/Call");
    grpc.headers_mut()
        .insert("content-type", "application/grpc".parse().expect("value"));
    let shed = send(addr, grpc).await;
    assert_eq!(shed.status, StatusCode::OK, "trailers-only");
    assert_eq!(shed.header("grpc-status"), Some("8"));
    assert!(shed.header("grpc-retry-pushback-ms").is_some(), "{shed:?}");
    assert_eq!(up.script.count(), 1);
    held.abort();
}

#[tokio::test]
async fn a_request_that_cannot_finish_in_time_is_shed_first() {
    let up = upstream().await;
    let proxy = one_at_a_time(&up).await;
    let addr = proxy.local_addr();
    // The service takes 50 ms: the limit learns it from the first windows.
    for _ in 0..2 {
        let answer = send(addr, with_timeout(get("/slow/50"), "10S")).await;
        assert_eq!(answer.status, StatusCode::OK);
    }
    let seen = up.script.count();

    // 10 ms left is less than the service takes: shed at once, before the service, though
    // a slot is free.
    let short = send(addr, with_timeout(get("/slow/50"), "10m")).await;

    assert_eq!(short.status, StatusCode::SERVICE_UNAVAILABLE, "{short:?}");
    assert!(short.header("retry-after").is_some());
    assert_eq!(up.script.count(), seen, "never reached the service");
    let stats = proxy.limit().expect("admission is on").stats();
    assert_eq!((stats.admitted, stats.shed_deadline), (2, 1), "{stats:?}");
    // A request with time enough is admitted.
    let long = send(addr, with_timeout(get("/slow/50"), "10S")).await;
    assert_eq!(long.status, StatusCode::OK);
}
