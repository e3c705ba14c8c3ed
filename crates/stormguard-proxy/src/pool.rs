//! The HTTP/1.1 connection pool of one upstream: idle connections kept for reuse, a fresh
//! one dialled when none is idle.
//!
//! # Why not hyper-util's pool
//!
//! hyper-util's legacy `Client` serves any number of hosts behind one pool: every request
//! hashes its host into a map under a mutex, races a checkout against a connect, boxes its
//! future and clones reference counts on the way. Under load that was a large share of the
//! proxy's own CPU per request. A proxy knows its upstream before the request arrives: an
//! [`UpstreamPool`] is that upstream's alone, so a request pops the most recently returned
//! connection off a stack (the warmest socket) and the response body puts it back when the
//! upstream's answer has been read to its end.
//!
//! # What is kept from the legacy client's behaviour
//!
//! - A connection is reused only after its response body ended; a body dropped before its
//!   end closes the connection (the rest of the answer would otherwise be read as the next
//!   one's).
//! - A request that did not leave on a *reused* connection (it closed between being pooled and
//!   being used) goes out on another one; the caller never sees that. On a fresh connection the
//!   error is the caller's: hyper's "canceled", which the retry layer reads as never sent
//!   ([`classify_transport_error`](stormguard_tower::wire::classify_transport_error)).
//! - Errors are hyper's and the socket's own (a refused connect is an
//!   [`io::Error`] of kind `ConnectionRefused`, a reset after the request left
//!   is hyper's incomplete message), so the stack classifies them as before.
//! - Idle connections are closed after [`PoolSettings::idle_timeout`], and at most
//!   [`PoolSettings::max_idle`] are kept.
//!
//! # What it adds
//!
//! - A connect timeout: without one, a host that drops the SYN holds the request for as long
//!   as the kernel retries (about 127 s on Linux). It comes with each request (the route's
//!   policy's `timeouts.connect`, see [`UpstreamPool::send`]), else it is the pool's own
//!   ([`PoolSettings::connect_timeout`]); it is not part of what a connection is kept under,
//!   so routes with different connect timeouts to one upstream share its idle connections.
//!   A host with several addresses gives each a share of it ([`connect`]), so one that
//!   drops the SYN does not leave the next untried.
//!   A failed or timed-out connect is a [`ConnectError`]: nothing was sent, so the stack may
//!   retry any request after it (a bare timed-out `io::Error` would be in doubt).
//! - The pools of the hosts requests name ([`PoolMap`]) are dropped by their own sweep once
//!   they have no idle connection and no request holds them: a caller that names many hosts
//!   over time does not grow the map, or the number of sweep tasks, for ever.
//!
//! Connections are served by a task spawned on the runtime of the request that dialled them
//! (with the current-thread runtime of `--workers 1`, the same thread), and idle times are
//! read from tokio's clock, so tests drive expiry with paused time.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use stormguard_tower::wire::ConnectError;
use tokio::time::Instant;

use crate::config::PoolConfig;
use crate::forward::ForwardError;

pub(crate) mod connect;
use connect::{Connector, connect_timed_out, tcp_connect};

/// How a pool connects, how many idle connections it keeps, and for how long.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolSettings {
    /// A connect that has not completed after this long fails, unless the request's route
    /// gives its own.
    pub(crate) connect_timeout: Duration,
    /// An idle connection older than this is closed (checked when the pool is used, and by a
    /// sweep every `idle_timeout`, so one lingers at most twice as long).
    pub(crate) idle_timeout: Duration,
    /// Connections returned beyond this many idle ones are closed.
    pub(crate) max_idle: usize,
    /// How connections are opened.
    pub(crate) connect: Connector,
}

impl PoolSettings {
    /// The settings of `config` (validated by the caller), with room for the idle
    /// connections of a caller that keeps up to 1,024 requests in flight.
    pub(crate) fn of(config: &PoolConfig) -> PoolSettings {
        PoolSettings {
            connect_timeout: config.connect_timeout(),
            idle_timeout: config.idle_timeout(),
            max_idle: 1024,
            connect: tcp_connect,
        }
    }
}

/// The pools of the hosts that requests name (an egress proxy without a fixed upstream),
/// one per authority, made on first use. Each leaves the map by itself (see
/// [`UpstreamPool::leave_home`]).
pub(crate) struct PoolMap {
    settings: PoolSettings,
    pools: Mutex<HashMap<Authority, Arc<UpstreamPool>>>,
}

impl PoolMap {
    pub(crate) fn new(settings: PoolSettings) -> Arc<PoolMap> {
        Arc::new(PoolMap {
            settings,
            pools: Mutex::new(HashMap::new()),
        })
    }

    /// The pool of `authority`, made if there is none.
    pub(crate) fn get(self: &Arc<Self>, authority: &Authority) -> Arc<UpstreamPool> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pool) = pools.get(authority) {
            return Arc::clone(pool);
        }
        let pool = UpstreamPool::with_home(authority.clone(), self.settings, Arc::downgrade(self));
        pools.insert(authority.clone(), Arc::clone(&pool));
        // Swept from the start: a pool whose first request is dropped before it is sent must
        // leave the map as well.
        pool.start_sweeping();
        pool
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.pools.lock().map_or(0, |pools| pools.len())
    }
}

/// The HTTP/1.1 connections to one upstream.
pub(crate) struct UpstreamPool {
    authority: Authority,
    settings: PoolSettings,
    /// Oldest first: a checkout pops the back, expiry pops the front.
    idle: Mutex<VecDeque<Idle>>,
    sweeping: AtomicBool,
    /// The map this pool is in (none for a fixed upstream's).
    home: Weak<PoolMap>,
}

struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
}

impl UpstreamPool {
    /// The pool of a fixed upstream.
    pub(crate) fn new(authority: Authority, settings: PoolSettings) -> Arc<UpstreamPool> {
        UpstreamPool::with_home(authority, settings, Weak::new())
    }

    fn with_home(
        authority: Authority,
        settings: PoolSettings,
        home: Weak<PoolMap>,
    ) -> Arc<UpstreamPool> {
        Arc::new(UpstreamPool {
            authority,
            settings,
            idle: Mutex::new(VecDeque::new()),
            sweeping: AtomicBool::new(false),
            home,
        })
    }

    /// Starts the task that closes idle connections (and takes a named pool out of its map),
    /// once; outside a runtime there is nothing to sweep with, and the first request starts it.
    fn start_sweeping(self: &Arc<Self>) {
        // Every request calls this: once sweeping, one load and nothing else.
        if self.sweeping.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.sweeping.swap(true, Ordering::Relaxed) {
            runtime.spawn(sweep(Arc::downgrade(self)));
        }
    }

    /// The upstream's `host:port`.
    pub(crate) fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Sends `request` (its URI in origin form, its `Host` header set) on an idle connection,
    /// or on a fresh one when none is idle or every idle one turns out closed. A fresh one is
    /// dialled within `connect_timeout` (the route's), else the pool's own.
    pub(crate) async fn send(
        self: &Arc<Self>,
        mut request: Request<Body>,
        connect_timeout: Option<Duration>,
    ) -> Result<Response<Body>, ForwardError> {
        // Started by the first request at the latest (one that fails to connect too, so that
        // the pool of a host that never answers leaves its map as well).
        self.start_sweeping();
        loop {
            let (mut sender, reused) = match self.checkout() {
                Some(sender) => (sender, true),
                None => (self.dial(connect_timeout).await?, false),
            };
            // A fresh connection takes its first request at once; a pooled one may still be
            // finishing the previous response, or may have closed meanwhile.
            if reused && sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let back = Some((sender, Arc::clone(self)));
                    return Ok(response.map(|body| Body::new(PooledBody { body, back })));
                }
                Err(mut error) => match error.take_message() {
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(Box::new(error.into_error())),
                },
            }
        }
    }

    /// The most recently returned idle connection that is still open, after closing the
    /// expired ones.
    fn checkout(&self) -> Option<SendRequest<Body>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        self.expire(&mut idle, Instant::now());
        while let Some(entry) = idle.pop_back() {
            if !entry.sender.is_closed() {
                return Some(entry.sender);
            }
        }
        None
    }

    /// Puts a connection whose response ended back, unless it closed or the pool is full.
    fn give_back(&self, sender: SendRequest<Body>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.settings.max_idle {
            idle.push_back(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    fn expire(&self, idle: &mut VecDeque<Idle>, now: Instant) {
        while idle
            .front()
            .is_some_and(|oldest| now.duration_since(oldest.since) >= self.settings.idle_timeout)
        {
            idle.pop_front();
        }
    }

    /// Connects within `connect_timeout` (the pool's own when `None`) and hands the
    /// connection to a task of its own.
    async fn dial(
        &self,
        connect_timeout: Option<Duration>,
    ) -> Result<SendRequest<Body>, ForwardError> {
        let after = connect_timeout.unwrap_or(self.settings.connect_timeout);
        let connect = (self.settings.connect)(&self.authority, after);
        let stream = match tokio::time::timeout(after, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return Err(self.connect_error(error)),
            Err(_) => return Err(self.connect_error(connect_timed_out(after))),
        };
        stream.set_nodelay(true)?;
        // One buffer per request, as the server's answers (`crate::server`).
        let (sender, connection) = http1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "stormguard proxy: upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    fn connect_error(&self, error: io::Error) -> ForwardError {
        Box::new(ConnectError::new(self.authority.as_str(), error))
    }

    /// Takes this pool out of its map when it has no idle connection and nobody but the map
    /// and the sweep holds it (no request in flight, no response body being read); a later
    /// request for its host makes a new one. Whether it left.
    fn leave_home(self: &Arc<Self>) -> bool {
        let Some(home) = self.home.upgrade() else {
            return false;
        };
        // With the map locked nobody can take this pool from it; a request already holding
        // it counts in the strong count, and only such a request could return a connection.
        let mut pools = home.pools.lock().unwrap_or_else(|e| e.into_inner());
        let unheld = Arc::strong_count(self) == 2
            && pools
                .get(&self.authority)
                .is_some_and(|pool| Arc::ptr_eq(pool, self));
        let empty = self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if unheld && empty {
            pools.remove(&self.authority);
        }
        unheld && empty
    }

    #[cfg(test)]
    fn idle_len(&self) -> usize {
        self.idle.lock().map_or(0, |idle| idle.len())
    }
}

/// Closes a pool's expired idle connections every `idle_timeout`, while the pool exists: a
/// proxy whose traffic stopped does not hold the upstream's sockets for ever. A pool of a
/// [`PoolMap`] left with nothing leaves its map, and its sweep ends.
async fn sweep(pool: Weak<UpstreamPool>) {
    let Some(every) = pool.upgrade().map(|p| p.settings.idle_timeout) else {
        return;
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        {
            let mut idle = pool.idle.lock().unwrap_or_else(|e| e.into_inner());
            pool.expire(&mut idle, Instant::now());
        }
        if pool.leave_home() {
            return;
        }
    }
}

/// A response body that returns its connection to the pool when it ends.
struct PooledBody {
    body: Incoming,
    back: Option<(SendRequest<Body>, Arc<UpstreamPool>)>,
}

impl PooledBody {
    fn give_back(&mut self) {
        if let Some((sender, pool)) = self.back.take() {
            pool.give_back(sender);
        }
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        match &frame {
            None => self.give_back(),
            // A broken body leaves the connection in no state to reuse.
            Some(Err(_)) => self.back = None,
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // An empty body (204, a HEAD's answer) is never polled: it ended all the same. One
        // dropped before its end drops the connection with it.
        if http_body::Body::is_end_stream(&self.body) {
            self.give_back();
        }
    }
}

#[cfg(test)]
mod tests;
