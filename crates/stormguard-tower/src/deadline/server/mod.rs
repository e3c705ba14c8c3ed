//! The server side: read the deadline a request announces, make it the handler's current
//! deadline, and stop the handler when it passes.
//!
//! A server that ignores its caller's deadline keeps working after nobody waits for the
//! answer, and keeps loading its own dependencies while it does. Under overload that wasted
//! work is what keeps the overload going (a queue of requests whose callers have all left).
//! So this layer refuses a request whose deadline has already passed (or leaves less than a
//! millisecond, too little to do anything useful) without running the handler at all, and drops the handler's future (cancelling everything it awaits) the moment
//! the deadline passes.
//!
//! [`DeadlineLayer`] (in `layer.rs`) holds the configuration, [`Deadline`] (here) decides per
//! request, [`ResponseFuture`] (in `future.rs`) runs the handler under the deadline, and
//! [`ServerStats`] (in `stats.rs`) counts what the layer refused or cancelled.

mod future;
mod layer;
mod stats;

pub use future::ResponseFuture;
pub use layer::{DeadlineLayer, MalformedPolicy};
pub use stats::ServerStats;

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body_util::Either;
use stormguard::clock::Clock;
use stormguard::deadline::{self, DeadlineHeader};
use tower_service::Service;

use super::reply::{DeadlineBody, ReplyForm};
use crate::wire;
use layer::ServerConfig;
use stats::ServerCounters;

/// The deadline the server layer set for a request, put into the request's extensions for
/// the handler (axum: `Extension<IncomingDeadline>`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct IncomingDeadline {
    /// The deadline the handler runs under (also its task's current deadline).
    pub deadline: deadline::Deadline,
    /// The header it came from; `None` when the request had none and the server default
    /// applied.
    pub header: Option<DeadlineHeader>,
    /// Whether the server maximum shortened what the request asked for.
    pub capped: bool,
}

/// What every service made by one layer shares: its configuration and its counters.
#[derive(Debug)]
struct Shared {
    config: ServerConfig,
    counters: Arc<ServerCounters>,
}

/// The service [`DeadlineLayer`] wraps around a handler.
#[derive(Clone, Debug)]
pub struct Deadline<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Deadline<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// The deadline the request gets, before the expiry check: `None` to pass it through.
fn effective(config: &ServerConfig, announced: Option<(DeadlineHeader, Duration)>) -> Option<Plan> {
    let (header, asked) = match (announced, config.default) {
        (Some((header, remaining)), _) => (Some(header), remaining),
        (None, Some(default)) => (None, default),
        (None, None) => return None,
    };
    let capped = config.max.is_some_and(|max| max < asked);
    let remaining = config.max.map_or(asked, |max| max.min(asked));
    Some(Plan {
        header,
        remaining,
        capped,
    })
}

struct Plan {
    header: Option<DeadlineHeader>,
    remaining: Duration,
    capped: bool,
}

impl Plan {
    /// Whether the request is refused as expired: no time left, or less than the minimum.
    fn expired(&self, min_remaining: Duration) -> bool {
        self.remaining.is_zero() || self.remaining < min_remaining
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Deadline<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    ResBody: 'static,
{
    type Response = Response<DeadlineBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let config = &shared.config;
        let reading = wire::read_deadline(
            req.headers(),
            config.headers,
            config.selection,
            &config.wall,
        );
        for error in reading.errors() {
            shared.counters.header_error(error.header());
            #[cfg(feature = "tracing")]
            tracing::debug!(header = error.header().name(), %error, "malformed deadline header");
        }
        if config.malformed == MalformedPolicy::Reject {
            if let Some(error) = reading.first_error() {
                shared.counters.rejected_malformed();
                let form = ReplyForm::of(req.headers());
                return ResponseFuture::ready(form.invalid_header(&error.to_string()));
            }
        }
        let announced = reading.found.map(|f| (f.header, f.remaining));
        let Some(plan) = effective(config, announced) else {
            return ResponseFuture::inner(self.inner.call(req));
        };
        let form = ReplyForm::of(req.headers());
        if plan.expired(config.min_remaining) {
            shared.counters.refused_expired();
            #[cfg(feature = "tracing")]
            tracing::debug!(
                remaining_ns = u64::try_from(plan.remaining.as_nanos()).unwrap_or(u64::MAX),
                "request refused: its deadline has passed or is about to"
            );
            return ResponseFuture::ready(form.deadline_exceeded());
        }
        let deadline = deadline::Deadline::after(plan.remaining, Clock::tokio());
        req.extensions_mut().insert(IncomingDeadline {
            deadline: deadline.clone(),
            header: plan.header,
            capped: plan.capped,
        });
        let handler = self.inner.call(req);
        let at = tokio::time::Instant::from_std(deadline.instant());
        let shared = Arc::clone(&self.shared);
        ResponseFuture::bounded(Box::pin(async move {
            match tokio::time::timeout_at(at, deadline::scope(deadline, handler)).await {
                Ok(result) => result.map(|response| response.map(Either::Left)),
                Err(_elapsed) => {
                    shared.counters.cancelled();
                    #[cfg(feature = "tracing")]
                    tracing::debug!("handler cancelled: the request's deadline passed");
                    Ok(form.deadline_exceeded())
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_below_the_minimum_or_nothing_left() {
        let plan = |remaining| Plan {
            header: None,
            remaining,
            capped: false,
        };
        let ms = Duration::from_millis;
        assert!(plan(Duration::ZERO).expired(Duration::ZERO));
        assert!(plan(Duration::from_nanos(1)).expired(ms(1)));
        assert!(plan(Duration::from_micros(999)).expired(ms(1)));
        assert!(!plan(ms(1)).expired(ms(1)));
        assert!(!plan(Duration::from_nanos(1)).expired(Duration::ZERO));
    }

    #[test]
    fn plan_applies_default_then_max() {
        let ms = Duration::from_millis;
        let config = ServerConfig {
            max: Some(ms(500)),
            default: Some(ms(100)),
            ..ServerConfig::default()
        };
        let plan = effective(&config, None).expect("default applies");
        assert_eq!(
            (plan.header, plan.remaining, plan.capped),
            (None, ms(100), false)
        );
        let plan = effective(&config, Some((DeadlineHeader::GrpcTimeout, ms(900))))
            .expect("header applies");
        assert_eq!(
            (plan.header, plan.remaining, plan.capped),
            (Some(DeadlineHeader::GrpcTimeout), ms(500), true)
        );
        assert!(effective(&ServerConfig::default(), None).is_none());
    }
}
