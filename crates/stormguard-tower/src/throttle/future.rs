//! The throttle layer's response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use stormguard::classify::Classifier;
use stormguard::throttle::AdaptiveThrottle;

use super::ThrottleError;

pin_project! {
    /// Resolves to the inner service's result, after recording whether the backend accepted
    /// the request; or to the rejection. Dropped before it resolves, it records nothing (the
    /// request counts as not accepted).
    pub struct ResponseFuture<F, C, T, E> {
        #[pin]
        kind: Kind<F, Result<T, ThrottleError<E>>>,
        throttle: Option<Arc<AdaptiveThrottle>>,
        classifier: C,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, Out> {
        Called { #[pin] future: F },
        Rejected { result: Option<Out> },
    }
}

impl<F, C, T, E> ResponseFuture<F, C, T, E> {
    pub(super) fn called(future: F, throttle: Arc<AdaptiveThrottle>, classifier: C) -> Self {
        ResponseFuture {
            kind: Kind::Called { future },
            throttle: Some(throttle),
            classifier,
        }
    }

    pub(super) fn rejected(result: Result<T, ThrottleError<E>>, classifier: C) -> Self {
        ResponseFuture {
            kind: Kind::Rejected {
                result: Some(result),
            },
            throttle: None,
            classifier,
        }
    }
}

impl<F, C, T, E> Future for ResponseFuture<F, C, T, E>
where
    F: Future<Output = Result<T, E>>,
    C: Classifier<T, E>,
{
    type Output = Result<T, ThrottleError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Called { future } => {
                let result = ready!(future.poll(cx));
                if let Some(throttle) = this.throttle.take() {
                    throttle.record(this.classifier.classify(&result));
                }
                Poll::Ready(result.map_err(ThrottleError::Service))
            }
            KindProj::Rejected { result } => match result.take() {
                Some(result) => Poll::Ready(result),
                // Polled after it resolved: a misuse tower's contract excludes.
                None => Poll::Pending,
            },
        }
    }
}
