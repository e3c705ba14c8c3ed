//! The rest of a middleware chain (`Next`) as the transport of the client stack: a tower
//! service from `http` requests to `http` responses, one call per attempt.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ::reqwest::{Body, Request, ResponseBuilderExt};
use http::Extensions;
use reqwest_middleware::Next;
use tower_service::Service;

use crate::body::ReplayBody;

/// The chain's `Extensions` an attempt's response came back with, carried in the response's
/// own extensions to the middleware, which hands them back to its caller.
#[derive(Clone, Debug)]
pub(super) struct ChainExtensions(pub(super) Extensions);

/// `Next`, callable once per attempt: each call runs the rest of the chain with its own copy
/// of the chain's `Extensions`.
#[derive(Clone)]
pub(super) struct NextService<'a> {
    next: Next<'a>,
    extensions: Arc<Extensions>,
}

impl<'a> NextService<'a> {
    pub(super) fn new(next: Next<'a>, extensions: &Extensions) -> Self {
        NextService {
            next,
            extensions: Arc::new(extensions.clone()),
        }
    }
}

type Attempt<'a> = Pin<
    Box<dyn Future<Output = Result<http::Response<Body>, reqwest_middleware::Error>> + Send + 'a>,
>;

impl<'a> Service<http::Request<ReplayBody<Body>>> for NextService<'a> {
    type Response = http::Response<Body>;
    type Error = reqwest_middleware::Error;
    type Future = Attempt<'a>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<ReplayBody<Body>>) -> Attempt<'a> {
        let next = self.next.clone();
        let mut extensions = (*self.extensions).clone();
        Box::pin(async move {
            let request = Request::try_from(request.map(Body::wrap))?;
            let response = next.run(request, &mut extensions).await?;
            let url = response.url().clone();
            let (mut head, body) = http::Response::from(response).into_parts();
            // Kept for the caller's `Response::url()`, which the conversion drops.
            if let Ok(carrier) = http::Response::builder().url(url).body(()) {
                head.extensions.extend(carrier.into_parts().0.extensions);
            }
            head.extensions.insert(ChainExtensions(extensions));
            Ok(http::Response::from_parts(head, body))
        })
    }
}
