//! The egress direction over real servers on 127.0.0.1: the library's client stack, routed by
//! the policy file, in front of a scriptable upstream.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use stormguard::fault::{Abort, FaultConfig};
use stormguard_proxy::{PolicySource, REASON_HEADER};

use common::*;

const RETRYING_GET: &str = r#"
    [endpoints."GET /*"]
    idempotency = "idempotent"
    timeouts = { per_try = "5s", overall = "20s" }
    retry = { max_attempts = 3 }
    backoff = { kind = "fixed", base = "1ms" }
"#;

#[tokio::test]
async fn a_get_is_retried_and_each_try_carries_its_own_deadline() {
    let up = upstream().await;
    up.script.fail_first.store(1, Ordering::SeqCst);
    let proxy = egress(Some(up.addr), RETRYING_GET).await;

    let answer = send(proxy.local_addr(), get("/users/7")).await;

    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(&answer.body[..], b"ok");
    let seen = up.script.seen();
    assert_eq!(seen.len(), 2, "one failure, one retry");
    for try_ in &seen {
        let timeout = try_.headers["grpc-timeout"].as_bytes();
        let left = stormguard::deadline::parse_grpc_timeout(timeout).expect("a grpc-timeout");
        assert!(
            left <= Duration::from_secs(5),
            "per-try timeout on the wire: {left:?}"
        );
    }
}

#[tokio::test]
async fn a_keyed_post_is_retried_and_an_unkeyed_post_is_not() {
    let up = upstream().await;
    let proxy = egress(
        Some(up.addr),
        r#"
        [endpoints."POST /pay"]
        idempotency = "key"
        retry = { max_attempts = 3 }
        backoff = { kind = "fixed", base = "1ms" }
    "#,
    )
    .await;

    up.script.fail_first.store(1, Ordering::SeqCst);
    let unkeyed = send(proxy.local_addr(), post("/pay", None)).await;
    assert_eq!(unkeyed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        up.script.count(),
        1,
        "a POST without a key is never replayed"
    );
    assert_eq!(
        unkeyed.header("x-retry-exhausted"),
        None,
        "a layer with a key may retry it"
    );

    up.script.fail_first.store(1, Ordering::SeqCst);
    let keyed = send(proxy.local_addr(), post("/pay", Some("k-1"))).await;
    assert_eq!(keyed.status, StatusCode::OK);
    let seen = up.script.seen();
    assert_eq!(seen.len(), 3, "the keyed POST was sent twice");
    assert_eq!(
        seen[1].headers["idempotency-key"],
        seen[2].headers["idempotency-key"]
    );
}

#[tokio::test]
async fn giving_up_marks_the_answer_exhausted() {
    let up = upstream().await;
    let proxy = egress(Some(up.addr), RETRYING_GET).await;

    let answer = send(proxy.local_addr(), get("/down/1")).await;

    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.header("x-retry-exhausted"), Some("true"));
    assert_eq!(up.script.count(), 3);
}

#[tokio::test]
async fn an_exhausted_answer_from_downstream_is_not_retried_again() {
    let up = upstream().await;
    let inner = egress(Some(up.addr), RETRYING_GET).await;
    // A second hop in front of the first: it sees the first's marked 503 and does not retry.
    let outer = egress(Some(inner.local_addr()), RETRYING_GET).await;

    let answer = send(outer.local_addr(), get("/down/2")).await;

    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        up.script.count(),
        3,
        "only one layer retries: 3 attempts, not 9"
    );
}

#[tokio::test]
async fn an_open_breaker_refuses_before_the_upstream() {
    let up = upstream().await;
    let proxy = egress(
        Some(up.addr),
        r#"
        [endpoints."GET /*"]
        retry = { max_attempts = 1 }
        breaker = { count = 4, failure_ratio = 0.5, minimum_throughput = 4, open = "60s" }
    "#,
    )
    .await;
    for _ in 0..4 {
        let answer = send(proxy.local_addr(), get("/down/3")).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(up.script.count(), 4);

    let refused = send(proxy.local_addr(), get("/down/3")).await;

    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.header(REASON_HEADER), Some("breaker_open"));
    assert_eq!(refused.header("x-retry-exhausted"), Some("true"));
    assert_eq!(up.script.count(), 4, "refused before the upstream");
    let policies = proxy.policies().expect("egress");
    let states = policies.endpoint_status();
    assert!(
        states
            .iter()
            .any(|e| e.breaker == Some(stormguard::breaker::BreakerState::Open)),
        "{states:?}"
    );
}

#[tokio::test]
async fn a_hedge_answers_when_the_first_copy_hangs() {
    let up = upstream().await;
    let proxy = egress(
        Some(up.addr),
        r#"
        [endpoints."GET /hang/*"]
        idempotency = "idempotent"
        hedge = { max_attempts = 2, delay = "5ms" }
        timeouts = { overall = "30s" }
    "#,
    )
    .await;

    let answer = send(proxy.local_addr(), get("/hang/1")).await;

    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        up.script.count(),
        2,
        "the first copy hangs, the hedge answers"
    );
}

#[tokio::test]
async fn routes_pick_the_policy_by_host() {
    let up = upstream().await;
    // No fixed upstream: each request goes to the host it names.
    let proxy = egress(
        None,
        r#"
        [endpoints."GET localhost/*"]
        idempotency = "idempotent"
        retry = { max_attempts = 3 }
        backoff = { kind = "fixed", base = "1ms" }

        [endpoints.default]
        retry = { max_attempts = 1 }
    "#,
    )
    .await;
    let port = up.addr.port();
    let to = |host: String| {
        let mut request = get("/items");
        request
            .headers_mut()
            .insert("host", host.parse().expect("host"));
        request
    };

    up.script.fail_first.store(1, Ordering::SeqCst);
    let by_ip = send(proxy.local_addr(), to(format!("127.0.0.1:{port}"))).await;
    assert_eq!(
        by_ip.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the default route: one attempt"
    );
    assert_eq!(up.script.count(), 1);

    up.script.fail_first.store(1, Ordering::SeqCst);
    let by_name = send(proxy.local_addr(), to(format!("localhost:{port}"))).await;
    assert_eq!(
        by_name.status,
        StatusCode::OK,
        "the localhost route retries"
    );
    assert_eq!(up.script.count(), 3);
    assert_eq!(
        up.script.seen()[2].headers["host"],
        format!("localhost:{port}").as_str()
    );
}

#[tokio::test]
async fn injected_faults_are_retried_like_real_ones_and_switch_off() {
    let up = upstream().await;
    let faults = FaultConfig::new(1).with_abort(
        1.0,
        Abort::Status {
            status: 503,
            retry_after: None,
        },
    );
    let proxy = egress_with(
        Some(up.addr),
        PolicySource::Fixed(policy(RETRYING_GET)),
        Some(faults),
        None,
    )
    .await;

    let answer = send(proxy.local_addr(), get("/x")).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.header("x-stormguard-fault"), Some("abort"));
    assert_eq!(answer.header("x-retry-exhausted"), Some("true"));
    assert_eq!(up.script.count(), 0, "every attempt was injected");

    proxy.faults().expect("configured").disable();
    let answer = send(proxy.local_addr(), get("/x")).await;
    assert_eq!(answer.status, StatusCode::OK);
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_bad_gateway_after_the_retries() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = closed.local_addr().expect("addr");
    drop(closed);
    let proxy = egress(Some(addr), RETRYING_GET).await;

    let answer = send(proxy.local_addr(), get("/x")).await;

    assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
    assert_eq!(answer.header(REASON_HEADER), Some("transport"));
    assert_eq!(answer.header("x-retry-exhausted"), Some("true"));
}

#[tokio::test]
async fn a_request_naming_the_proxy_itself_is_refused_as_a_loop() {
    let proxy = egress(None, RETRYING_GET).await;

    // `send` addresses the request to the proxy's own address.
    let answer = send(proxy.local_addr(), get("/users/7")).await;

    assert_eq!(answer.status, StatusCode::LOOP_DETECTED);
    assert_eq!(answer.header(REASON_HEADER), Some("loop"));
}

#[tokio::test]
async fn a_request_that_comes_back_through_another_proxy_is_refused_by_its_via_entry() {
    // The egress forwards to the host each request names; the ingress forwards everything
    // to the egress: a request for the ingress's host goes round.
    let up = upstream().await;
    let egress_proxy = egress(None, RETRYING_GET).await;
    let ingress_proxy = ingress(egress_proxy.local_addr(), Default::default()).await;
    let mut request = get("/users/7");
    request.headers_mut().insert(
        "host",
        ingress_proxy
            .local_addr()
            .to_string()
            .parse()
            .expect("value"),
    );

    let answer = send(egress_proxy.local_addr(), request).await;

    assert_eq!(answer.status, StatusCode::LOOP_DETECTED, "{answer:?}");
    assert_eq!(answer.header(REASON_HEADER), Some("loop"));
    assert_eq!(up.script.count(), 0);
    // A request for a real host passes, with this proxy's Via entry.
    let mut request = get("/users/7");
    request
        .headers_mut()
        .insert("host", up.addr.to_string().parse().expect("value"));
    assert_eq!(
        send(egress_proxy.local_addr(), request).await.status,
        StatusCode::OK
    );
    let via = up.script.seen()[0].headers["via"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(via.starts_with("1.1 stormguard-"), "{via}");
}

/// Sends one HTTP/1.1 request on `stream` and reads its whole answer (a body of `len` bytes).
async fn exchange(stream: &mut tokio::net::TcpStream, path: &str, len: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET {path} HTTP/1.1\r\nHost: example\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut text = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await.expect("read");
        assert_ne!(
            n,
            0,
            "closed before the answer: {:?}",
            String::from_utf8_lossy(&text)
        );
        text.extend_from_slice(&buf[..n]);
        let whole = String::from_utf8_lossy(&text).into_owned();
        if let Some((_, body)) = whole.split_once("\r\n\r\n") {
            if body.len() >= len {
                return whole;
            }
        }
    }
}

/// Whether the proxy closed `stream` (an end of file or a reset), within ten seconds.
async fn closed(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn dropping_the_proxy_ends_its_open_connections() {
    let up = upstream().await;
    let proxy = egress(Some(up.addr), RETRYING_GET).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.local_addr())
        .await
        .expect("connect");
    let answer = exchange(&mut stream, "/a", 2).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    drop(proxy);

    assert!(
        closed(&mut stream).await,
        "the idle keep-alive connection was left open"
    );
}

#[tokio::test]
async fn shutdown_drains_a_request_in_progress_and_cuts_what_outlasts_the_bound() {
    let up = upstream().await;
    let proxy = egress(Some(up.addr), RETRYING_GET).await;
    let addr = proxy.local_addr();
    let in_progress = tokio::spawn(send(addr, get("/slow/100")));
    eventually(async || up.script.count() == 1).await;

    proxy.shutdown(Duration::from_secs(30)).await;

    let answer = in_progress.await.expect("the request task");
    assert_eq!(answer.status, StatusCode::OK, "drained, not cut");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );

    // A request that never ends is cut when the bound passes.
    let proxy = egress(Some(up.addr), RETRYING_GET).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.local_addr())
        .await
        .expect("connect");
    {
        use tokio::io::AsyncWriteExt;
        stream
            .write_all(b"GET /hang/forever HTTP/1.1\r\nHost: example\r\n\r\n")
            .await
            .expect("write");
    }
    eventually(async || up.script.seen().iter().any(|s| s.path == "/hang/forever")).await;
    proxy.shutdown(Duration::from_millis(50)).await;
    assert!(closed(&mut stream).await, "cut after the bound");
}

/// Sends `head` (a request line and headers) to `addr` on a connection of its own and reads
/// the answer to its end (the request asks to close).
async fn send_raw(addr: std::net::SocketAddr, head: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    answer
}

#[tokio::test]
async fn a_request_in_absolute_form_carries_its_targets_host_without_userinfo() {
    // RFC 9112 §3.2.2: a proxy replaces the Host of an absolute-form request with the
    // target's authority, and userinfo is not part of it.
    let up = upstream().await;
    let routed = egress(None, RETRYING_GET).await;
    let answer = send_raw(
        routed.local_addr(),
        &format!(
            "GET http://user:secret@{}/users/7 HTTP/1.1\r\nhost: elsewhere.example\r\nconnection: close\r\n\r\n",
            up.addr
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let fixed = egress(Some(up.addr), RETRYING_GET).await;
    let answer = send_raw(
        fixed.local_addr(),
        "GET http://users.internal:8080/users/8 HTTP/1.1\r\nhost: elsewhere.example\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // An origin-form request keeps the caller's Host.
    let mut request = get("/users/9");
    request
        .headers_mut()
        .insert("host", "users.internal".parse().expect("value"));
    assert_eq!(
        send(fixed.local_addr(), request).await.status,
        StatusCode::OK
    );

    let hosts: Vec<(String, String)> = up
        .script
        .seen()
        .iter()
        .map(|seen| {
            let host = seen.headers["host"].to_str().expect("ascii").to_owned();
            (seen.path.clone(), host)
        })
        .collect();
    assert_eq!(
        hosts,
        [
            ("/users/7".to_owned(), up.addr.to_string()),
            ("/users/8".to_owned(), "users.internal:8080".to_owned()),
            ("/users/9".to_owned(), "users.internal".to_owned()),
        ]
    );
}

#[tokio::test]
async fn pool_settings_out_of_range_are_refused_at_start() {
    use stormguard_proxy::{InvalidPool, PoolConfig, Proxy, ProxyConfig, ProxyError};
    for (pool, field) in [
        (
            PoolConfig::new().with_connect_timeout(Duration::ZERO),
            "pool.connect_timeout",
        ),
        (
            PoolConfig::new().with_idle_timeout(Duration::from_secs(86_400)),
            "pool.idle_timeout",
        ),
    ] {
        let config = ProxyConfig {
            pool,
            ..egress_config(None, PolicySource::Fixed(policy(RETRYING_GET)), None, None)
        };
        let error = Proxy::start(config).await.expect_err("out of range");
        assert!(
            matches!(error, ProxyError::Pool(InvalidPool { field: f, .. }) if f == field),
            "{error}"
        );
    }
}
