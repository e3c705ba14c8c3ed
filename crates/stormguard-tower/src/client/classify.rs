//! How the stack reads each attempt's result: once for retrying, once for health.

use http::Response;
use stormguard::admission::Refusal;
use stormguard::classify::{Classifier, GrpcCodeSet, Outcome, Pushback, parse_grpc_pushback};
use stormguard::hedge::HedgeClassifier;

use super::observer::{CallObserver, Details};
use crate::body::ReplayBody;
use crate::observe::Observer;
use crate::wire::{self, BoxError, Protocol};

/// How a transport error of the inner service is classified; see
/// [`wire::classify_transport_error`].
pub type ErrorClassifier = fn(&(dyn std::error::Error + 'static)) -> Outcome;

/// The stack's classifier for one call.
pub(super) struct CallClassifier<'a, 'b, O: Observer, B> {
    pub(super) protocol: Protocol,
    /// Whether the request may be sent again after a failure that may follow a side effect.
    pub(super) safe: bool,
    pub(super) grpc_codes: GrpcCodeSet,
    pub(super) errors: ErrorClassifier,
    pub(super) body: &'a ReplayBody<B>,
    pub(super) observer: &'a CallObserver<'b, O>,
}

impl<O: Observer, B, ResB> Classifier<Response<ReplayBody<ResB>>, BoxError>
    for CallClassifier<'_, '_, O, B>
{
    fn classify(&self, result: &Result<Response<ReplayBody<ResB>>, BoxError>) -> Outcome {
        let outcome = match result {
            Ok(response) => {
                let (outcome, grpc) = self.response(response, true);
                self.observer.record(Details {
                    status: Some(response.status()),
                    grpc,
                    error_type: None,
                });
                match outcome {
                    // An HTTP failure response may follow a side effect: retry it only when
                    // that is safe. A gRPC status in the configured set is retried for every
                    // call (A6: the server says it did not process it).
                    Outcome::Retryable | Outcome::Overloaded { .. }
                        if !self.safe && !self.protocol.is_grpc() =>
                    {
                        Outcome::InDoubt
                    }
                    outcome => outcome,
                }
            }
            Err(error) => {
                self.observer.record(Details {
                    status: None,
                    grpc: None,
                    error_type: Some(wire::error_type(error.as_ref())),
                });
                match wire::refusal_of(error.as_ref()) {
                    // Not sent: a failure whose refusal the retrier reads next.
                    Some(_) => Outcome::NeverRetry,
                    None => (self.errors)(error.as_ref()),
                }
            }
        };
        if outcome.is_failure() && !self.body.is_replayable() {
            // The body cannot be sent again.
            Outcome::NeverRetry
        } else {
            outcome
        }
    }

    fn refusal(&self, result: &Result<Response<ReplayBody<ResB>>, BoxError>) -> Option<Refusal> {
        match result {
            Ok(response) if wire::is_rejection(response.headers()) => {
                Some(wire::rejection_refusal(response.headers()))
            }
            Ok(_) => None,
            Err(error) => wire::refusal_of(error.as_ref()),
        }
    }

    fn health(&self, result: &Result<Response<ReplayBody<ResB>>, BoxError>) -> Outcome {
        match result {
            Ok(response) => self.response(response, false).0,
            Err(error) => (self.errors)(error.as_ref()),
        }
    }
}

impl<O: Observer, B> CallClassifier<'_, '_, O, B> {
    /// A response's outcome (`honour_mark`: for retrying) and its gRPC status.
    fn response<ResB>(
        &self,
        response: &Response<ReplayBody<ResB>>,
        honour_mark: bool,
    ) -> (Outcome, Option<stormguard::classify::GrpcCode>) {
        if wire::is_rejection(response.headers()) {
            return (Outcome::Retryable, None);
        }
        if !self.protocol.is_grpc() {
            let outcome = if honour_mark {
                wire::classify_response_head(response.status(), response.headers())
            } else {
                wire::health_outcome(response.status(), response.headers())
            };
            return (outcome, None);
        }
        let body = response.body();
        let trailers = if self.protocol == Protocol::Grpc {
            body.recorded_trailers()
        } else {
            None
        };
        let status = wire::grpc_status(
            response.status(),
            response.headers(),
            trailers.as_ref(),
            body.is_complete(),
        );
        let code = status.map(|(code, _)| code);
        let outcome = wire::grpc_outcome(
            status,
            response.headers(),
            trailers.as_ref(),
            self.grpc_codes,
            honour_mark,
        );
        (outcome, code)
    }
}

impl<O: Observer, B, ResB> HedgeClassifier<Response<ReplayBody<ResB>>, BoxError>
    for CallClassifier<'_, '_, O, B>
{
    fn outcome(&self, result: &Result<Response<ReplayBody<ResB>>, BoxError>) -> Outcome {
        if Classifier::refusal(self, result).is_some() {
            // A refused copy ends the hedged call: the breaker or deadline said stop.
            return Outcome::NeverRetry;
        }
        Classifier::classify(self, result)
    }

    fn pushback(&self, result: &Result<Response<ReplayBody<ResB>>, BoxError>) -> Option<Pushback> {
        let value = result.as_ref().ok()?.headers().get(wire::GRPC_PUSHBACK)?;
        Some(parse_grpc_pushback(value.as_bytes()))
    }
}
