//! The forwarder under the client stack, as the egress proxy puts it there: a route's
//! connect timeout reaches the connect its request opens, over HTTP/1.1 (the pool, with a
//! connector that never answers) and over HTTP/2 (hyper-util's client with the real connector,
//! against a 127.0.0.1 listener whose accept queue is full, so its SYNs are dropped). Time is
//! paused: with a connect pending and nothing else to do, the clock jumps to the earliest
//! timer, and the only timers here are the connect timers and the backoffs, so the time a call
//! takes to fail is exactly the sum of those.

use std::sync::atomic::{AtomicUsize, Ordering};

use stormguard::policy::PolicyFile;
use stormguard_tower::client::ClientLayerBuilder;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

use super::*;
use crate::config::PoolConfig;
use crate::pool::connect::{Connecting, Connector};

/// The pools' own connect timeout in these tests.
const POOL_CONNECT: Duration = Duration::from_secs(3);

/// `/bounded/*` connects within `connect` and is retried once, 50 ms later; `/plain/*` has
/// no connect timeout of its own, and one attempt.
fn routes(connect: &str) -> PolicyFile {
    PolicyFile::from_toml(&format!(
        r#"
        [endpoints."GET /bounded/*"]
        idempotency = "idempotent"
        timeouts = {{ connect = "{connect}" }}
        retry = {{ max_attempts = 2 }}
        backoff = {{ kind = "fixed", base = "50ms", jitter = "none" }}

        [endpoints."GET /plain/*"]
        retry = {{ max_attempts = 1 }}
        "#
    ))
    .expect("valid policies")
}

/// A forwarder to `upstream` whose HTTP/1.1 pool dials with `connect`, both versions within
/// [`POOL_CONNECT`] by default.
fn forward(upstream: &str, connect: Connector) -> Forward {
    let settings = PoolSettings {
        connect_timeout: POOL_CONNECT,
        connect,
        ..PoolSettings::of(&PoolConfig::default())
    };
    let upstream = upstream.parse().expect("upstream");
    Forward::new(
        Some(upstream),
        settings,
        HeaderValue::from_static("1.1 test"),
    )
}

/// How long `GET path` in `version` through `client` takes to fail.
async fn fails_after<S>(client: &S, path: &str, version: Version) -> Duration
where
    S: Service<Request<Body>> + Clone,
{
    let request = Request::get(path)
        .version(version)
        .body(Body::empty())
        .expect("request");
    let started = Instant::now();
    let result = client.clone().oneshot(request).await;
    assert!(result.is_err(), "{path}: no connection, no answer");
    started.elapsed()
}

/// The HTTP/1.1 connects the pool began.
static DIALS: AtomicUsize = AtomicUsize::new(0);

/// A host that drops the SYN: the connect never completes.
fn never_answers(_: &Authority, _: Duration) -> Connecting {
    DIALS.fetch_add(1, Ordering::SeqCst);
    Box::pin(std::future::pending())
}

#[tokio::test(start_paused = true)]
async fn a_routes_connect_timeout_bounds_its_http1_connects_and_follows_a_swap() {
    let layer = ClientLayerBuilder::routes(&routes("100ms"))
        .with_seed(7)
        .build()
        .expect("routes");
    let client = layer.layer(forward("10.255.255.1:80", never_answers));
    let ms = Duration::from_millis;

    // Two attempts, each connect given up at 100 ms: the timeout is retryable.
    assert_eq!(
        fails_after(&client, "/bounded/1", Version::HTTP_11).await,
        ms(100 + 50 + 100)
    );
    assert_eq!(DIALS.load(Ordering::SeqCst), 2);
    // A route without one connects within the pool's own.
    assert_eq!(
        fails_after(&client, "/plain/1", Version::HTTP_11).await,
        POOL_CONNECT
    );
    assert_eq!(DIALS.load(Ordering::SeqCst), 3);

    // A swapped policy's value applies from the next call on.
    layer.policies().swap(&routes("250ms")).expect("swap");
    assert_eq!(
        fails_after(&client, "/bounded/1", Version::HTTP_11).await,
        ms(250 + 50 + 250)
    );
    assert_eq!(DIALS.load(Ordering::SeqCst), 5);
}

/// A listener on 127.0.0.1 that never accepts, with its accept queue filled: the kernel
/// drops the SYN of any further connect, which then never completes. The queue is filled
/// until a connect does not complete within a second (a loopback connect that has room
/// completes within the `connect` call); the streams that got in are returned to be kept.
fn full_listener() -> (tokio::net::TcpListener, Vec<std::net::TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = socket.listen(0).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let mut queued = Vec::new();
    while let Ok(stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        queued.push(stream);
        assert!(queued.len() < 64, "the accept queue never filled");
    }
    (listener, queued)
}

#[tokio::test(start_paused = true)]
async fn a_routes_connect_timeout_bounds_its_http2_connects() {
    let (listener, _queued) = full_listener();
    let upstream = listener.local_addr().expect("addr").to_string();
    let layer = ClientLayerBuilder::routes(&routes("100ms"))
        .with_seed(7)
        .build()
        .expect("routes");
    let client = layer.layer(forward(&upstream, crate::pool::connect::tcp_connect));
    let ms = Duration::from_millis;

    // hyper-util's connector, given the route's timeout by the request that opens the
    // connection; the next attempt opens another.
    assert_eq!(
        fails_after(&client, "/bounded/1", Version::HTTP_2).await,
        ms(100 + 50 + 100)
    );
    assert_eq!(
        fails_after(&client, "/plain/1", Version::HTTP_2).await,
        POOL_CONNECT
    );
}

#[test]
fn hop_by_hop_headers_are_dropped_and_te_trailers_kept() {
    let mut h = HeaderMap::new();
    h.insert(CONNECTION, "keep-alive, x-private".parse().expect("value"));
    h.insert("x-private", "1".parse().expect("value"));
    h.insert("keep-alive", "timeout=5".parse().expect("value"));
    h.insert("x-kept", "1".parse().expect("value"));
    h.insert(TE, "trailers".parse().expect("value"));
    strip_hop_by_hop(&mut h);
    assert_eq!(h.len(), 2, "{h:?}");
    assert!(h.contains_key("x-kept") && h.contains_key(TE));
    h.insert(TE, "gzip".parse().expect("value"));
    strip_hop_by_hop(&mut h);
    assert!(!h.contains_key(TE));
    let mut plain = HeaderMap::new();
    plain.insert("x-kept", "1".parse().expect("value"));
    plain.insert(HOST, "up".parse().expect("value"));
    let before = plain.clone();
    strip_hop_by_hop(&mut plain);
    assert_eq!(plain, before);
    plain.insert("proxy-connection", "keep-alive".parse().expect("value"));
    strip_hop_by_hop(&mut plain);
    assert_eq!(plain, before, "a hop-by-hop header alone is found");
}

/// A forwarder to each request's host, given a request that names none (origin form, no
/// `Host`), fails with the error that says so (the host is looked for before the version,
/// so one version covers both).
#[tokio::test]
async fn a_request_that_names_no_host_is_an_error_that_says_so() {
    let mut forward = Forward::new(
        None,
        PoolSettings::of(&PoolConfig::default()),
        HeaderValue::from_static("1.1 test"),
    );
    let request = Request::get("/x").body(Body::empty()).expect("request");
    let error = forward.call(request).await.expect_err("no host");
    assert!(error.is::<NoUpstream>(), "{error}");
}
