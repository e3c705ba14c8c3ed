//! The response future: an optional delay, then the inner call or the injected answer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::Response;
use pin_project_lite::pin_project;
use stormguard::fault::Abort;
use tokio::time::{Sleep, sleep};
use tower::BoxError;
use tower_service::Service;

pin_project! {
    /// The future returned by [`Fault`](super::Fault).
    pub struct ResponseFuture<F, S, Req> {
        #[pin]
        state: State<F, S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, S, Req> {
        /// Waiting out the injected delay; then `then`.
        Delayed {
            #[pin]
            sleep: Sleep,
            then: Then<S, Req>,
        },
        /// Calling the inner service.
        Calling {
            #[pin]
            future: F,
        },
        /// Answering with the injected failure (taken once).
        Aborted {
            abort: Option<Abort>,
        },
    }
}

/// What happens after the delay.
enum Then<S, Req> {
    /// Call the (ready) service with the request; taken once.
    Call(Option<(S, Req)>),
    /// Answer with the injected failure.
    Abort(Abort),
}

impl<F, S, Req> ResponseFuture<F, S, Req> {
    pub(super) fn calling(future: F) -> Self {
        ResponseFuture {
            state: State::Calling { future },
        }
    }

    pub(super) fn aborted(abort: Abort) -> Self {
        ResponseFuture {
            state: State::Aborted { abort: Some(abort) },
        }
    }

    pub(super) fn delayed_abort(delay: Duration, abort: Abort) -> Self {
        ResponseFuture {
            state: State::Delayed {
                sleep: sleep(delay),
                then: Then::Abort(abort),
            },
        }
    }

    pub(super) fn delayed_call(delay: Duration, service: S, request: Req) -> Self {
        ResponseFuture {
            state: State::Delayed {
                sleep: sleep(delay),
                then: Then::Call(Some((service, request))),
            },
        }
    }
}

impl<F, S, Req, ResBody, E> Future for ResponseFuture<F, S, Req>
where
    S: Service<Req, Future = F>,
    F: Future<Output = Result<Response<ResBody>, E>>,
    E: Into<BoxError>,
    ResBody: Default,
{
    type Output = Result<Response<ResBody>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Delayed { sleep, then } => {
                    ready!(sleep.poll(cx));
                    let next = match then {
                        Then::Abort(abort) => State::Aborted {
                            abort: Some(*abort),
                        },
                        Then::Call(call) => match call.take() {
                            Some((mut service, request)) => State::Calling {
                                future: service.call(request),
                            },
                            None => State::Aborted { abort: None },
                        },
                    };
                    state.set(next);
                }
                StateProj::Calling { future } => {
                    return future.poll(cx).map_err(Into::into);
                }
                StateProj::Aborted { abort } => {
                    return Poll::Ready(match abort.take() {
                        Some(abort) => super::aborted(abort),
                        None => Err(PolledAfterCompletion.into()),
                    });
                }
            }
        }
    }
}

/// The future was polled again after it had completed.
#[derive(Debug, thiserror::Error)]
#[error("fault injection future polled after completion")]
struct PolledAfterCompletion;
