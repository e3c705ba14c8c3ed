//! A [`reqwest-middleware`](reqwest_middleware) middleware that retries with the core's
//! policy, for services that call out with reqwest.
//!
//! # Why a middleware and not a loop around `send`
//!
//! A retry loop written at each call site gets the hard parts wrong one site at a time: it
//! retries a `POST` whose first attempt timed out (and charges a card twice), it keeps
//! retrying after the caller has stopped listening, it retries a 503 that a downstream hop
//! has already retried (three layers of three tries make 27 requests), and it ignores the
//! shared retry budget that would have stopped the storm. [`RetryMiddleware`] puts one
//! [`Retrier`] — the core's policy, budget, deadline and classification — under every request
//! of a [`ClientWithMiddleware`](reqwest_middleware::ClientWithMiddleware).
//!
//! # What it does with each request
//!
//! - **Which requests may be retried after an in-doubt failure** (a timeout or a reset after
//!   the request was sent): idempotent methods (`GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`,
//!   `DELETE`), requests carrying an `Idempotency-Key` header (sent unchanged on every
//!   attempt, read by [`wire::idempotency_key`](crate::wire::idempotency_key)), and every request when the policy is declared
//!   idempotent ([`RetryPolicy::with_idempotent`](stormguard::retry::RetryPolicy::with_idempotent)).
//!   Other requests stop there ([`StopReason::NotIdempotent`]), and so they do after any
//!   failure *response* (a 503 may follow a side effect on a server behind a proxy): only a
//!   connect error, which proves the request never reached the server, is retried for every
//!   method. This is the same rule as the tower [`RetryLayer`](crate::retry::RetryLayer)'s.
//! - **Bodies**: a request whose body is a stream cannot be sent twice, so it is sent once.
//!   Byte bodies are cloned for each attempt.
//! - **Classification**: [`classify_response`] (status, `Retry-After`, `X-Retry-Exhausted`)
//!   and [`classify_error`] (connect error → retryable; timeout, reset, incomplete response →
//!   in doubt).
//! - **Time**: each attempt is bounded by `min(per-try timeout, time left)`, where the time
//!   left comes from the task's current deadline ([`stormguard::deadline::current`]); a
//!   retry is not sent when the wait plus the policy's minimum call time no longer fits
//!   ([`StopReason::DeadlineTooClose`]), and a `Retry-After` is waited out in full or not at
//!   all.
//! - **Headers**: every attempt carries `x-stormguard-attempt: N` ([`ATTEMPT`](crate::wire::ATTEMPT), 1 for
//!   the first). When it gives up after retrying, or its budget or the deadline refuses a
//!   retry, and it hands back a failed response, that response is marked
//!   `X-Retry-Exhausted: true`
//!   ([`RETRY_EXHAUSTED`](crate::wire::RETRY_EXHAUSTED)), so that a caller further
//!   up retries no more; a response that arrives carrying the mark is never retried.
//! - **What it reports**: a [`RetrySummary`] (attempts, stop reason) in the response's
//!   extensions and in the middleware chain's `Extensions`; when the last attempt timed out
//!   the error is an [`AttemptTimedOut`]. Other errors are reqwest's own, unchanged.
//!
//! Each attempt runs the rest of the chain with a copy of the chain's `Extensions`; the copy
//! the successful (or last) response came back with replaces the caller's.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use stormguard::budget::TokenBucket;
//! use stormguard::retry::{Retrier, RetryPolicy};
//! use stormguard_tower::reqwest::RetryMiddleware;
//!
//! let policy = RetryPolicy::new(3)
//!     .with_per_try_timeout(Duration::from_secs(2))
//!     .with_min_call(Duration::from_millis(50))
//!     .validate()?;
//! // One budget per downstream, shared by every client that calls it.
//! let budget = Arc::new(TokenBucket::grpc(10, 0.1)?);
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new(Retrier::new(policy).with_budget(budget)))
//!     .build();
//! # drop(client);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod classify;
mod error;

pub use classify::{classify_error, classify_response};
pub use error::AttemptTimedOut;

use ::reqwest::{Request, Response};
use http::{Extensions, HeaderValue};
use reqwest_middleware::{Middleware, Next};
use stormguard::budget::{RetryBudget, Unlimited};
use stormguard::classify::Outcome;
use stormguard::retry::{
    Attempt, Call, Failure, RandomSource, Retrier, RetryObserver, SeededRandom, StopReason,
};

use error::BodyNotReplayable;

/// Retries requests of a [`ClientWithMiddleware`](reqwest_middleware::ClientWithMiddleware)
/// with a [`Retrier`]; see the [module documentation](self) for what it does.
///
/// Add it last (closest to the network) unless another middleware must see every attempt.
#[derive(Debug)]
pub struct RetryMiddleware<B = Unlimited, O = (), R = SeededRandom> {
    retrier: Retrier<B, O, R>,
}

impl<B, O, R> RetryMiddleware<B, O, R> {
    /// Retries with `retrier`: its policy, budget, observer and jitter.
    pub fn new(retrier: Retrier<B, O, R>) -> Self {
        RetryMiddleware { retrier }
    }

    /// The retrier.
    pub fn retrier(&self) -> &Retrier<B, O, R> {
        &self.retrier
    }
}

/// How a request ended: attempts sent and why the middleware stopped.
///
/// Found in the response's extensions (`response.extensions().get::<RetrySummary>()`) and
/// in the middleware chain's `Extensions`
/// ([`execute_with_extensions`](reqwest_middleware::ClientWithMiddleware::execute_with_extensions)),
/// errors included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetrySummary {
    /// Attempts sent, the first included.
    pub attempts: u32,
    /// Why no further attempt was sent.
    pub stop: StopReason,
}

impl RetrySummary {
    /// Whether a failed response is marked `X-Retry-Exhausted: true`: the middleware retried
    /// and gave up, or its budget, the deadline or a breaker refused a retry. The rule is the
    /// tower [`RetryLayer`](crate::retry::RetryLayer)'s, so no caller further up retries.
    pub fn marks_exhausted(&self) -> bool {
        crate::client::marks_exhausted(self.stop, self.attempts)
    }
}

#[async_trait::async_trait]
impl<B, O, R> Middleware for RetryMiddleware<B, O, R>
where
    B: RetryBudget + 'static,
    O: RetryObserver + 'static,
    R: RandomSource + 'static,
    R::Rng: Send,
{
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let replayable = req.body().is_none_or(|body| body.as_bytes().is_some());
        let call = call_for(&req, replayable, self.retrier.policy().idempotent());
        let safe = call.is_retry_safe(self.retrier.policy().idempotent());
        let mut source = if replayable {
            Source::Replay(req)
        } else {
            Source::Once(Some(req))
        };
        let template = &*extensions;
        let op = |attempt: Attempt| {
            let request = source.next_request();
            let next = next.clone();
            let mut attempt_extensions = template.clone();
            async move {
                let Some(mut request) = request else {
                    return Err(reqwest_middleware::Error::middleware(BodyNotReplayable));
                };
                request
                    .headers_mut()
                    .insert(crate::wire::ATTEMPT, HeaderValue::from(attempt.number));
                let response = next.run(request, &mut attempt_extensions).await?;
                Ok((response, attempt_extensions))
            }
        };
        let classifier = |result: &Result<(Response, Extensions), reqwest_middleware::Error>| {
            let outcome = match result {
                // A response may follow a side effect: retry it only when that is safe.
                Ok((response, _)) => match classify_response(response) {
                    Outcome::Retryable | Outcome::Overloaded { .. } if !safe => Outcome::InDoubt,
                    outcome => outcome,
                },
                Err(error) => classify_error(error),
            };
            // A stream cannot be sent again, whatever the failure.
            if replayable || outcome.is_success() {
                outcome
            } else {
                Outcome::NeverRetry
            }
        };
        let report = self.retrier.run_report(call, op, classifier).await;
        let summary = RetrySummary {
            attempts: report.attempts,
            stop: report.stop,
        };
        match report.result {
            Ok((mut response, attempt_extensions)) => {
                *extensions = attempt_extensions;
                extensions.insert(summary);
                if summary.marks_exhausted() {
                    response.headers_mut().insert(
                        crate::wire::RETRY_EXHAUSTED,
                        HeaderValue::from_static("true"),
                    );
                }
                response.extensions_mut().insert(summary);
                Ok(response)
            }
            Err(Failure::Error(error)) => {
                extensions.insert(summary);
                Err(error)
            }
            Err(Failure::TimedOut(after)) => {
                extensions.insert(summary);
                Err(reqwest_middleware::Error::middleware(AttemptTimedOut {
                    after,
                    attempts: summary.attempts,
                    stop: summary.stop,
                }))
            }
            Err(Failure::Refused(refusal)) => {
                extensions.insert(summary);
                Err(reqwest_middleware::Error::middleware(refusal))
            }
        }
    }
}

/// The retrier's per-call options for `req`: retry-safe when idempotent or keyed.
fn call_for(req: &Request, replayable: bool, policy_idempotent: bool) -> Call {
    if !replayable {
        return Call::new().idempotent(false);
    }
    let call = Call::new()
        .idempotent(policy_idempotent || crate::wire::is_idempotent_method(req.method()));
    match crate::wire::idempotency_key(req.headers()) {
        Ok(Some(key)) => call.with_key(key),
        Ok(None) | Err(_) => call,
    }
}

/// Where each attempt's request comes from.
enum Source {
    /// A request with no body or a byte body: each attempt sends a clone.
    Replay(Request),
    /// A request with a stream body: only the first attempt can have it.
    Once(Option<Request>),
}

impl Source {
    fn next_request(&mut self) -> Option<Request> {
        match self {
            Source::Replay(template) => template.try_clone(),
            Source::Once(request) => request.take(),
        }
    }
}
