//! The admission layer's response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use stormguard::admission::AttemptPass;
use stormguard::classify::{Classifier, Outcome};
use stormguard::deadline::{self, Deadline};

use crate::wire::{self, BoxError};

pin_project! {
    /// Resolves to the inner service's result after finishing the attempt's pass with its
    /// health outcome, or to the refusal. Dropped before it resolves, it was either cut by
    /// the deadline it was called under (a retry layer's per-try timeout, the task's
    /// deadline), which records it [`Outcome::InDoubt`] as the core's retrier does, or
    /// abandoned by its caller, which records nothing (a half-open probe slot is given back).
    pub struct ResponseFuture<F, P: AttemptPass, C, T, E> {
        #[pin]
        state: State<F, T>,
        pass: Pending<P>,
        classifier: C,
        // Converts the inner error. A function pointer chosen in `call`, rather than an
        // `E: Into<BoxError>` bound on the `Future` impl, so that proving this future `Send`
        // inside other async blocks does not trip over the `'static` in `BoxError`.
        into_box: fn(E) -> BoxError,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, T> {
        Admitted { #[pin] future: F },
        Refused { answer: Option<Result<T, BoxError>> },
    }
}

/// An admitted attempt's pass until the attempt ends, with the deadline it was called under.
struct Pending<P: AttemptPass> {
    pass: Option<P>,
    deadline: Option<Deadline>,
}

impl<P: AttemptPass> Pending<P> {
    /// Ends the attempt: records `outcome`, or nothing (`None`: it was refused below).
    fn finish(&mut self, outcome: Option<Outcome>) {
        if let (Some(pass), Some(outcome)) = (self.pass.take(), outcome) {
            pass.finish(outcome);
        }
    }
}

impl<P: AttemptPass> Drop for Pending<P> {
    fn drop(&mut self) {
        if self.pass.is_some() && self.deadline.as_ref().is_some_and(Deadline::is_expired) {
            self.finish(Some(Outcome::InDoubt));
        }
    }
}

impl<F, P: AttemptPass, C, T, E: Into<BoxError>> ResponseFuture<F, P, C, T, E> {
    pub(super) fn admitted(future: F, pass: P, classifier: C) -> Self {
        ResponseFuture {
            state: State::Admitted { future },
            pass: Pending {
                pass: Some(pass),
                deadline: deadline::current(),
            },
            classifier,
            into_box: Into::into,
        }
    }

    pub(super) fn refused(answer: Result<T, BoxError>, classifier: C) -> Self {
        ResponseFuture {
            state: State::Refused {
                answer: Some(answer),
            },
            pass: Pending {
                pass: None,
                deadline: None,
            },
            classifier,
            into_box: Into::into,
        }
    }
}

impl<F, P, C, T, E> Future for ResponseFuture<F, P, C, T, E>
where
    F: Future<Output = Result<T, E>>,
    P: AttemptPass,
    C: Classifier<T, E>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Admitted { future } => {
                let result = ready!(future.poll(cx));
                let outcome = this.classifier.health(&result);
                // A refusal from further down (a gate or deadline check below this one, or
                // a rejection response) was never sent: the downstream said nothing.
                let mut refused_below =
                    outcome.is_failure() && this.classifier.refusal(&result).is_some();
                let result = result.map_err(*this.into_box);
                if let Err(error) = &result {
                    refused_below |= wire::refusal_of(error.as_ref()).is_some();
                }
                this.pass.finish((!refused_below).then_some(outcome));
                Poll::Ready(result)
            }
            StateProj::Refused { answer } => match answer.take() {
                Some(answer) => Poll::Ready(answer),
                // Polled after it resolved: a misuse tower's contract excludes; stay pending
                // rather than panic.
                None => Poll::Pending,
            },
        }
    }
}
