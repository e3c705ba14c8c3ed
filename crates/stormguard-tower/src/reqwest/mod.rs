//! The [client stack](crate::client) as a [`reqwest-middleware`](reqwest_middleware)
//! middleware, for services that call out with reqwest.
//!
//! # Why the same stack and not a reqwest retry loop
//!
//! A retry loop written for one HTTP client drifts from the one written for another: one
//! retries into an open breaker, the other forgets to hand its per-try timeout downstream,
//! and their metrics disagree. [`ClientMiddleware`] is not a second implementation: it hands
//! each request to the very engine the tower [`Client`](crate::client::Client) runs — the
//! same [`EndpointPolicy`] route table (swappable while it
//! runs), the same order (call deadline → adaptive throttle → retry or hedge with the shared
//! budget → breaker per attempt → attempt deadline on the wire), the same classification,
//! the same [`Observer`] events and the same [`Fallback`](crate::client::Fallback) hook. Only
//! the last step differs: an attempt goes down the rest of the middleware chain (`Next`)
//! instead of into a tower service.
//!
//! Build it like a [`ClientLayer`]: [`ClientMiddleware::new`] for one policy,
//! [`ClientMiddleware::from_policy_file`] for a routed file, or any
//! [`ClientLayerBuilder`](crate::client::ClientLayerBuilder) (observer, fallback, seed, shared
//! budget, …) turned into a middleware with `From`. A middleware made from a layer shares
//! that layer's breakers, budgets and live policies: a hyper client and a reqwest client of
//! the same downstream can then trip, spend and swap together.
//!
//! # What each request gets
//!
//! Everything the [client stack](crate::client) documents. For reqwest in particular:
//!
//! - **Bodies**: a byte body (and a stream up to the stack's replay limit) is replayed for
//!   retries; a body known to fit is hedged; a longer stream is sent once and not retried.
//! - **Deadlines**: each attempt carries min(per-try timeout, time left) − the hop reserve in
//!   the policy's deadline headers (`grpc-timeout` by default), and runs as the task's
//!   current deadline; reqwest's own `timeout` still applies to each attempt.
//! - **Errors**: transport errors are classified by
//!   [`wire::classify_transport_error`](crate::wire::classify_transport_error), which knows
//!   reqwest's (a connect error was not sent: retryable even for a `POST`; a builder,
//!   redirect or decode error is never retried). When the last attempt failed that way, the
//!   caller gets reqwest's error unchanged. A call the stack cut or refused (per-try timeout,
//!   deadline, open breaker, throttle) is a [`client::Error`](crate::client::Error) inside
//!   `reqwest_middleware::Error::Middleware`: `downcast_ref::<client::Error>()` and ask it
//!   [`is_exhausted`](crate::client::Error::is_exhausted).
//! - **Failure responses** are returned as responses, marked `X-Retry-Exhausted: true` when
//!   the stack gave up on them.
//! - **Extensions**: each attempt runs the rest of the chain with a copy of the chain's
//!   `Extensions`; the copy the returned response came back with replaces the caller's.
//!
//! Add it last (closest to the network) unless another middleware must see every attempt.
//!
//! # Example
//!
//! ```
//! use stormguard::policy::PolicyFile;
//! use stormguard_tower::reqwest::ClientMiddleware;
//!
//! let policies = PolicyFile::from_toml(r#"
//!     [endpoints."GET /users/*"]
//!     idempotency = "idempotent"
//!     timeouts = { per_try = "300ms", overall = "1s" }
//!     budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
//!     breaker = { count = 20, minimum_throughput = 10 }
//! "#)?;
//! let users = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(ClientMiddleware::from_policy_file(&policies)?)
//!     .build();
//! # drop(users);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod next;

use std::sync::Arc;

use ::reqwest::{Request, Response};
use http::Extensions;
use reqwest_middleware::{Middleware, Next};
use stormguard::policy::{EndpointPolicy, PolicyFile};

use crate::client::{ClientLayer, Error, InvalidPolicies, Policies, Shared, call};
use crate::observe::{Observer, Telemetry};

use next::{ChainExtensions, NextService};

/// The client stack as a `reqwest-middleware` middleware; see the [module docs](self).
pub struct ClientMiddleware<O = Telemetry> {
    shared: Arc<Shared<O>>,
}

impl<O> Clone for ClientMiddleware<O> {
    fn clone(&self) -> Self {
        ClientMiddleware {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<O> std::fmt::Debug for ClientMiddleware<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientMiddleware")
            .field("policies", &self.shared.policies)
            .finish_non_exhaustive()
    }
}

impl ClientMiddleware {
    /// A middleware that calls every request by `policy` (see [`ClientLayer::new`]).
    pub fn new(policy: EndpointPolicy) -> Result<Self, InvalidPolicies> {
        ClientLayer::new(policy).map(ClientMiddleware::from)
    }

    /// A middleware that calls every request by `policy` as the endpoint `name` (see
    /// [`ClientLayer::named`]).
    pub fn named(name: &str, policy: EndpointPolicy) -> Result<Self, InvalidPolicies> {
        ClientLayer::named(name, policy).map(ClientMiddleware::from)
    }

    /// A middleware routed by `file`'s endpoints (see [`ClientLayer::from_policy_file`]).
    pub fn from_policy_file(file: &PolicyFile) -> Result<Self, InvalidPolicies> {
        ClientLayer::from_policy_file(file).map(ClientMiddleware::from)
    }
}

/// The layer's stack as a middleware, sharing its policies, budgets, breakers and observer.
impl<O> From<ClientLayer<O>> for ClientMiddleware<O> {
    fn from(layer: ClientLayer<O>) -> Self {
        ClientMiddleware {
            shared: layer.shared,
        }
    }
}

impl<O: Observer> ClientMiddleware<O> {
    /// The live policies: swap them while the middleware runs.
    pub fn policies(&self) -> &Policies<O> {
        &self.shared.policies
    }
}

#[async_trait::async_trait]
impl<O: Observer> Middleware for ClientMiddleware<O> {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let request = http::Request::<::reqwest::Body>::try_from(req)?;
        let endpoint = self.shared.endpoint(&request);
        let service = NextService::new(next, extensions);
        match call::run(Arc::clone(&self.shared), endpoint, service, request).await {
            Ok(response) => {
                let (mut head, body) = response.into_parts();
                if let Some(ChainExtensions(chain)) = head.extensions.remove() {
                    *extensions = chain;
                }
                let body = ::reqwest::Body::wrap(body);
                Ok(Response::from(http::Response::from_parts(head, body)))
            }
            Err(error) => Err(into_chain_error(error)),
        }
    }
}

/// The downstream's own error when the last attempt failed in transport; the stack's
/// [`Error`] (timed out, refused, or a transport error from elsewhere) otherwise.
fn into_chain_error(error: Error) -> reqwest_middleware::Error {
    match error {
        Error::Transport {
            attempts,
            stop,
            source,
        } => match source.downcast::<reqwest_middleware::Error>() {
            Ok(chain) => *chain,
            Err(source) => reqwest_middleware::Error::middleware(Error::Transport {
                attempts,
                stop,
                source,
            }),
        },
        error => reqwest_middleware::Error::middleware(error),
    }
}
