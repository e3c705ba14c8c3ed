//! Answering from somewhere else when the downstream cannot: a cache, an alternate upstream.
//!
//! When the stack gives up (attempts exhausted, the budget or the breaker refused, the
//! deadline is too close) the caller usually gets an error or a 503. For reads, a stale
//! answer from a cache or the same request to a backup source is often worth more: the
//! seeds' CDN outage healed in 30 s by switching an image service to its backup source. A
//! [`Fallback`] installed on the stack ([`ClientLayerBuilder::with_fallback`](super::ClientLayerBuilder::with_fallback))
//! is asked for an answer whenever the endpoint's policy allows it
//! ([`Fallback`](stormguard::policy::Fallback) in the policy: on give-up, always, or never),
//! and the reason is recorded: the answer carries [`FALLBACK_HEADER`] with it, and the
//! observer sees [`FallbackReason`].

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http::{HeaderName, Response};

use crate::observe::FallbackReason;

/// The response header of an answer that came from the fallback, with the reason as value.
pub const FALLBACK_HEADER: HeaderName = HeaderName::from_static("x-stormguard-fallback");

/// What a fallback is asked: the request's head, the endpoint and why.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct FallbackRequest<'a> {
    /// The request's method, URI, version and headers.
    pub head: &'a http::request::Parts,
    /// The policy endpoint the request was routed to.
    pub endpoint: &'a str,
    /// Why the fallback is asked.
    pub reason: FallbackReason,
}

/// The future a [`Fallback`] answers with: a response, or `None` to leave the stack's own
/// answer (or error) as it is.
pub type FallbackFuture = Pin<Box<dyn Future<Output = Option<Response<Bytes>>> + Send>>;

/// A source of answers when the downstream cannot give one. Implemented for every
/// `Fn(&FallbackRequest<'_>) -> Option<Response<Bytes>>` (a synchronous cache lookup); implement
/// it directly for an asynchronous one (an alternate upstream).
///
/// ```
/// use bytes::Bytes;
/// use stormguard_tower::client::{Fallback, FallbackRequest};
///
/// // A cache of last good answers, keyed by path.
/// let cache = |request: &FallbackRequest<'_>| {
///     (request.head.uri.path() == "/rates").then(|| http::Response::new(Bytes::from_static(b"{\"eur\":1.0}")))
/// };
/// fn takes(_: impl Fallback) {}
/// takes(cache);
/// ```
pub trait Fallback: Send + Sync + 'static {
    /// An answer for `request`, or `None`.
    fn answer(&self, request: &FallbackRequest<'_>) -> FallbackFuture;
}

impl<F> Fallback for F
where
    F: Fn(&FallbackRequest<'_>) -> Option<Response<Bytes>> + Send + Sync + 'static,
{
    fn answer(&self, request: &FallbackRequest<'_>) -> FallbackFuture {
        let answer = self(request);
        Box::pin(std::future::ready(answer))
    }
}
