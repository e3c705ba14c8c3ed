//! What the success path allocates: counted with a counting global allocator.
//!
//! A request that succeeds at once costs, beyond the inner call, the boxed future and, for a
//! request with a body, the replay record of that body: the first attempt sends the caller's
//! own request, and the copy of its head kept for a retry reuses a pooled header map. Header
//! names and values built from strings are moved to shared storage on their first copy.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The counting allocator is the one place here that needs unsafe code.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::Full;
use std::time::Duration;

use stormguard::breaker::BreakerConfig;
use stormguard::deadline::Reserve;
use stormguard::health::HealthConfig;
use stormguard::policy::{BudgetSpec, EndpointPolicy, Propagation};
use stormguard::retry::RetryPolicy;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::{ClientLayer, ClientLayerBuilder};
use stormguard_tower::retry::RetryLayer;
use tower::{Layer, Service, ServiceExt, service_fn};

struct Counting;

thread_local! {
    /// Allocations of this thread only, so tests running in parallel do not disturb it.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// const-initialised thread-local `Cell`, which itself never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with this `layout` (see `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations per call of `service` on requests made by `request`, averaged over many
/// calls after a warm-up; the requests themselves are built outside the count.
fn allocations_per_call<S, B>(mut service: S, request: impl Fn() -> Request<B>) -> f64
where
    S: Service<Request<B>>,
    S::Error: std::fmt::Debug,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        const CALLS: u64 = 1000;
        for _ in 0..10 {
            service.ready().await.unwrap();
            service.call(request()).await.unwrap();
        }
        let mut total = 0;
        for _ in 0..CALLS {
            let request = request();
            let before = allocations();
            service.ready().await.unwrap();
            let response = service.call(request).await.unwrap();
            total += allocations() - before;
            drop(response);
        }
        total as f64 / CALLS as f64
    })
}

/// The answer of the in-process downstream, ready at once.
type Answer = std::future::Ready<Result<Response<Full<Bytes>>, Infallible>>;

fn downstream<B>()
-> impl Service<Request<B>, Response = Response<Full<Bytes>>, Error = Infallible, Future = Answer>
+ Clone {
    service_fn(|_req: Request<B>| std::future::ready(Ok(Response::new(Full::default()))))
}

/// A GET whose header names and values are all static, as a client that builds its headers
/// once (or from constants) sends them.
fn get_static() -> Request<Full<Bytes>> {
    Request::get("http://inventory/items/7")
        .header(
            HeaderName::from_static("x-request-id"),
            HeaderValue::from_static("req-7"),
        )
        .header(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json"),
        )
        .body(Full::default())
        .unwrap()
}

/// A GET whose header names and values are built from strings (as most clients build them).
fn get() -> Request<Full<Bytes>> {
    Request::get("http://inventory/items/7")
        .header("x-request-id", "req-7")
        .header("accept", "application/json")
        .body(Full::default())
        .unwrap()
}

/// A keyed POST with a 1 KiB body in one chunk.
fn post() -> Request<Full<Bytes>> {
    Request::post("http://payments/pay")
        .header(
            HeaderName::from_static("idempotency-key"),
            HeaderValue::from_static("\"pay-1\""),
        )
        .body(Full::new(Bytes::from_static(&[b'x'; 1024])))
        .unwrap()
}

/// The whole stack a user builds: retries with a budget, a breaker per attempt, a per-try
/// timeout written on the wire with a hop reserve.
fn full_stack() -> ClientLayer<()> {
    let policy =
        EndpointPolicy::new(RetryPolicy::new(3).with_per_try_timeout(Duration::from_millis(500)))
            .with_budget(BudgetSpec::Grpc {
                max_tokens: 100,
                token_ratio: 0.1,
            })
            .with_breaker(BreakerConfig::new(HealthConfig::time(
                Duration::from_secs(10),
                10,
            )))
            .with_propagation(Propagation {
                reserve: Reserve::fraction(0.1).unwrap(),
                ..Propagation::default()
            });
    ClientLayerBuilder::single("inventory", policy)
        .with_observer(())
        .build()
        .expect("valid policy")
}

#[test]
fn the_success_path_allocates_only_what_replay_needs() {
    let bare = allocations_per_call(downstream::<Full<Bytes>>(), get_static);
    let retry = RetryLayer::new(RetryPolicy::new(3)).expect("valid policy");
    let stack = full_stack();
    let through = |request: fn() -> Request<Full<Bytes>>| {
        (
            allocations_per_call(
                retry.layer(downstream::<ReplayBody<Full<Bytes>>>()),
                request,
            ),
            allocations_per_call(
                stack.layer(downstream::<ReplayBody<Full<Bytes>>>()),
                request,
            ),
        )
    };
    let (get_static, get, post) = (through(get_static), through(get), through(post));
    eprintln!(
        "allocations per call (RetryLayer, full stack): bare service {bare}; GET with static \
         headers {get_static:?}, GET with headers built from strings {get:?}, keyed POST with \
         a 1 KiB body {post:?}"
    );
    assert_eq!(bare, 0.0);
    // With or without the `metrics` feature: tracing spans and log events cost nothing
    // without a subscriber, and the metrics of every call are recorded with the endpoint's
    // keys, built once (`observe::metric_keys`).
    // The boxed future only: the first attempt sends the caller's own request, the copy
    // of its head kept for retries uses a pooled header map, the per-try deadline's
    // header value is shared with the previous request's, and the breaker, budget and
    // timer allocate nothing.
    assert_eq!(get_static, (1.0, 1.0));
    // A header value or a custom header name built from a string is moved to shared
    // storage on its first copy (once per request, not per attempt): one each for
    // `x-request-id`'s name and the two values (`accept` is a standard name).
    assert_eq!(get, (4.0, 4.0));
    // The replay record of the body (shared by the attempts) and the pinned source it
    // reads from.
    assert_eq!(post, (3.0, 3.0));
}
