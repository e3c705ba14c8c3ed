//! The response future of the server layer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use http_body_util::Either;
use pin_project_lite::pin_project;

use crate::deadline::reply::DeadlineBody;

pub(super) type BoxedResponse<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<DeadlineBody<B>>, E>> + Send>>;

pin_project! {
    /// The response future of [`Deadline`].
    ///
    /// A request without a deadline polls the handler's future directly; a request with one
    /// runs it boxed under a timer (one allocation, because the task-scoped deadline future of
    /// the core cannot be named in a type).
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, E> {
        Ready { response: Option<Response<DeadlineBody<B>>> },
        Inner { #[pin] future: F },
        Bounded { future: BoxedResponse<B, E> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    pub(super) fn ready(response: Response<DeadlineBody<B>>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
        }
    }

    pub(super) fn inner(future: F) -> Self {
        ResponseFuture {
            state: State::Inner { future },
        }
    }

    pub(super) fn bounded(future: BoxedResponse<B, E>) -> Self {
        ResponseFuture {
            state: State::Bounded { future },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<DeadlineBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled again after completing: a caller bug; stay pending rather than panic.
                None => Poll::Pending,
            },
            StateProj::Inner { future } => future
                .poll(cx)
                .map(|result| result.map(|response| response.map(Either::Left))),
            StateProj::Bounded { future } => future.as_mut().poll(cx),
        }
    }
}
