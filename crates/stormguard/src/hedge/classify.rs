//! How a hedger reads an attempt's result: its outcome, and any server pushback.

use crate::classify::{ByErrorClass, Classifier, Classify, Outcome, Pushback};

/// Turns an attempt's result into an [`Outcome`] and, optionally, a server [`Pushback`].
///
/// A classifier closure (`|r: &Result<T, E>| -> Outcome`) and
/// [`ByErrorClass`] are hedge classifiers without pushback. Any other
/// [`Classifier`] becomes one with [`WithPushback`] (give it `|_: &Result<T, E>| None` to read
/// no pushback). (A blanket implementation for every `Classifier` would collide with
/// [`WithPushback`]'s.) Pushback matters for one case the
/// outcome cannot express: gRPC A6 says a "do not retry" pushback (a negative or malformed
/// `grpc-retry-pushback-ms`) stops *further hedges* but leaves the attempts already sent
/// running, whereas a fatal status cancels them. Wrap a classifier in [`WithPushback`] (or
/// implement this trait) to tell the two apart.
///
/// A pushback with a delay ([`Pushback::RetryAfter`]) postpones the next hedge, exactly like
/// an [`Outcome::Overloaded`] with `retry_after`.
pub trait HedgeClassifier<T, E> {
    /// Classifies one attempt's result.
    fn outcome(&self, result: &Result<T, E>) -> Outcome;

    /// The server's pushback carried by the result, if any.
    fn pushback(&self, result: &Result<T, E>) -> Option<Pushback> {
        let _ = result;
        None
    }
}

impl<T, E, F> HedgeClassifier<T, E> for F
where
    F: Fn(&Result<T, E>) -> Outcome,
{
    fn outcome(&self, result: &Result<T, E>) -> Outcome {
        self(result)
    }
}

impl<T, E: Classify> HedgeClassifier<T, E> for ByErrorClass {
    fn outcome(&self, result: &Result<T, E>) -> Outcome {
        self.classify(result)
    }
}

/// A [`Classifier`] plus a function that reads pushback from a result.
///
/// ```
/// use stormguard::classify::{GrpcCode, GrpcCodeSet, Pushback, classify_grpc, parse_grpc_pushback};
/// use stormguard::hedge::{HedgeClassifier, WithPushback};
///
/// // (status, raw grpc-retry-pushback-ms) pairs, A6 non-fatal codes {UNAVAILABLE}.
/// type Reply = (GrpcCode, Option<&'static [u8]>);
/// let classifier = WithPushback::new(
///     |r: &Result<Reply, ()>| match r {
///         Ok((code, _)) => classify_grpc(*code, GrpcCodeSet::A6_DEFAULT, None),
///         Err(()) => stormguard::classify::Outcome::NeverRetry,
///     },
///     |r: &Result<Reply, ()>| r.as_ref().ok().and_then(|(_, p)| *p).map(parse_grpc_pushback),
/// );
/// let stop: Result<Reply, ()> = Ok((GrpcCode::Unavailable, Some(b"-1")));
/// assert_eq!(classifier.pushback(&stop), Some(Pushback::DoNotRetry));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct WithPushback<C, P> {
    classifier: C,
    pushback: P,
}

impl<C, P> WithPushback<C, P> {
    /// Classifies with `classifier` and reads pushback with `pushback`.
    pub const fn new(classifier: C, pushback: P) -> Self {
        WithPushback {
            classifier,
            pushback,
        }
    }
}

impl<T, E, C, P> HedgeClassifier<T, E> for WithPushback<C, P>
where
    C: Classifier<T, E>,
    P: Fn(&Result<T, E>) -> Option<Pushback>,
{
    fn outcome(&self, result: &Result<T, E>) -> Outcome {
        self.classifier.classify(result)
    }

    fn pushback(&self, result: &Result<T, E>) -> Option<Pushback> {
        (self.pushback)(result)
    }
}
