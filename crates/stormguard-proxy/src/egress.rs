//! The egress direction: the service's outgoing calls go through the library's one client
//! stack ([`ClientLayer`](stormguard_tower::client::ClientLayer)), routed by the policy file, over the forwarding
//! transport.
//!
//! Nothing here retries, breaks, hedges or times out by itself: each request is one call of
//! the stack, which picks the route's endpoint (by method, host and path), applies its
//! deadline, throttle, retries or hedges with the shared budget, breaker and per-try deadline
//! on the wire, and marks what it gave up on `X-Retry-Exhausted: true`. When the stack has no
//! response to hand back, the proxy's own answer says why in the caller's protocol.
//!
//! A request that names the proxy itself, or that passed through it before, is refused
//! before the stack runs, with `508 Loop Detected`: forwarded, it would come back for ever.
//! The check is the proxy's own listen address, and a `Via` entry naming this proxy
//! instance that every forwarded request carries (RFC 9110 §7.6.3).
//!
//! Injected faults sit below the stack, around the transport, so that each attempt draws:
//! a drill sees the retries, budget and breaker react exactly as to a real failure.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use stormguard::fault::FaultInjector;
use stormguard::policy::PolicyFile;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::{
    CenterWatch, ClientLayerBuilder, DEFAULT_DEBOUNCE, Policies, PolicyWatcher,
};
use stormguard_tower::fault::Fault;
use stormguard_tower::observe::Telemetry;
use stormguard_tower::wire::BoxError;
use tower::util::Either;
use tower::{Layer, Service};

use crate::ProxyError;
use crate::answer::Caller;
use crate::config::{EgressConfig, PolicySource, PoolConfig};
use crate::forward::Forward;
use crate::pool::PoolSettings;
use crate::server::{Handler, call_in_place};
use crate::upstream::Upstream;

/// The transport under the stack: the forwarder, with the fault injector in front of it
/// when faults are configured. Not a boxed service: the stack clones it for every call and
/// attempt, and a clone of this is one or two reference counts.
#[derive(Clone)]
struct Transport(Either<Forward, Fault<Forward>>);

/// The request the stack hands the transport.
type Attempt = Request<ReplayBody<Incoming>>;

impl Service<Attempt> for Transport {
    type Response = Response<Body>;
    type Error = TransportError;
    type Future = Sent;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), TransportError>> {
        Service::<Attempt>::poll_ready(&mut self.0, cx).map_err(TransportError)
    }

    fn call(&mut self, request: Attempt) -> Sent {
        match &mut self.0 {
            Either::Left(forward) => Sent::Forward(forward.call(request)),
            Either::Right(fault) => Sent::Fault(Box::pin(fault.call(request))),
        }
    }
}

/// An attempt under way: the forwarder's future as it is (a box already: one allocation per
/// attempt, not two), or the fault injector's, boxed (a drill's).
enum Sent {
    Forward(<Forward as Service<Attempt>>::Future),
    Fault(Pin<Box<<Fault<Forward> as Service<Attempt>>::Future>>),
}

impl Future for Sent {
    type Output = Result<Response<Body>, TransportError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut *self {
            Sent::Forward(sent) => sent.as_mut().poll(cx).map_err(TransportError),
            Sent::Fault(sent) => sent.as_mut().poll(cx).map_err(TransportError),
        }
    }
}

/// The transport's error, as a type of its own (a boxed error as a service error trips the
/// compiler's `Send` proof of the stack's future); its source is the real error, which the
/// stack classifies by walking the chain.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct TransportError(#[source] BoxError);

/// What the egress answers with: the stack's response as it is (its body not boxed again),
/// or the proxy's own answer.
pub(crate) type EgressBody = http_body_util::Either<ReplayBody<Body>, Body>;

/// A built egress: its handler (for [`serve`](crate::server::serve)), and the handles the
/// admin port and the caller use.
pub(crate) struct Egress<H> {
    pub(crate) handler: H,
    pub(crate) policies: Policies<Telemetry>,
    pub(crate) watcher: Option<PolicyWatcher>,
    pub(crate) center: Option<Arc<CenterWatch>>,
    pub(crate) faults: Option<Arc<FaultInjector>>,
}

pub(crate) fn build(
    upstream: Option<Upstream>,
    pool: PoolConfig,
    config: EgressConfig,
    listen: SocketAddr,
    via: HeaderValue,
) -> Result<Egress<impl Handler<Body = EgressBody>>, ProxyError> {
    let file = match &config.policy {
        PolicySource::Watched(path) => PolicyFile::load(path)?,
        PolicySource::Fixed(file) => file.clone(),
        PolicySource::Center(center) => center.initial.clone().unwrap_or_default(),
    };
    let mut builder = ClientLayerBuilder::routes(&file);
    if let Some(seed) = config.seed {
        builder = builder.with_seed(seed);
    }
    let layer = builder.build()?;
    let policies = layer.policies().clone();
    let (watcher, center) = match config.policy {
        PolicySource::Watched(path) => (Some(policies.watch(path, DEFAULT_DEBOUNCE)?), None),
        PolicySource::Fixed(_) => (None, None),
        PolicySource::Center(center) => (
            None,
            Some(Arc::new(CenterWatch::start(&policies, center.watch)?)),
        ),
    };
    let faults = match config.fault {
        Some(fault) => Some(Arc::new(FaultInjector::new(fault)?)),
        None => None,
    };
    // The stack hands each attempt a replayable body; the transport sends any body.
    let fixed = upstream.is_some();
    let forward = Forward::new(upstream, PoolSettings::of(&pool), via.clone());
    let either = match &faults {
        Some(faults) => Either::Right(Fault::new(forward, Arc::clone(faults))),
        None => Either::Left(forward),
    };
    let transport = Transport(either);
    let mut client = layer.layer(transport);
    let handler = move |request: Request<Incoming>| {
        let caller = Caller::of(request.headers());
        let looped = crate::via::passed_here(request.headers(), &via)
            || (!fixed && crate::via::names_self(&request, listen));
        let call = (!looped).then(|| call_in_place(&mut client, request));
        async move {
            let Some(call) = call else {
                return Ok::<_, Infallible>(crate::answer::looped(&caller).map(EgressBody::Right));
            };
            Ok(match call.await {
                Ok(response) => response.map(EgressBody::Left),
                Err(error) => crate::answer::for_error(&error, &caller).map(EgressBody::Right),
            })
        }
    };
    Ok(Egress {
        handler,
        policies,
        watcher,
        center,
        faults,
    })
}
