//! What the RetryLayer adds to a request that succeeds at once.
//!
//! An in-process service answers at once, so every future completes on its first poll and
//! is driven with a no-op waker: no runtime, no sockets, only the layer's own work. Every
//! iteration builds its request (a GET with two headers) and drops the response, the same
//! for all. Peers: the bare service, and `tower::retry::Retry` with a policy that clones the
//! request for replay (as any retry must) and never retries.
//!
//! ```sh
//! cargo bench -p stormguard-tower --bench retry_layer
//! cargo bench -p stormguard-tower --bench retry_layer --all-features   # observability compiled in, nothing installed
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use stormguard::retry::RetryPolicy;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::retry::RetryLayer;
use tower::{Layer, Service, ServiceExt, service_fn};

/// Polls `fut` once; everything benchmarked here is ready immediately.
fn poll_once<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("benchmarked future was not ready"),
    }
}

type Answer = std::future::Ready<Result<Response<Full<Bytes>>, Infallible>>;

fn downstream<B>()
-> impl Service<Request<B>, Response = Response<Full<Bytes>>, Error = Infallible, Future = Answer>
+ Clone {
    service_fn(|_req: Request<B>| std::future::ready(Ok(Response::new(Full::default()))))
}

/// A GET as a proxy would forward it: static header values, no body.
fn get() -> Request<Full<Bytes>> {
    Request::get("http://inventory/items/7")
        .header("x-request-id", HeaderValue::from_static("req-7"))
        .header(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json"),
        )
        .body(Full::default())
        .expect("valid request")
}

/// tower's retry with the request clone every replaying retry needs, never retrying.
#[derive(Clone)]
struct CloneNeverRetry;

impl<E> tower::retry::Policy<Request<Full<Bytes>>, Response<Full<Bytes>>, E> for CloneNeverRetry {
    type Future = std::future::Ready<()>;
    fn retry(
        &mut self,
        _: &mut Request<Full<Bytes>>,
        _: &mut Result<Response<Full<Bytes>>, E>,
    ) -> Option<Self::Future> {
        None
    }
    fn clone_request(&mut self, req: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.version_mut() = req.version();
        *clone.headers_mut() = req.headers().clone();
        *clone.extensions_mut() = req.extensions().clone();
        Some(clone)
    }
}

fn bench<S>(c: &mut Criterion, name: &str, mut service: S)
where
    S: Service<Request<Full<Bytes>>>,
    S::Error: std::fmt::Debug,
{
    c.bench_function(name, |b| {
        b.iter(|| {
            poll_once(service.ready()).expect("ready");
            poll_once(service.call(get())).expect("succeeds")
        })
    });
}

fn success_path(c: &mut Criterion) {
    bench(c, "success_path/bare", downstream::<Full<Bytes>>());
    let layer = RetryLayer::new(RetryPolicy::new(3)).expect("valid policy");
    bench(
        c,
        "success_path/stormguard_retry_layer",
        layer.layer(downstream::<ReplayBody<Full<Bytes>>>()),
    );
    bench(
        c,
        "success_path/tower_retry_with_clone",
        tower::retry::Retry::new(CloneNeverRetry, downstream::<Full<Bytes>>()),
    );
}

criterion_group!(benches, success_path);
criterion_main!(benches);
