//! Upstream HTTP/1.1 connections driven by the task of the downstream connection that dialled
//! them, instead of by a task of their own.
//!
//! # Why
//!
//! A hyper client connection is a future that has to be polled for its requests to move: the
//! request is handed to it through a channel, it writes the request and reads the answer, and
//! hands the answer back through another channel. On a task of its own, every request then
//! costs the runtime a wake-up and a poll of that task on top of the downstream connection's,
//! and a few more for the wake-ups the two channels and the body send back and forth. Polled
//! by the downstream connection's own task, the same steps happen within that task's polls:
//! a request is one task poll when it arrives and one when the upstream answers.
//!
//! # How
//!
//! [`driving`] wraps a downstream connection's future (in [`crate::server`]). A connection
//! the pool dials while that future is polled is given to it ([`drive`]) and polled along
//! with it. Each connection has a [`Home`] that says who drives it; the pool keeps the home
//! with the idle connection, and a request takes an idle connection its own downstream
//! connection drives first, so a caller that keeps its connections to the proxy open keeps
//! "its" upstream connections too. Any request may still take any idle connection: one
//! driven by another downstream connection's task simply wakes that task.
//!
//! Two wakers tell which side was woken, so a poll touches only what can move, and wake-ups
//! that happen while the task is being polled (a request handed to an upstream connection, an
//! answer handed back) are served in the same poll instead of scheduling the task again.
//!
//! When the downstream connection ends (or is cut), the upstream connections it drives get a
//! task of their own, as a connection dialled outside a downstream connection does (a request
//! on an HTTP/2 stream, which hyper serves on a task of its own, or a test): they may be
//! serving another downstream connection's request, and idle ones stay in the pool. Such an
//! orphan is adopted by the next downstream connection whose request takes it from the pool:
//! the callers of a proxy come and go, and a pool warmed by callers that left would otherwise
//! be served by tasks of their own for ever.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use axum::body::Body;
use hyper::client::conn::http1::Connection;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// An upstream HTTP/1.1 connection's future.
pub(crate) type UpstreamConnection = Connection<TokioIo<TcpStream>, Body>;

/// The [`Home::driver`] of a connection on a task of its own.
const ORPHAN: usize = 0;

/// Rounds of polling within one task poll: a future that keeps waking itself (a socket out
/// of the runtime's cooperative budget) goes back to the scheduler after this many.
const ROUNDS: usize = 8;

thread_local! {
    /// The downstream connection being polled on this thread, if any. A thread-local, not a
    /// task-local: it is set only while that connection's future is polled, so it is exactly
    /// the task's, and costs a load instead of swapping a task-local in and out on every poll.
    static POLLING: Cell<Option<usize>> = const { Cell::new(None) };
    /// Connections dialled or adopted during that poll, taken over by the downstream
    /// connection when its poll returns.
    static DIALLED: RefCell<Vec<(UpstreamConnection, Arc<Home>)>> = const { RefCell::new(Vec::new()) };
}

/// The downstream connection being served by the current task, if any.
pub(crate) fn current() -> Option<usize> {
    POLLING.with(Cell::get)
}

/// Who drives one upstream connection: a downstream connection, or (an orphan) a task of its
/// own, which holds the connection here so that a downstream connection can adopt it.
pub(crate) struct Home {
    driver: AtomicUsize,
    /// An orphan's connection, and its task's waker.
    orphan: Mutex<(Option<UpstreamConnection>, Option<Waker>)>,
}

impl Home {
    /// Whether the downstream connection `me` drives the connection.
    pub(crate) fn driven_by(&self, me: Option<usize>) -> bool {
        me == Some(self.driver.load(Ordering::Relaxed))
    }

    /// Has the downstream connection being polled (`me`) drive the connection, if it is an
    /// orphan.
    pub(crate) fn adopt(self: &Arc<Self>, me: Option<usize>) {
        let Some(me) = me else {
            return;
        };
        if self.driver.load(Ordering::Relaxed) != ORPHAN {
            return;
        }
        let mut orphan = self.orphan.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(connection) = orphan.0.take() {
            self.driver.store(me, Ordering::Relaxed);
            DIALLED.with(|dialled| dialled.borrow_mut().push((connection, Arc::clone(self))));
        }
        // Its task ends.
        if let Some(task) = orphan.1.take() {
            task.wake();
        }
    }
}

/// Has the current downstream connection drive `connection`, or gives it a task of its own
/// outside one. Its home.
pub(crate) fn drive(connection: UpstreamConnection) -> Arc<Home> {
    let me = current();
    let home = Arc::new(Home {
        driver: AtomicUsize::new(me.unwrap_or(ORPHAN)),
        orphan: Mutex::new((None, None)),
    });
    match me {
        Some(_) => DIALLED.with(|dialled| {
            dialled.borrow_mut().push((connection, Arc::clone(&home)));
        }),
        None => orphan(connection, Arc::clone(&home)),
    }
    home
}

/// Serves `connection` on a task of its own until it ends or is adopted (nothing, outside a
/// runtime: it closes).
fn orphan(connection: UpstreamConnection, home: Arc<Home>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    home.driver.store(ORPHAN, Ordering::Relaxed);
    home.orphan.lock().unwrap_or_else(|e| e.into_inner()).0 = Some(connection);
    runtime.spawn(std::future::poll_fn(move |cx| {
        let mut orphan = home.orphan.lock().unwrap_or_else(|e| e.into_inner());
        let (connection, task) = &mut *orphan;
        let Some(polled) = connection.as_mut().map(|c| Pin::new(c).poll(cx)) else {
            // Adopted.
            return Poll::Ready(());
        };
        match polled {
            Poll::Ready(ended) => {
                if let Err(error) = ended {
                    log(&error);
                }
                *connection = None;
                Poll::Ready(())
            }
            Poll::Pending => {
                if !task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *task = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }));
}

fn log(error: &hyper::Error) {
    tracing::debug!(%error, "stormguard proxy: upstream connection ended with an error");
}

/// Serves `downstream` (a downstream connection's future) with the upstream connections its
/// requests dial polled by the same task.
pub(crate) async fn driving<F: Future>(downstream: F) -> F::Output {
    // From 1: 0 is `ORPHAN`.
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    let mut driver = Driver {
        id: NEXT.fetch_add(1, Ordering::Relaxed),
        connections: Vec::new(),
        wakers: Wakers::new(),
        task: None,
    };
    let mut downstream = std::pin::pin!(downstream);
    std::future::poll_fn(|cx| driver.poll(downstream.as_mut(), cx)).await
}

/// A downstream connection's upstream connections, and the wakers that tell which side moved.
struct Driver {
    id: usize,
    connections: Vec<(UpstreamConnection, Arc<Home>)>,
    wakers: Wakers,
    /// The runtime's waker last given to [`Shared::task`].
    task: Option<Waker>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        for (connection, home) in self.connections.drain(..) {
            orphan(connection, home);
        }
    }
}

impl Driver {
    fn poll<F: Future>(
        &mut self,
        mut downstream: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<F::Output> {
        if !self.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.task = Some(cx.waker().clone());
            *self
                .wakers
                .shared
                .task
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        }
        let wakers = &self.wakers;
        wakers.shared.polling.store(true, Ordering::SeqCst);
        for _ in 0..ROUNDS {
            if wakers.upstream.woken.swap(false, Ordering::SeqCst) {
                let mut upstream = Context::from_waker(&wakers.upstream_waker);
                self.connections.retain_mut(|(connection, _)| {
                    match Pin::new(connection).poll(&mut upstream) {
                        Poll::Ready(Ok(())) => false,
                        Poll::Ready(Err(error)) => {
                            log(&error);
                            false
                        }
                        Poll::Pending => true,
                    }
                });
            }
            if wakers.downstream.woken.swap(false, Ordering::SeqCst) {
                let mut context = Context::from_waker(&wakers.downstream_waker);
                let polled = {
                    let _outer = Restore(POLLING.with(|polling| polling.replace(Some(self.id))));
                    downstream.as_mut().poll(&mut context)
                };
                let dialled = DIALLED.with(|dialled| std::mem::take(&mut *dialled.borrow_mut()));
                if !dialled.is_empty() {
                    self.connections.extend(dialled);
                    // Not polled yet: the request just handed to it waits for that.
                    wakers.upstream.woken.store(true, Ordering::SeqCst);
                }
                if let Poll::Ready(output) = polled {
                    wakers.shared.polling.store(false, Ordering::SeqCst);
                    return Poll::Ready(output);
                }
            }
            if !wakers.any_woken() {
                wakers.shared.polling.store(false, Ordering::SeqCst);
                // A wake from another thread between the check and the store saw the task
                // polling and did not wake it: look once more.
                if !wakers.any_woken() {
                    return Poll::Pending;
                }
                wakers.shared.polling.store(true, Ordering::SeqCst);
            }
        }
        wakers.shared.polling.store(false, Ordering::SeqCst);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Puts back the downstream connection polled before, also when a poll panics: a thread
/// left marked would hand the connections other tasks dial to a poll that never comes.
struct Restore(Option<usize>);

impl Drop for Restore {
    fn drop(&mut self) {
        POLLING.with(|polling| polling.set(self.0));
    }
}

/// The two wakers of a downstream connection's task: one for its upstream connections, one
/// for the downstream connection itself.
struct Wakers {
    shared: Arc<Shared>,
    upstream: Arc<Side>,
    downstream: Arc<Side>,
    upstream_waker: Waker,
    downstream_waker: Waker,
}

impl Wakers {
    fn new() -> Wakers {
        let shared = Arc::new(Shared {
            polling: AtomicBool::new(false),
            task: Mutex::new(None),
        });
        let side = || {
            Arc::new(Side {
                // The first poll polls both.
                woken: AtomicBool::new(true),
                shared: Arc::clone(&shared),
            })
        };
        let (upstream, downstream) = (side(), side());
        Wakers {
            upstream_waker: Waker::from(Arc::clone(&upstream)),
            downstream_waker: Waker::from(Arc::clone(&downstream)),
            shared,
            upstream,
            downstream,
        }
    }

    fn any_woken(&self) -> bool {
        self.upstream.woken.load(Ordering::SeqCst) || self.downstream.woken.load(Ordering::SeqCst)
    }
}

/// What both sides share: whether the task is being polled (a wake then only marks its side),
/// and the task's own waker.
struct Shared {
    polling: AtomicBool,
    task: Mutex<Option<Waker>>,
}

/// One side's waker.
struct Side {
    woken: AtomicBool,
    shared: Arc<Shared>,
}

impl Wake for Side {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        if !self.shared.polling.load(Ordering::SeqCst) {
            let task = self.shared.task.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(task) = task.as_ref() {
                task.wake_by_ref();
            }
        }
    }
}
