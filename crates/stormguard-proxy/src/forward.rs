//! The transport at the bottom of both directions: one request forwarded to its upstream over
//! pooled connections, in the HTTP version the caller spoke.
//!
//! # Why two pools
//!
//! A caller that speaks HTTP/2 (gRPC always does) expects HTTP/2 semantics end to end:
//! trailers, streams, `te: trailers`. Forwarding it over HTTP/1.1 would lose the trailers
//! that carry `grpc-status`. So an HTTP/2 request goes to the upstream over HTTP/2 with prior
//! knowledge (h2c), and an HTTP/1.x request over HTTP/1.1; each version has its own pool.
//! HTTP/2 multiplexes, so hyper-util's client with one connection per host serves it; HTTP/1.1
//! takes a connection per request in flight, and the proxy's own [`UpstreamPool`] (one per
//! upstream, no shared map on a fixed upstream) keeps that checkout cheap.
//!
//! # Connect timeouts
//!
//! A route's policy may bound its connects (`timeouts.connect`): the client stack hands the
//! value down in each attempt's extensions ([`ConnectTimeout`]), and the forwarder gives it to
//! the connect that request opens, if it opens one; a request without one connects within the
//! pool's ([`PoolConfig::connect_timeout`](crate::PoolConfig::connect_timeout)); either is capped at
//! [`PoolConfig::MAX_CONNECT_TIMEOUT`](crate::PoolConfig::MAX_CONNECT_TIMEOUT). The value is not part of what a connection is kept
//! under: routes with different connect timeouts to one upstream share its connections. The
//! HTTP/1.1 pool takes it with the checkout ([`UpstreamPool::send`]). hyper-util's HTTP/2
//! client calls its connector from inside the request's future, where the connector
//! ([`H2Connector`]) reads it from a task-local scoped around that future; an HTTP/2 request
//! that finds its connection already opening waits for that connect, on its opener's timeout.
//!
//! # What is rewritten
//!
//! Only what a proxy must: the URI (the upstream's authority, the caller's path and query;
//! origin form on HTTP/1.1), and the hop-by-hop headers of RFC 9110 §7.6.1 are dropped (`connection` and the headers it
//! names, `keep-alive`, `proxy-connection`, `transfer-encoding`, `upgrade`, and `te` except
//! `te: trailers`, which gRPC needs). The `Host` header of a request in origin form is kept
//! as the caller wrote it (a request without one, HTTP/1.0, is given the upstream's); a
//! request in absolute form (`GET http://users:8080/x`, what an `http_proxy` client sends)
//! has its `Host` replaced by the target's authority without any userinfo, as RFC 9112
//! §3.2.2 requires of a proxy: the target is what the caller asked for. A
//! `Via` entry naming this proxy is appended (RFC 9110 §7.6.3), which is how a request that
//! comes back to the proxy that sent it is recognised (see [`crate::via`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::header::{
    CONNECTION, HOST, HeaderName, HeaderValue, TE, TRANSFER_ENCODING, UPGRADE, VIA,
};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, Request, Response, Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use stormguard_tower::client::ConnectTimeout;
use stormguard_tower::wire::ConnectError;
use tokio::net::TcpStream;
use tower::Service;

use crate::pool::connect::connect_timed_out;
use crate::pool::{PoolMap, PoolSettings, UpstreamPool};
use crate::upstream::{Upstream, named_authority, without_userinfo};

/// The transport's error: the connection's (hyper's and the socket's errors, in a cause
/// chain the client stack classifies), or a request that names no upstream.
pub(crate) type ForwardError = Box<dyn std::error::Error + Send + Sync>;

/// Forwards requests to a fixed upstream, or to the host each request names. Cloned for
/// every attempt, so it is one reference-counted pointer.
#[derive(Clone)]
pub(crate) struct Forward {
    inner: Arc<Inner>,
}

struct Inner {
    http1: Http1,
    http2: Client<H2Connector, Body>,
    /// This proxy's `Via` entry.
    via: HeaderValue,
}

/// Where an HTTP/1.1 request finds its connection: the fixed upstream's pool, or the pool of
/// the host it names (one look-up in a map of hosts per request).
enum Http1 {
    Fixed(Arc<UpstreamPool>),
    Named(Arc<PoolMap>),
}

impl Http1 {
    /// The pool of the fixed upstream, or of the host `named`.
    fn pool(&self, named: Option<&Authority>) -> Result<Arc<UpstreamPool>, NoUpstream> {
        match (self, named) {
            (Http1::Fixed(pool), _) => Ok(Arc::clone(pool)),
            (Http1::Named(pools), Some(authority)) => Ok(pools.get(authority)),
            (Http1::Named(_), None) => Err(NoUpstream),
        }
    }
}

/// A request with no upstream to go to: no fixed upstream, and neither an absolute URI nor a
/// `Host` header.
#[derive(Debug, thiserror::Error)]
#[error("the request names no host to forward to (send it in absolute form or with a Host header)")]
pub(crate) struct NoUpstream;

/// A request ready to leave: the pool it goes through, and the request itself.
enum Prepared {
    Http1(Arc<UpstreamPool>, Request<Body>),
    Http2(Request<Body>),
}

impl Forward {
    /// A forwarder to `upstream` (or to each request's host), with pool settings `settings`
    /// (the HTTP/2 client takes their connect and idle timeouts).
    pub(crate) fn new(
        upstream: Option<Upstream>,
        settings: PoolSettings,
        via: HeaderValue,
    ) -> Forward {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        let connector = H2Connector {
            http,
            timeout: settings.connect_timeout,
        };
        let http2 = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .pool_idle_timeout(settings.idle_timeout)
            .build(connector);
        let http1 = match &upstream {
            Some(up) => Http1::Fixed(UpstreamPool::new(up.authority_ref().clone(), settings)),
            None => Http1::Named(PoolMap::new(settings)),
        };
        Forward {
            inner: Arc::new(Inner { http1, http2, via }),
        }
    }

    fn prepare(&self, request: Request<Body>) -> Result<Prepared, NoUpstream> {
        let named = match &self.inner.http1 {
            Http1::Fixed(_) => None,
            Http1::Named(_) => Some(named_authority(&request).ok_or(NoUpstream)?),
        };
        let (mut head, body) = request.into_parts();
        strip_hop_by_hop(&mut head.headers);
        head.headers.append(VIA, self.inner.via.clone());
        let path = head
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        if head.version == Version::HTTP_2 {
            let authority = match (named, &self.inner.http1) {
                (Some(named), _) => named,
                (None, Http1::Fixed(pool)) => pool.authority().clone(),
                (None, Http1::Named(_)) => return Err(NoUpstream),
            };
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(Scheme::HTTP);
            parts.authority = Some(authority);
            parts.path_and_query = Some(path);
            head.uri = Uri::from_parts(parts).map_err(|_| NoUpstream)?;
            return Ok(Prepared::Http2(Request::from_parts(head, body)));
        }
        let pool = self.inner.http1.pool(named.as_ref())?;
        // Origin form on the wire (`GET /path HTTP/1.1`). The target of a request in
        // absolute form is its `Host` (RFC 9112 §3.2.2); a request in origin form keeps the
        // caller's, and one without (HTTP/1.0) gets the upstream's.
        let target = match (named, head.uri.authority()) {
            (Some(named), Some(_)) => Some(named),
            (None, Some(target)) => Some(without_userinfo(target).ok_or(NoUpstream)?),
            (_, None) => None,
        };
        if let Some(target) = target {
            let host = HeaderValue::from_str(target.as_str()).map_err(|_| NoUpstream)?;
            head.headers.insert(HOST, host);
        } else if !head.headers.contains_key(HOST) {
            let host = HeaderValue::from_str(pool.authority().as_str()).map_err(|_| NoUpstream)?;
            head.headers.insert(HOST, host);
        }
        head.uri = Uri::from(path);
        head.version = Version::HTTP_11;
        Ok(Prepared::Http1(pool, Request::from_parts(head, body)))
    }
}

impl<B> Service<Request<B>> for Forward
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<ForwardError>,
{
    type Response = Response<Body>;
    type Error = ForwardError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Body>, ForwardError>> + Send>,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ForwardError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Capped as the pool's own is: a policy may allow an hour for any duration.
        let connect_timeout = request
            .extensions()
            .get::<ConnectTimeout>()
            .map(|c| c.0.min(crate::PoolConfig::MAX_CONNECT_TIMEOUT));
        // Each kind of request gets a box the size of its own future: built on the stack and
        // moved into its box, an HTTP/1.1 request would otherwise carry (and copy) the HTTP/2
        // client's much larger state too.
        match self.prepare(request.map(Body::new)) {
            Ok(Prepared::Http1(pool, request)) => Box::pin(async move {
                let mut response = pool.send(request, connect_timeout).await?;
                strip_hop_by_hop(response.headers_mut());
                Ok(response)
            }),
            Ok(Prepared::Http2(request)) => {
                Box::pin(send_h2(Arc::clone(&self.inner), request, connect_timeout))
            }
            Err(error) => Box::pin(std::future::ready(Err(error.into()))),
        }
    }
}

/// Sends an HTTP/2 request through the HTTP/2 client, its connect bounded by
/// `connect_timeout` when the request's route gives one.
async fn send_h2(
    inner: Arc<Inner>,
    request: Request<Body>,
    connect_timeout: Option<Duration>,
) -> Result<Response<Body>, ForwardError> {
    let target = request.uri().authority().map(|a| a.to_string());
    let sent = inner.http2.request(request);
    let sent = match connect_timeout {
        Some(timeout) => H2_CONNECT_TIMEOUT.scope(timeout, sent).await,
        None => sent.await,
    };
    let mut response = match sent {
        Ok(response) => response.map(Body::new),
        // Never sent: as retryable as the HTTP/1.1 pool's failed connects.
        Err(error) if error.is_connect() => {
            let target = target.unwrap_or_default();
            return Err(ConnectError::new(target, io::Error::other(error)).into());
        }
        Err(error) => return Err(error.into()),
    };
    strip_hop_by_hop(response.headers_mut());
    Ok(response)
}

tokio::task_local! {
    /// The connect timeout of the HTTP/2 request being sent, when its route gives one.
    static H2_CONNECT_TIMEOUT: Duration;
}

/// The HTTP/2 client's connector: hyper-util's, bounded by the connect timeout of the request
/// that opens the connection (see the [module docs](self)), else by the pool's.
#[derive(Clone)]
struct H2Connector {
    http: HttpConnector,
    /// The pool's connect timeout.
    timeout: Duration,
}

impl Service<Uri> for H2Connector {
    type Response = TokioIo<TcpStream>;
    type Error = ForwardError;
    type Future = Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, ForwardError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ForwardError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        // Read now: hyper-util calls this from within the opening request's poll, and may
        // finish the connect on a task of its own.
        let after = H2_CONNECT_TIMEOUT
            .try_with(|timeout| *timeout)
            .unwrap_or(self.timeout);
        // The connector's own timeout too: it splits it between a host's addresses, so a
        // first address that drops SYNs leaves time for the next; the outer one bounds the
        // name look-up as well. (`HttpConnector` is always ready: the clone needs no poll.)
        let mut http = self.http.clone();
        http.set_connect_timeout(Some(after));
        let connect = http.call(uri);
        Box::pin(async move {
            match tokio::time::timeout(after, connect).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(Box::new(connect_timed_out(after)) as ForwardError),
            }
        })
    }
}

/// Drops the hop-by-hop headers (see the [module docs](self)). Most messages carry none:
/// one pass over the names, without hashing, tells, and only a message that has one pays
/// for the removals (a hashed look-up each).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let any = headers.keys().any(|name| {
        [CONNECTION, TE, TRANSFER_ENCODING, UPGRADE].contains(name)
            || name.as_str() == "keep-alive"
            || name.as_str() == "proxy-connection"
    });
    if !any {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [CONNECTION, TRANSFER_ENCODING, UPGRADE] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    let trailers_only = headers
        .get(TE)
        .is_some_and(|te| te.as_bytes().eq_ignore_ascii_case(b"trailers"));
    if !trailers_only {
        headers.remove(TE);
    }
}

#[cfg(test)]
mod tests;
