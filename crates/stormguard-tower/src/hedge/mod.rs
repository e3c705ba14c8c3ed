//! Hedging for HTTP requests: another copy of a slow request, by gRPC A6's rules.
//!
//! [`HedgeLayer`] runs each request through a core [`Hedger`]: the original goes out at once,
//! a hedge follows after the policy's delay while no answer has come, the first success wins
//! and the losers are cancelled (their futures dropped, which makes hyper reset the stream or
//! close the connection). Hedges are withdrawals from the hedger's retry budget; see
//! [`stormguard::hedge`] for the rules and why they matter.
//!
//! # Which requests are hedged
//!
//! A request is hedged only when it is safe to send twice **and** can be sent twice:
//!
//! - its method is idempotent (GET, HEAD, OPTIONS, TRACE, PUT, DELETE), or it carries an
//!   `Idempotency-Key` header;
//! - its body can be replayed: the body's size hint has an upper bound of at most the body
//!   limit (64 KiB by default; [`HedgeLayer::with_body_limit`]). Such a body is read into
//!   memory once and every attempt gets a copy. A streaming body of unknown length is never
//!   buffered.
//!
//! Any other request passes straight through to the inner service: one attempt, no budget
//! accounting, no timer.
//!
//! # Body types
//!
//! The inner service receives `Request<`[`HedgeBody<B>`]`>`: `Either::Left` with the
//! buffered copy for hedged requests, `Either::Right` with the original body otherwise
//! (`http_body_util::Either`, which is a `Body` whenever both sides are). Both sides must
//! yield `Bytes`.
//!
//! # Results
//!
//! Responses are classified by [`HttpClassifier`] unless [`HedgeLayer::with_classifier`]
//! says otherwise: status codes as in [`stormguard::classify`] (502, 503, 504, 408, 425 are
//! non-fatal and send the next hedge at once; 429 and 503 with `Retry-After` postpone it;
//! anything else ends the call), and `grpc-retry-pushback-ms` as A6 pushback. The service's
//! error is a [`BoxError`]; when the deadline passes it is a [`DeadlineExceeded`].
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use stormguard::budget::TokenBucket;
//! use stormguard::hedge::{HedgeDelay, HedgePolicy, Hedger};
//! use stormguard_tower::hedge::{HedgeBody, HedgeLayer};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! let policy = HedgePolicy::new(2, HedgeDelay::Fixed(Duration::from_millis(20))).validate().unwrap();
//! let hedger = Hedger::new(policy).with_budget(Arc::new(TokenBucket::grpc(10, 0.1).unwrap()));
//! let calls = Arc::new(AtomicU32::new(0));
//! let counted = calls.clone();
//! let mut svc = ServiceBuilder::new()
//!     .layer(HedgeLayer::new(hedger))
//!     .service_fn(move |_req: Request<HedgeBody<Full<Bytes>>>| {
//!         // The first call is stuck; the hedge answers at once.
//!         let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
//!         async move {
//!             if first {
//!                 tokio::time::sleep(Duration::from_secs(10)).await;
//!             }
//!             Ok::<_, std::convert::Infallible>(Response::new(Full::<Bytes>::from("ok")))
//!         }
//!     });
//! let start = tokio::time::Instant::now();
//! let response = svc.ready().await.unwrap().call(Request::new(Full::default())).await.unwrap();
//! assert!(response.status().is_success());
//! assert_eq!(start.elapsed(), Duration::from_millis(20));
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! # }
//! ```

mod classify;
mod error;
mod layer;

pub use classify::HttpClassifier;
pub use error::{BodyError, DeadlineExceeded};
pub use layer::{DEFAULT_BODY_LIMIT, HedgeLayer};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full};
use stormguard::budget::RetryBudget;
use stormguard::hedge::{HedgeCall, HedgeClassifier, HedgeFailure, HedgeObserver, Hedger};
use tower::{BoxError, ServiceExt};
use tower_service::Service;

/// The body the inner service receives: the buffered copy of a hedged request's body
/// (`Left`), or the original body of a request that is not hedged (`Right`).
pub type HedgeBody<B> = Either<Full<Bytes>, B>;

/// The header that makes a request with a non-idempotent method safe to hedge.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The response future of [`Hedge`].
pub type ResponseFuture<ResBody> =
    Pin<Box<dyn Future<Output = Result<Response<ResBody>, BoxError>> + Send>>;

/// A service whose safe, replayable requests are hedged; see the [module documentation](self).
#[derive(Debug)]
pub struct Hedge<S, B, O, C> {
    inner: S,
    hedger: Arc<Hedger<B, O>>,
    classifier: C,
    body_limit: usize,
}

impl<S: Clone, B, O, C: Clone> Clone for Hedge<S, B, O, C> {
    fn clone(&self) -> Self {
        Hedge {
            inner: self.inner.clone(),
            hedger: Arc::clone(&self.hedger),
            classifier: self.classifier.clone(),
            body_limit: self.body_limit,
        }
    }
}

impl<S, B, O, C> Hedge<S, B, O, C> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The hedger, shared by every clone of this service.
    pub fn hedger(&self) -> &Arc<Hedger<B, O>> {
        &self.hedger
    }
}

/// Whether `request` may be sent more than once, by its method or an `Idempotency-Key`.
fn safe_to_repeat<T>(request: &Request<T>) -> bool {
    request.method().is_idempotent() || request.headers().contains_key(IDEMPOTENCY_KEY)
}

impl<S, B, O, C, ReqBody, ResBody> Service<Request<ReqBody>> for Hedge<S, B, O, C>
where
    S: Service<Request<HedgeBody<ReqBody>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Send + 'static,
    B: RetryBudget + 'static,
    O: HedgeObserver + 'static,
    C: HedgeClassifier<Response<ResBody>, BoxError> + Clone + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = ResponseFuture<ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The ready service goes with this request; `self` keeps a clone for the next one.
        let fresh = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, fresh);
        let replayable = safe_to_repeat(&request)
            && request
                .body()
                .size_hint()
                .upper()
                .is_some_and(|len| len <= self.body_limit as u64);
        if !replayable {
            let future = ready.call(request.map(Either::Right));
            return Box::pin(async move { future.await.map_err(Into::into) });
        }
        let spare = self.inner.clone();
        let hedger = Arc::clone(&self.hedger);
        let classifier = self.classifier.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = body
                .collect()
                .await
                .map_err(|e| BodyError::new(e.into()))?
                .to_bytes();
            let mut ready = Some(ready);
            let attempt = move |_| {
                let copy =
                    Request::from_parts(parts.clone(), Either::Left(Full::new(bytes.clone())));
                let first = ready.take();
                let spare = spare.clone();
                async move {
                    match first {
                        Some(mut service) => service.call(copy).await,
                        None => spare.oneshot(copy).await,
                    }
                    .map_err(Into::into)
                }
            };
            let report = hedger
                .run_report(HedgeCall::new().idempotent(true), attempt, classifier)
                .await;
            match report.result {
                Ok(response) => Ok(response),
                Err(HedgeFailure::Error(e)) => Err(e),
                Err(HedgeFailure::DeadlineExceeded) => {
                    Err(DeadlineExceeded::new(report.sent).into())
                }
            }
        })
    }
}
