//! Fault injection for HTTP services, in the manner of Envoy's fault filter.
//!
//! [`FaultLayer`] puts a core [`FaultInjector`] in front of a service. For each request it
//! draws an [`Injection`](stormguard::fault::Injection) and then:
//!
//! - waits the drawn **delay** before calling the inner service (the inner service does not
//!   see the request until then, as with a slow network or a queue in front of it);
//! - answers with the drawn **status** instead of calling the inner service: an empty body,
//!   `Retry-After` (whole seconds, rounded up) when the abort carries one, and
//!   [`FAULT_HEADER`]`: abort` so a test or a log can tell an injected answer from a real one;
//! - or fails with a **reset**: an [`std::io::Error`] of kind `ConnectionReset` (whose inner
//!   error is the [`Abort`]), boxed as the service's error.
//!
//! # The response body
//!
//! An injected status needs a body of the inner service's own type, so the layer asks for
//! `ResBody: Default` — `Full`, `Empty`, `String`, `BoxBody`, `UnsyncBoxBody` and axum's
//! `Body` all are. That keeps the service's response type unchanged, so the layer can be
//! inserted anywhere without retyping the stack. A body without a `Default` (hyper's
//! `Incoming`, on the client side) can be boxed first with tower's `MapResponseBody`.
//!
//! # Switching at run time
//!
//! The layer shares the injector (an [`Arc`]): keep a clone to
//! [`enable`](FaultInjector::enable), [`disable`](FaultInjector::disable) or change rates
//! while traffic flows. Disabled, a request costs one relaxed load on top of the inner call.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use bytes::Bytes;
//! use stormguard::fault::{Abort, FaultConfig, FaultInjector};
//! use stormguard_tower::fault::FaultLayer;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! let faults = Arc::new(FaultInjector::new(FaultConfig::new(1).with_abort(
//!     1.0,
//!     Abort::Status { status: 503, retry_after: Some(Duration::from_secs(2)) },
//! )).unwrap());
//! let mut svc = ServiceBuilder::new()
//!     .layer(FaultLayer::new(faults.clone()))
//!     .service_fn(|_req: Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::<Bytes>::from("hello")))
//!     });
//! let shed = svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
//! assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
//! assert_eq!(shed.headers()["retry-after"], "2");
//!
//! faults.disable();
//! let ok = svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
//! assert_eq!(ok.status(), StatusCode::OK);
//! # }
//! ```

mod future;
mod layer;

pub use future::ResponseFuture;
pub use layer::FaultLayer;

use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderValue, Request, Response, StatusCode};
use stormguard::fault::{Abort, FaultInjector};
use tower::BoxError;
use tower_service::Service;

/// The header an injected status response carries (value `abort`).
pub const FAULT_HEADER: &str = "x-stormguard-fault";

/// A service with faults injected in front of it; see the [module documentation](self).
#[derive(Clone, Debug)]
pub struct Fault<S> {
    inner: S,
    injector: Arc<FaultInjector>,
}

impl<S> Fault<S> {
    /// Injects `injector`'s faults in front of `inner`.
    pub fn new(inner: S, injector: Arc<FaultInjector>) -> Self {
        Fault { inner, injector }
    }

    /// The injector, to switch it at run time.
    pub fn injector(&self) -> &Arc<FaultInjector> {
        &self.injector
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Fault<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S, Request<ReqBody>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let injection = self.injector.draw();
        match (injection.delay, injection.abort) {
            (Duration::ZERO, None) => ResponseFuture::calling(self.inner.call(request)),
            (Duration::ZERO, Some(abort)) => ResponseFuture::aborted(abort),
            (delay, Some(abort)) => ResponseFuture::delayed_abort(delay, abort),
            (delay, None) => {
                // The ready service goes with the request; `self` keeps a fresh clone, which
                // the next `poll_ready` drives (the pattern tower's own middleware uses).
                let fresh = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, fresh);
                ResponseFuture::delayed_call(delay, ready, request)
            }
        }
    }
}

/// The injected answer: a status response, or a reset as an error.
fn aborted<B: Default>(abort: Abort) -> Result<Response<B>, BoxError> {
    match abort {
        Abort::Reset => Err(Box::new(io::Error::from(abort))),
        Abort::Status {
            status,
            retry_after,
        } => {
            let mut response = Response::new(B::default());
            *response.status_mut() =
                StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            let headers = response.headers_mut();
            if let Some(after) = retry_after {
                let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
                headers.insert(RETRY_AFTER, HeaderValue::from(secs));
            }
            headers.insert(FAULT_HEADER, HeaderValue::from_static("abort"));
            Ok(response)
        }
    }
}
