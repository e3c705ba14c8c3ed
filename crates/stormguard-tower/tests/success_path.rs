//! What the success path allocates: counted with a counting global allocator.
//!
//! A request that succeeds at once costs, beyond the inner call: the boxed future, one copy
//! of the request head for the attempt (the original is kept for a retry), and the replay
//! record of a body that is not empty. With the `metrics` feature on, each metric the stack
//! records builds its label set through the `metrics` facade (counted separately below).
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The counting allocator is the one place here that needs unsafe code.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use stormguard::retry::RetryPolicy;
use stormguard_tower::body::ReplayBody;
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

/// A GET whose header values are built from strings (as most clients build them).
fn get() -> Request<Full<Bytes>> {
    Request::get("http://inventory/items/7")
        .header("x-request-id", "req-7")
        .header("accept", "application/json")
        .body(Full::default())
        .unwrap()
}

/// The same GET with static header values.
fn get_static() -> Request<Full<Bytes>> {
    Request::get("http://inventory/items/7")
        .header("x-request-id", HeaderValue::from_static("req-7"))
        .header("accept", HeaderValue::from_static("application/json"))
        .body(Full::default())
        .unwrap()
}

/// A keyed POST with a 1 KiB body in one chunk.
fn post() -> Request<Full<Bytes>> {
    Request::post("http://payments/pay")
        .header("idempotency-key", HeaderValue::from_static("\"pay-1\""))
        .body(Full::new(Bytes::from_static(&[b'x'; 1024])))
        .unwrap()
}

#[test]
fn the_success_path_allocates_only_what_replay_needs() {
    let bare = allocations_per_call(downstream::<Full<Bytes>>(), get);
    let layer = RetryLayer::new(RetryPolicy::new(3)).expect("valid policy");
    let wrapped = |request: fn() -> Request<Full<Bytes>>| {
        allocations_per_call(
            layer.layer(downstream::<ReplayBody<Full<Bytes>>>()),
            request,
        )
    };
    let (get_static, get, post) = (wrapped(get_static), wrapped(get), wrapped(post));
    eprintln!(
        "allocations per call: bare service {bare}; through the RetryLayer: GET with static \
         header values {get_static}, GET with header values from strings {get}, \
         keyed POST with a 1 KiB body {post}"
    );
    assert_eq!(bare, 0.0);
    // Without the metrics feature (tracing spans and log events cost nothing without a
    // subscriber).
    #[cfg(not(feature = "metrics"))]
    {
        // The boxed future (1), the copy of the header map for the attempt (2), and the
        // custom header name `x-request-id`, moved to shared storage on its first copy (1).
        assert_eq!(get_static, 4.0);
        // Header values built from strings are moved to shared storage on their first copy
        // too (once per request, not per attempt): one each.
        assert_eq!(get, 6.0);
        // The header map and custom name as above (4), the replay record of the body (1),
        // its chunk list (1; the chunk itself is kept as it came), and the idempotency key
        // handed to the core's retrier (1).
        assert_eq!(post, 7.0);
    }
}
