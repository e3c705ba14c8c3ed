//! The ingress direction: in front of the service, the server-side layers of the library, in
//! the order in which they work together, outermost first:
//!
//! 1. [`DeadlineLayer`](stormguard_tower::DeadlineLayer): reads the caller's deadline from
//!    its headers, refuses a request whose deadline has passed before anything else runs
//!    (`504`, or `DEADLINE_EXCEEDED`), and cancels the forwarded call when it passes;
//! 2. [`AdaptiveLimitLayer`] (optional): admits
//!    at most an adaptive number of requests at once, shedding those whose deadline is
//!    closest first (`503` + `Retry-After`, or `RESOURCE_EXHAUSTED` + pushback);
//! 3. [`IdempotencyLayer`] (optional): a keyed
//!    request runs once, its duplicates get the stored answer;
//! 4. [`PropagateDeadlineLayer`]: the service gets
//!    the time left, minus the hop's reserve, in the deadline headers;
//! 5. the forwarding transport, one attempt: only one layer of a chain
//!    retries, and that is the caller's.
//!
//! Before all of them, a request that carries this proxy's own `Via` entry has been here
//! before (an upstream that leads back to the ingress, or the ingress's own address as its
//! upstream): it is refused as a loop (`508`) instead of going round until sockets run out.

use std::convert::Infallible;

use axum::body::Body;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use stormguard_idempotency::IdempotencyLayer;
use stormguard_tower::PropagateDeadlineLayer;
use stormguard_tower::limit::AdaptiveLimitLayer;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt, service_fn};

use crate::ProxyError;
use crate::answer::Caller;
use crate::config::{IngressConfig, PoolConfig};
use crate::forward::Forward;
use crate::pool::PoolSettings;
use crate::server::{Handler, call_in_place};
use crate::upstream::Upstream;

/// A built ingress: its handler (for [`serve`](crate::server::serve)), and its limit for the
/// admin port.
pub(crate) struct Ingress<H> {
    pub(crate) handler: H,
    pub(crate) limit: Option<AdaptiveLimitLayer>,
}

type Inner = BoxCloneService<Request<Body>, Response<Body>, Infallible>;

pub(crate) fn build(
    upstream: Upstream,
    pool: PoolConfig,
    config: IngressConfig,
    via: HeaderValue,
) -> Result<Ingress<impl Handler<Body = Body>>, ProxyError> {
    let propagate = PropagateDeadlineLayer::new().layer(Forward::new(
        Some(upstream),
        PoolSettings::of(&pool),
        via.clone(),
    ));
    let forward: Inner = BoxCloneService::new(service_fn(move |request: Request<Body>| {
        let propagate = propagate.clone();
        async move {
            let caller = Caller::of(request.headers());
            Ok::<_, Infallible>(match propagate.oneshot(request).await {
                Ok(response) => response,
                Err(error) => crate::answer::for_transport(&error, &caller),
            })
        }
    }));
    let keyed: Inner = match config.idempotency {
        Some(idempotency) => BoxCloneService::new(
            IdempotencyLayer::from_arc(idempotency.store)
                .with_key_required(idempotency.key_required)
                .layer(forward),
        ),
        None => forward,
    };
    let limit = config.limit.map(AdaptiveLimitLayer::new).transpose()?;
    let admitted: Inner = match &limit {
        Some(limit) => BoxCloneService::new(limit.layer(keyed).map_response(|r| r.map(Body::new))),
        None => keyed,
    };
    let deadline = config.deadline.validate()?.layer(admitted);
    let service = deadline.map_request(|request: Request<Incoming>| request.map(Body::new));
    let mut service = service.map_response(|response| response.map(Body::new));
    let handler = move |request: Request<Incoming>| {
        let caller = Caller::of(request.headers());
        let looped = crate::via::passed_here(request.headers(), &via);
        let call = (!looped).then(|| call_in_place(&mut service, request));
        async move {
            match call {
                Some(call) => call.await,
                None => Ok(crate::answer::looped(&caller)),
            }
        }
    };
    Ok(Ingress { handler, limit })
}
