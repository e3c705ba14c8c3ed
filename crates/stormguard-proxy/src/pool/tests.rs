//! The pool against a real hyper server on 127.0.0.1 that counts the connections it accepts
//! and sees end. Time is paused: idle expiry is driven by advancing tokio's clock.
//!
//! Under paused time a runtime with nothing to do but wait for the kernel jumps its clock to
//! the next timer. Loopback usually delivers within the sending system call, so the runtime
//! finds the data at once; but a loaded machine may defer the delivery (to `ksoftirqd`), and
//! the jump then lands on the pool's sweep, which closes the idle connections a test goes on
//! to count. So every wait on the server's side of the socket holds the clock still
//! ([`on_held_clock`]), and time moves only where a test moves it. The pools connect with
//! [`connect_now`], which has connected (or been refused) before it returns, so no connect
//! is in flight under the connect timer either. The connect timeout itself is tested with a
//! connector that never answers, where the jump to its deadline is the point.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use stormguard::classify::Outcome;
use stormguard_tower::wire::{ConnectError, classify_transport_error};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::connect::{Connecting, connected_at_once};
use super::{PoolMap, PoolSettings, UpstreamPool};

/// Runs `io`, which waits on the kernel, with the paused clock held still: tokio does not
/// auto-advance while a blocking task runs (`tokio::time::pause`, "Preventing
/// auto-advance"), and one runs until `io` is done.
async fn on_held_clock<F: Future>(io: F) -> F::Output {
    let (release, held) = std::sync::mpsc::channel::<()>();
    let holder = tokio::task::spawn_blocking(move || {
        let _ = held.recv();
    });
    let output = io.await;
    drop(release);
    holder.await.expect("the holder ends");
    output
}

/// Sends `request` on `pool` (to the test server) and waits for the answer's head, with the
/// clock held still.
async fn send(pool: &Arc<UpstreamPool>, request: Request<Body>) -> Response<Body> {
    on_held_clock(pool.send(request, None))
        .await
        .expect("response")
}

/// Reads the rest of a body, with the clock held still.
async fn drain(response: Response<Body>) -> Bytes {
    on_held_clock(response.into_body().collect())
        .await
        .expect("body")
        .to_bytes()
}

/// Connects with a blocking connect (on loopback, done or refused at once), so the future it
/// returns is ready.
fn connect_now(authority: &Authority, _: Duration) -> Connecting {
    connected_at_once(authority.as_str())
}

thread_local! {
    /// The connect timeout [`never_answers`] was given last on this test's thread.
    static GIVEN: std::cell::Cell<Option<Duration>> = const { std::cell::Cell::new(None) };
}

/// A host that drops the SYN: the connect never completes (it notes the timeout given).
fn never_answers(_: &Authority, within: Duration) -> Connecting {
    GIVEN.set(Some(within));
    Box::pin(std::future::pending())
}

/// Counts of the server's connections.
#[derive(Default)]
struct Counts {
    accepted: AtomicUsize,
    ended: AtomicUsize,
    ended_now: Notify,
}

impl Counts {
    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Waits until the server has seen `n` connections end, with the clock held still.
    async fn wait_ended(&self, n: usize) {
        on_held_clock(async {
            loop {
                let notified = self.ended_now.notified();
                if self.ended.load(Ordering::SeqCst) >= n {
                    return;
                }
                notified.await;
            }
        })
        .await;
    }
}

/// `/` answers `ok`; `/close` answers with `Connection: close`; `/big` answers 64 KiB;
/// `/hangup` fails in the service, so the server closes the connection without an answer.
async fn server() -> (http::uri::Authority, Arc<Counts>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let counts = Arc::new(Counts::default());
    let served = Arc::clone(&counts);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            served.accepted.fetch_add(1, Ordering::SeqCst);
            let counts = Arc::clone(&served);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
                    let path = request.uri().path().to_owned();
                    let _ = request.into_body().collect().await;
                    let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
                    match path.as_str() {
                        "/hangup" => return Err("hang up"),
                        "/close" => {
                            response
                                .headers_mut()
                                .insert(http::header::CONNECTION, "close".parse().expect("value"));
                        }
                        "/big" => *response.body_mut() = Full::new(Bytes::from(vec![b'x'; 65536])),
                        _ => {}
                    }
                    Ok(response)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                counts.ended.fetch_add(1, Ordering::SeqCst);
                counts.ended_now.notify_waiters();
            });
        }
    });
    let authority = addr.to_string().parse().expect("authority");
    (authority, counts)
}

fn get(path: &str) -> Request<Body> {
    Request::builder()
        .uri(path)
        .header(http::header::HOST, "upstream")
        .body(Body::empty())
        .expect("request")
}

/// Sends `path` and reads the whole answer.
async fn fetch(pool: &Arc<UpstreamPool>, path: &str) -> (StatusCode, Bytes) {
    let response = send(pool, get(path)).await;
    (response.status(), drain(response).await)
}

const SETTINGS: PoolSettings = PoolSettings {
    connect_timeout: Duration::from_secs(3),
    idle_timeout: Duration::from_secs(10),
    max_idle: 4,
    connect: connect_now,
};

#[tokio::test(start_paused = true)]
async fn sequential_requests_share_one_connection() {
    let (authority, counts) = server().await;
    let pool = UpstreamPool::new(authority, SETTINGS);
    for _ in 0..5 {
        assert_eq!(fetch(&pool, "/").await, (StatusCode::OK, Bytes::from("ok")));
    }
    assert_eq!(counts.accepted(), 1);
    assert_eq!(pool.idle_len(), 1);
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_dial_and_the_pool_keeps_at_most_max_idle() {
    let (authority, counts) = server().await;
    let settings = PoolSettings {
        max_idle: 2,
        ..SETTINGS
    };
    let pool = UpstreamPool::new(authority, settings);
    // Three responses held at once: three connections.
    let held = [
        send(&pool, get("/")).await,
        send(&pool, get("/")).await,
        send(&pool, get("/")).await,
    ];
    assert_eq!(counts.accepted(), 3);
    for response in held {
        drain(response).await;
    }
    assert_eq!(
        pool.idle_len(),
        2,
        "the third connection is closed, not kept"
    );
    counts.wait_ended(1).await;
    for _ in 0..4 {
        fetch(&pool, "/").await;
    }
    assert_eq!(counts.accepted(), 3, "the idle connections are reused");
}

#[tokio::test(start_paused = true)]
async fn a_connection_the_server_closes_is_replaced() {
    let (authority, counts) = server().await;
    let pool = UpstreamPool::new(authority, SETTINGS);
    assert_eq!(fetch(&pool, "/close").await.0, StatusCode::OK);
    assert_eq!(fetch(&pool, "/").await.0, StatusCode::OK);
    assert_eq!(counts.accepted(), 2);
    counts.wait_ended(1).await;
    assert_eq!(fetch(&pool, "/").await.0, StatusCode::OK);
    assert_eq!(counts.accepted(), 2, "the replacement is pooled");
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_before_its_end_closes_its_connection() {
    let (authority, counts) = server().await;
    let pool = UpstreamPool::new(authority, SETTINGS);
    let mut body = send(&pool, get("/big")).await.into_body();
    let first = on_held_clock(body.frame())
        .await
        .expect("a frame")
        .expect("data");
    assert!(first.is_data());
    drop(body);
    assert_eq!(pool.idle_len(), 0);
    counts.wait_ended(1).await;
    assert_eq!(fetch(&pool, "/").await.0, StatusCode::OK);
    assert_eq!(counts.accepted(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_empty_body_never_polled_returns_its_connection() {
    let (authority, counts) = server().await;
    let pool = UpstreamPool::new(authority, SETTINGS);
    let head = Request::builder()
        .method(http::Method::HEAD)
        .uri("/")
        .header(http::header::HOST, "upstream")
        .body(Body::empty())
        .expect("request");
    drop(send(&pool, head).await);
    assert_eq!(pool.idle_len(), 1);
    fetch(&pool, "/").await;
    assert_eq!(counts.accepted(), 1);
}

#[tokio::test(start_paused = true)]
async fn idle_connections_expire_on_use_and_by_the_sweep() {
    let (authority, counts) = server().await;
    let pool = UpstreamPool::new(authority, SETTINGS);
    fetch(&pool, "/").await;
    tokio::time::advance(SETTINGS.idle_timeout + Duration::from_secs(1)).await;
    fetch(&pool, "/").await;
    assert_eq!(
        counts.accepted(),
        2,
        "the expired connection was not reused"
    );
    counts.wait_ended(1).await;

    // No request comes: the sweep closes the idle one (it looks every idle_timeout).
    assert_eq!(pool.idle_len(), 1);
    tokio::time::advance(SETTINGS.idle_timeout * 2 + Duration::from_secs(1)).await;
    counts.wait_ended(2).await;
    assert_eq!(pool.idle_len(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_connection_broken_mid_request_is_in_doubt_and_replaced() {
    let (authority, counts) = server().await;
    let pool = UpstreamPool::new(authority, SETTINGS);
    fetch(&pool, "/").await;
    let error = on_held_clock(pool.send(get("/hangup"), None))
        .await
        .expect_err("no answer");
    // Sent and unanswered: only an idempotent or keyed request may go again.
    assert_eq!(classify_transport_error(error.as_ref()), Outcome::InDoubt);
    assert_eq!(fetch(&pool, "/").await.0, StatusCode::OK);
    assert_eq!(counts.accepted(), 2);
}

/// An address nothing listens on (a port bound, then let go).
async fn refused() -> Authority {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let authority = listener.local_addr().expect("addr").to_string();
    drop(listener);
    authority.parse().expect("authority")
}

#[tokio::test(start_paused = true)]
async fn a_refused_connect_is_retryable() {
    let pool = UpstreamPool::new(refused().await, SETTINGS);
    let error = pool.send(get("/"), None).await.expect_err("refused");
    // Nothing was sent: any request may go again.
    assert_eq!(classify_transport_error(error.as_ref()), Outcome::Retryable);
}

/// A pool whose host drops the SYN.
fn pool_that_never_connects() -> Arc<UpstreamPool> {
    let settings = PoolSettings {
        connect: never_answers,
        ..SETTINGS
    };
    UpstreamPool::new("10.255.255.1:80".parse().expect("authority"), settings)
}

#[tokio::test(start_paused = true)]
async fn a_connect_that_never_answers_fails_at_the_connect_timeout_and_is_retryable() {
    let pool = pool_that_never_connects();
    let started = Instant::now();
    let error = pool.send(get("/"), None).await.expect_err("no connection");
    // Paused time: the clock moved to the connect timer's deadline, and no further.
    assert_eq!(started.elapsed(), SETTINGS.connect_timeout);
    let connect = error
        .downcast_ref::<ConnectError>()
        .expect("a connect error");
    assert_eq!(connect.io_error().kind(), io::ErrorKind::TimedOut);
    assert_eq!(connect.target(), "10.255.255.1:80");
    // Nothing was sent: any request may go again (a bare timed-out io::Error is in doubt).
    assert_eq!(classify_transport_error(error.as_ref()), Outcome::Retryable);
}

#[tokio::test(start_paused = true)]
async fn a_route_connect_timeout_bounds_the_connect_instead_of_the_pools() {
    let pool = pool_that_never_connects();
    let route = Duration::from_millis(100);
    let started = Instant::now();
    let error = pool
        .send(get("/"), Some(route))
        .await
        .expect_err("no connection");
    assert_eq!(
        started.elapsed(),
        route,
        "the route's timeout, not the pool's 3 s"
    );
    assert_eq!(GIVEN.get(), Some(route), "the connector splits the route's");
    let connect = error
        .downcast_ref::<ConnectError>()
        .expect("a connect error");
    assert_eq!(connect.io_error().kind(), io::ErrorKind::TimedOut);
    assert_eq!(classify_transport_error(error.as_ref()), Outcome::Retryable);
    // The next request, of a route without one, connects within the pool's own.
    let started = Instant::now();
    pool.send(get("/"), None).await.expect_err("no connection");
    assert_eq!(started.elapsed(), SETTINGS.connect_timeout);
    assert_eq!(GIVEN.get(), Some(SETTINGS.connect_timeout));
}

#[tokio::test(start_paused = true)]
async fn routes_with_different_connect_timeouts_share_connections() {
    let (authority, counts) = server().await;
    let pool = UpstreamPool::new(authority, SETTINGS);
    fetch(&pool, "/").await;
    let response = on_held_clock(pool.send(get("/"), Some(Duration::from_millis(100))))
        .await
        .expect("response");
    drain(response).await;
    assert_eq!(
        counts.accepted(),
        1,
        "the idle connection served the other route"
    );
    assert_eq!(pool.idle_len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_named_pool_leaves_its_map_once_idle_and_unheld() {
    let (authority, counts) = server().await;
    let map = PoolMap::new(SETTINGS);
    fetch(&map.get(&authority), "/").await;
    map.get(&refused().await)
        .send(get("/"), None)
        .await
        .expect_err("refused");
    let held = map.get(&refused().await);
    held.send(get("/"), None).await.expect_err("refused");
    assert_eq!(map.len(), 3);

    // The sweeps (every idle_timeout) close the idle connection, then drop the two pools
    // nobody holds; the held one stays, and goes once it is let go.
    tokio::time::sleep(SETTINGS.idle_timeout * 2 + Duration::from_secs(1)).await;
    counts.wait_ended(1).await;
    assert_eq!(map.len(), 1);
    assert!(Arc::ptr_eq(&held, &map.get(held.authority())));
    drop(held);
    tokio::time::sleep(SETTINGS.idle_timeout * 2).await;
    assert_eq!(map.len(), 0);

    // A later request for the host makes a new pool, which works.
    assert_eq!(fetch(&map.get(&authority), "/").await.0, StatusCode::OK);
    assert_eq!(map.len(), 1);
}
