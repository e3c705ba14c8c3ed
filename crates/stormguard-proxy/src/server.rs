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

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use stormguard_tower::wire::BoxError;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::util::Oneshot;
use tower::{Service, ServiceExt};

/// The pause after a failed accept, doubling while accepts keep failing: out of file
/// descriptors, an immediate retry fails again at once and would spin a core exactly when
/// the machine is overloaded.
const ACCEPT_PAUSE: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(200));

/// What a proxy serves: a function that answers every request (the proxy's own answer when
/// the upstream gave none), so nothing here is polled for readiness (the stacks inside it
/// are, through [`call_in_place`]). Each direction has its own, with its own body type, so a
/// request's future is not boxed again on the way out, nor the egress answer's body (an
/// allocation each, per request, when both directions were one boxed tower service; the
/// ingress answer's body is still boxed, inside its stack).
pub(crate) trait Handler: Clone + Send + 'static {
    /// The answer's body.
    type Body: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static;
    /// The answer to one request.
    type Answer: Future<Output = Result<Response<Self::Body>, Infallible>> + Send + 'static;

    /// Answers `request`.
    fn handle(&mut self, request: Request<Incoming>) -> Self::Answer;
}

impl<H, F, B> Handler for H
where
    H: FnMut(Request<Incoming>) -> F + Clone + Send + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static,
{
    type Body = B;
    type Answer = F;

    fn handle(&mut self, request: Request<Incoming>) -> F {
        self(request)
    }
}

/// Serves `handler` on `listener` until `stop` holds a drain bound (then drains for at
/// most that long) or the task is aborted (then every connection is cut at once).
pub(crate) async fn serve(
    listener: TcpListener,
    handler: impl Handler,
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
        let service = Serve(RefCell::new(handler.clone()));
        let watcher = graceful.watcher();
        connections.spawn(async move {
            let mut builder = auto::Builder::new(TokioExecutor::new());
            // Head and body copied into one buffer and written with one `write`: fewer
            // instructions and cache misses per small answer than hyper's queue of buffers
            // for `writev` (measured, BENCHMARKS.md); a large body is copied once more.
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

/// One connection's copy of the proxy's handler, called in place. hyper calls a service
/// through `&self`, which would force a clone of the handler (the whole client stack) for
/// every request. hyper calls a connection's service from the connection's own task, one
/// call at a time (HTTP/2 streams too: their futures run concurrently afterwards, but each
/// call returns before the next), and the borrow of the cell ends when `call` returns (the
/// future it gives holds no borrow), so each call can use the connection's copy.
struct Serve<H>(RefCell<H>);

impl<H: Handler> hyper::service::Service<Request<Incoming>> for Serve<H> {
    type Response = Response<H::Body>;
    type Error = Infallible;
    type Future = H::Answer;

    fn call(&self, request: Request<Incoming>) -> H::Answer {
        self.0.borrow_mut().handle(request)
    }
}

/// `service`'s answer to `request`: called in place when the service is ready at once (the
/// proxy's services always are: nothing under them holds requests back). A service not ready
/// yet has registered to be woken — a limit's place in its semaphore's queue, say — so that
/// very service goes with the request and waits (tower's `oneshot`), and a fresh clone takes
/// its place; a clone sent instead would queue behind it and could wait for ever. A service
/// whose readiness failed gives its error. In place saves the clone (reference counts, and
/// an allocation for a boxed service) and a large future moved around with the service
/// inside it.
pub(crate) fn call_in_place<S, R>(service: &mut S, request: R) -> Called<S, R>
where
    S: Service<R> + Clone,
{
    match service.poll_ready(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(())) => Called::Now(service.call(request)),
        Poll::Ready(Err(error)) => Called::Failed(Some(error)),
        Poll::Pending => {
            let fresh = service.clone();
            let waiting = std::mem::replace(service, fresh);
            Called::Later(Box::pin(waiting.oneshot(request)))
        }
    }
}

/// The future of [`call_in_place`].
pub(crate) enum Called<S: Service<R>, R> {
    Now(S::Future),
    Later(Pin<Box<Oneshot<S, R>>>),
    Failed(Option<S::Error>),
}

impl<S, R> Future for Called<S, R>
where
    S: Service<R>,
    S::Future: Unpin,
    S::Error: Unpin,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Called::Now(future) => Pin::new(future).poll(cx),
            Called::Later(future) => future.as_mut().poll(cx),
            Called::Failed(error) => match error.take() {
                Some(error) => Poll::Ready(Err(error)),
                None => panic!("`Called` polled after it completed"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use tokio::sync::{OwnedSemaphorePermit, Semaphore};
    use tower::Service;

    use super::{Called, call_in_place};

    type Acquiring = Pin<Box<dyn Future<Output = OwnedSemaphorePermit> + Send>>;

    /// Adds one, one request at a time: readiness takes the one permit (waiting in the
    /// semaphore's queue, first come first served, as tower's concurrency limit does) and the
    /// answer holds it until it is dropped. A clone has no place in the queue of its own.
    struct OneAtATime {
        semaphore: Arc<Semaphore>,
        acquiring: Option<Acquiring>,
        permit: Option<OwnedSemaphorePermit>,
    }

    impl Clone for OneAtATime {
        fn clone(&self) -> Self {
            OneAtATime {
                semaphore: Arc::clone(&self.semaphore),
                acquiring: None,
                permit: None,
            }
        }
    }

    impl Service<u8> for OneAtATime {
        type Response = (u8, OwnedSemaphorePermit);
        type Error = &'static str;
        type Future = std::future::Ready<Result<Self::Response, &'static str>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
            if self.permit.is_some() {
                return Poll::Ready(Ok(()));
            }
            let semaphore = Arc::clone(&self.semaphore);
            let acquiring = self.acquiring.get_or_insert_with(|| {
                Box::pin(async move { semaphore.acquire_owned().await.expect("never closed") })
            });
            let permit = std::task::ready!(acquiring.as_mut().poll(cx));
            self.acquiring = None;
            self.permit = Some(permit);
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: u8) -> Self::Future {
            match self.permit.take() {
                Some(permit) => std::future::ready(Ok((request + 1, permit))),
                None => std::future::ready(Err("called before it was ready")),
            }
        }
    }

    fn one_at_a_time() -> OneAtATime {
        OneAtATime {
            semaphore: Arc::new(Semaphore::new(1)),
            acquiring: None,
            permit: None,
        }
    }

    #[tokio::test]
    async fn a_ready_service_is_called_in_place() {
        let called = call_in_place(&mut one_at_a_time(), 1);
        assert!(matches!(called, Called::Now(_)));
        assert_eq!(called.await.map(|(n, _)| n), Ok(2));
    }

    /// Paused time: a request that waited for ever would let the clock jump to the timeout.
    #[tokio::test(start_paused = true)]
    async fn a_service_not_ready_at_once_waits_with_its_place_in_the_queue() {
        let mut service = one_at_a_time();
        let (first, held) = call_in_place(&mut service, 1).await.expect("ready at once");
        assert_eq!(first, 2);
        let second = call_in_place(&mut service, 2);
        assert!(matches!(second, Called::Later(_)));
        let answer = tokio::spawn(tokio::time::timeout(Duration::from_secs(5), second));
        tokio::task::yield_now().await;
        // The first answer is done: its permit goes to the first in the queue, the request
        // that waited, which must be the one holding that place.
        drop(held);
        let answer = answer
            .await
            .expect("no panic")
            .expect("answered, not stuck");
        assert_eq!(answer.map(|(n, _)| n), Ok(3));
        // The connection's copy, a fresh clone, serves the next request.
        let third = call_in_place(&mut service, 3);
        assert!(matches!(third, Called::Now(_)));
    }

    #[tokio::test]
    async fn a_failed_readiness_is_the_callers_error() {
        #[derive(Clone)]
        struct Broken;
        impl Service<u8> for Broken {
            type Response = u8;
            type Error = &'static str;
            type Future = std::future::Ready<Result<u8, &'static str>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
                Poll::Ready(Err("broken"))
            }
            fn call(&mut self, _: u8) -> Self::Future {
                std::future::ready(Ok(0))
            }
        }
        let called = call_in_place(&mut Broken, 1);
        assert!(matches!(called, Called::Failed(_)));
        assert_eq!(called.await, Err("broken"));
    }
}
