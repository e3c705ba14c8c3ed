//! How the hedging layer reads HTTP responses and transport errors.

use http::Response;
use std::error::Error;
use std::io;
use stormguard::classify::{Classify, Outcome, Pushback, classify_io_error, parse_grpc_pushback};
use stormguard::fault::Abort;
use stormguard::hedge::HedgeClassifier;
use tower::BoxError;

use crate::wire::classify_response_head;

/// The `grpc-retry-pushback-ms` header (gRPC A6 pushback).
const GRPC_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// The default classifier of [`HedgeLayer`](super::HedgeLayer).
///
/// - A response is classified by [`classify_response_head`]: its status, its `Retry-After`
///   (a malformed one is ignored) and `X-Retry-Exhausted: true` (a hop that already retried
///   and gave up is final).
/// - A response's `grpc-retry-pushback-ms` is A6 pushback: a delay postpones the next hedge,
///   a negative or malformed value stops hedging.
/// - An error is classified by the first [`Abort`] (an injected fault) or
///   [`io::Error`] in its source chain (an `io::Error` as "possibly sent":
///   a reset is [`Outcome::InDoubt`], a refused connection [`Outcome::Retryable`]); an error
///   with neither is [`Outcome::NeverRetry`], because retrying what is not understood is how
///   storms start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HttpClassifier;

impl<B> HedgeClassifier<Response<B>, BoxError> for HttpClassifier {
    fn outcome(&self, result: &Result<Response<B>, BoxError>) -> Outcome {
        match result {
            Ok(response) => classify_response_head(response.status(), response.headers()),
            Err(error) => classify_error(error.as_ref()),
        }
    }

    fn pushback(&self, result: &Result<Response<B>, BoxError>) -> Option<Pushback> {
        let value = result.as_ref().ok()?.headers().get(GRPC_PUSHBACK)?;
        Some(parse_grpc_pushback(value.as_bytes()))
    }
}

/// Classifies an error by the first [`Abort`] or [`io::Error`] in its source chain.
fn classify_error(error: &(dyn Error + 'static)) -> Outcome {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(abort) = error.downcast_ref::<Abort>() {
            return abort.classify();
        }
        if let Some(io) = error.downcast_ref::<io::Error>() {
            // An `io::Error` hides the error it wraps from `source()`.
            return match io.get_ref().and_then(|inner| inner.downcast_ref::<Abort>()) {
                Some(abort) => abort.classify(),
                None => classify_io_error(io.kind(), true),
            };
        }
        next = error.source();
    }
    Outcome::NeverRetry
}
