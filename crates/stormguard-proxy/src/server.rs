//! The accept loop: one port that speaks HTTP/1.1 and HTTP/2 cleartext (prior knowledge, as
//! gRPC clients use it), each connection served on its own task.
//!
//! The connection tasks belong to the accept loop (a [`JoinSet`]): when the loop ends, the
//! connections still open end with it, so a dropped [`Proxy`](crate::Proxy) leaves no task
//! serving behind it. A shutdown first drains: the listener closes, each connection finishes
//! the requests it has (HTTP/1.1 closes after the response in progress, HTTP/2 sends
//! `GOAWAY`), and whatever is still open when the drain bound passes is cut.

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::util::{BoxCloneService, Oneshot};
use tower::{Service, ServiceExt};

/// What a proxy serves: every request gets a response (the proxy's own answer when the
/// upstream gave none).
pub(crate) type ProxyService = BoxCloneService<Request<Incoming>, Response<Body>, Infallible>;

/// The pause after a failed accept, doubling while accepts keep failing: out of file
/// descriptors, an immediate retry fails again at once and would spin a core exactly when
/// the machine is overloaded.
const ACCEPT_PAUSE: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(200));

/// Serves `service` on `listener` until `stop` holds a drain bound (then drains for at
/// most that long) or the task is aborted (then every connection is cut at once).
pub(crate) async fn serve(
    listener: TcpListener,
    service: ProxyService,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let mut pause = ACCEPT_PAUSE.0;
    let drain = loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            bound = stop.wait_for(Option::is_some) => break bound.ok().and_then(|b| *b),
        };
        let (stream, _) = match accepted {
            Ok(accepted) => {
                pause = ACCEPT_PAUSE.0;
                accepted
            }
            // Out of file descriptors, or a connection reset before it was accepted: the
            // listener is still good; try again after a pause.
            Err(error) => {
                tracing::warn!(%error, ?pause, "stormguard proxy: accept failed");
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    bound = stop.wait_for(Option::is_some) => break bound.ok().and_then(|b| *b),
                }
                pause = (pause * 2).min(ACCEPT_PAUSE.1);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = Serve(RefCell::new(service.clone()));
        let watcher = graceful.watcher();
        connections.spawn(async move {
            let mut builder = auto::Builder::new(TokioExecutor::new());
            // Head and body copied into one buffer and written with one `write`: fewer
            // instructions and cache misses per small answer than hyper's queue of buffers
            // for `writev` (measured, README); a large body is copied once more.
            builder.http1().writev(false);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection).await {
                tracing::debug!(error = %error, "stormguard proxy: connection ended with an error");
            }
        });
    };
    drop(listener);
    if let Some(bound) = drain {
        let _ = tokio::time::timeout(bound, graceful.shutdown()).await;
    }
    // `connections` is dropped here: whatever is still open is cut.
}

/// One connection's copy of the proxy's service, called in place. hyper calls a service
/// through `&self`, so hyper-util's adapter (`TowerToHyperService`) clones the tower service
/// for every request: for a boxed service that is an allocation, and a clone of everything
/// the service holds. A connection's requests are called one at a time from its own task, so
/// a cell lets each call use the connection's copy ([`call_in_place`]).
struct Serve(RefCell<ProxyService>);

impl hyper::service::Service<Request<Incoming>> for Serve {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Called<ProxyService, Request<Incoming>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        call_in_place(&mut self.0.borrow_mut(), request)
    }
}

/// `service`'s answer to `request`: called in place when the service is ready at once (the
/// proxy's services always are: nothing under them holds requests back), else by a boxed
/// clone that waits for readiness, as tower's `oneshot` on a clone would. In place saves the
/// clone (reference counts, and an allocation for a boxed service) and a large future moved
/// around with the service inside it.
pub(crate) fn call_in_place<S, R>(service: &mut S, request: R) -> Called<S, R>
where
    S: Service<R> + Clone,
{
    match service.poll_ready(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(())) => Called::Now(service.call(request)),
        // Not ready (or failed, which the clone's own readiness check reports).
        _ => Called::Later(Box::pin(service.clone().oneshot(request))),
    }
}

/// The future of [`call_in_place`].
pub(crate) enum Called<S: Service<R>, R> {
    Now(S::Future),
    Later(Pin<Box<Oneshot<S, R>>>),
}

impl<S, R> Future for Called<S, R>
where
    S: Service<R>,
    S::Future: Unpin,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Called::Now(future) => Pin::new(future).poll(cx),
            Called::Later(future) => future.as_mut().poll(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{Ready, ready};
    use std::task::{Context, Poll};

    use tower::Service;

    use super::{Called, call_in_place};

    /// Adds one; not ready on its first readiness check when built shut.
    #[derive(Clone)]
    struct Gate {
        open: bool,
    }

    impl Service<u8> for Gate {
        type Response = u8;
        type Error = Infallible;
        type Future = Ready<Result<u8, Infallible>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            if self.open {
                return Poll::Ready(Ok(()));
            }
            self.open = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }

        fn call(&mut self, request: u8) -> Self::Future {
            assert!(self.open, "called before it was ready");
            ready(Ok(request + 1))
        }
    }

    #[tokio::test]
    async fn a_ready_service_is_called_in_place() {
        let called = call_in_place(&mut Gate { open: true }, 1);
        assert!(matches!(called, Called::Now(_)));
        assert_eq!(called.await, Ok(2));
    }

    #[tokio::test]
    async fn a_service_not_ready_at_once_is_called_when_ready() {
        let called = call_in_place(&mut Gate { open: false }, 1);
        assert!(matches!(called, Called::Later(_)));
        assert_eq!(called.await, Ok(2));
    }
}
