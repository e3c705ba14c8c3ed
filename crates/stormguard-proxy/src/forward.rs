//! The transport at the bottom of both directions: one request forwarded to its upstream over
//! pooled connections, in the HTTP version the caller spoke.
//!
//! # Why two pools
//!
//! A caller that speaks HTTP/2 (gRPC always does) expects HTTP/2 semantics end to end:
//! trailers, streams, `te: trailers`. Forwarding it over HTTP/1.1 would lose the trailers
//! that carry `grpc-status`. So an HTTP/2 request goes to the upstream over HTTP/2 with prior
//! knowledge (h2c), and an HTTP/1.x request over HTTP/1.1; each version has its own pool.
//!
//! # What is rewritten
//!
//! Only what a proxy must: the URI (the upstream's authority, the caller's path and query),
//! and the hop-by-hop headers of RFC 9110 §7.6.1 are dropped (`connection` and the headers it
//! names, `keep-alive`, `proxy-connection`, `transfer-encoding`, `upgrade`, and `te` except
//! `te: trailers`, which gRPC needs). The `Host` header is kept as the caller wrote it. A
//! `Via` entry naming this proxy is appended (RFC 9110 §7.6.3), which is how a request that
//! comes back to the proxy that sent it is recognised (see [`crate::via`]).

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use http::header::{CONNECTION, HeaderName, HeaderValue, TE, TRANSFER_ENCODING, UPGRADE, VIA};
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, Request, Response, Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower::Service;

use crate::upstream::{Upstream, named_authority};

/// The transport's error: the connection pool's (its cause chain holds hyper's and the
/// socket's errors, which the client stack classifies), or a request that names no upstream.
pub(crate) type ForwardError = Box<dyn std::error::Error + Send + Sync>;

/// Forwards requests to a fixed upstream, or to the host each request names. Cloned for
/// every attempt, so it is one reference-counted pointer.
#[derive(Clone)]
pub(crate) struct Forward {
    inner: Arc<Inner>,
}

struct Inner {
    http1: Client<HttpConnector, Body>,
    http2: Client<HttpConnector, Body>,
    upstream: Option<Upstream>,
    /// This proxy's `Via` entry.
    via: HeaderValue,
}

/// A request with no upstream to go to: no fixed upstream, and neither an absolute URI nor a
/// `Host` header.
#[derive(Debug, thiserror::Error)]
#[error("the request names no host to forward to (send it in absolute form or with a Host header)")]
pub(crate) struct NoUpstream;

impl Forward {
    pub(crate) fn new(upstream: Option<Upstream>, via: HeaderValue) -> Forward {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http1 = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1024)
            .build(connector.clone());
        let http2 = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build(connector);
        Forward {
            inner: Arc::new(Inner {
                http1,
                http2,
                upstream,
                via,
            }),
        }
    }

    fn prepare(&self, request: Request<Body>) -> Result<(Request<Body>, bool), NoUpstream> {
        let authority = match &self.inner.upstream {
            Some(up) => up.authority_ref().clone(),
            None => named_authority(&request).ok_or(NoUpstream)?,
        };
        let (mut head, body) = request.into_parts();
        let path = head
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(Scheme::HTTP);
        parts.authority = Some(authority);
        parts.path_and_query = Some(path);
        head.uri = Uri::from_parts(parts).map_err(|_| NoUpstream)?;
        strip_hop_by_hop(&mut head.headers);
        head.headers.append(VIA, self.inner.via.clone());
        let h2 = head.version == Version::HTTP_2;
        head.version = if h2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        Ok((Request::from_parts(head, body), h2))
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
        let prepared = self.prepare(request.map(Body::new));
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let (request, h2) = prepared?;
            let client = if h2 { &inner.http2 } else { &inner.http1 };
            let mut response = client.request(request).await?;
            strip_hop_by_hop(response.headers_mut());
            Ok(response.map(Body::new))
        })
    }
}

/// Drops the hop-by-hop headers (see the [module docs](self)).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
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
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_dropped_and_te_trailers_kept() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, "keep-alive, x-private".parse().expect("value"));
        h.insert("x-private", "1".parse().expect("value"));
        h.insert("keep-alive", "timeout=5".parse().expect("value"));
        h.insert("x-kept", "1".parse().expect("value"));
        h.insert(TE, "trailers".parse().expect("value"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2, "{h:?}");
        assert!(h.contains_key("x-kept") && h.contains_key(TE));
        h.insert(TE, "gzip".parse().expect("value"));
        strip_hop_by_hop(&mut h);
        assert!(!h.contains_key(TE));
    }
}
