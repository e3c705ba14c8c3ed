//! The breaker layer's response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;
use stormguard::breaker::{BreakerObserver, OwnedPermit};
use stormguard::classify::Classifier;

use super::BreakerError;

pin_project! {
    /// Resolves to the inner service's result, after recording its outcome and elapsed time
    /// in the breaker's window; or to the rejection. Dropped before it resolves, it abandons
    /// the call (nothing is recorded; a half-open probe slot is returned).
    pub struct ResponseFuture<F, C, T, E, O: BreakerObserver> {
        #[pin]
        kind: Kind<F, Result<T, BreakerError<E>>>,
        permit: Option<OwnedPermit<O>>,
        classifier: C,
        started: Option<Instant>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, Out> {
        Called { #[pin] future: F },
        Rejected { result: Option<Out> },
    }
}

impl<F, C, T, E, O: BreakerObserver> ResponseFuture<F, C, T, E, O> {
    pub(super) fn called(future: F, permit: OwnedPermit<O>, classifier: C) -> Self {
        let started = permit.breaker().window().clock().now();
        ResponseFuture {
            kind: Kind::Called { future },
            permit: Some(permit),
            classifier,
            started: Some(started),
        }
    }

    pub(super) fn rejected(result: Result<T, BreakerError<E>>, classifier: C) -> Self {
        ResponseFuture {
            kind: Kind::Rejected {
                result: Some(result),
            },
            permit: None,
            classifier,
            started: None,
        }
    }
}

impl<F, C, T, E, O> Future for ResponseFuture<F, C, T, E, O>
where
    F: Future<Output = Result<T, E>>,
    C: Classifier<T, E>,
    O: BreakerObserver,
{
    type Output = Result<T, BreakerError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Called { future } => {
                let result = ready!(future.poll(cx));
                if let (Some(permit), Some(started)) = (this.permit.take(), *this.started) {
                    let outcome = this.classifier.classify(&result);
                    let now = permit.breaker().window().clock().now();
                    let elapsed = now
                        .checked_duration_since(started)
                        .unwrap_or(Duration::ZERO);
                    permit.record(outcome, elapsed);
                }
                Poll::Ready(result.map_err(BreakerError::Service))
            }
            KindProj::Rejected { result } => match result.take() {
                Some(result) => Poll::Ready(result),
                // Polled after it resolved: a misuse tower's contract excludes; say so
                // instead of panicking.
                None => Poll::Pending,
            },
        }
    }
}
