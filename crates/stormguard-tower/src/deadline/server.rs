//! The server side: read the deadline a request announces, make it the handler's current
//! deadline, and stop the handler when it passes.
//!
//! A server that ignores its caller's deadline keeps working after nobody waits for the
//! answer, and keeps loading its own dependencies while it does. Under overload that wasted
//! work is what keeps the overload going (a queue of requests whose callers have all left).
//! So this layer refuses a request whose deadline has already passed without running the
//! handler at all, and drops the handler's future (cancelling everything it awaits) the moment
//! the deadline passes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body_util::Either;
use pin_project_lite::pin_project;
use stormguard::clock::Clock;
use stormguard::deadline::{self, DeadlineHeader, DeadlineHeaders, Selection, WallClock};
use tower_layer::Layer;
use tower_service::Service;

use super::error::InvalidDeadlineConfig;
use super::reply::{DeadlineBody, ReplyForm};
use crate::wire;

/// The least time a request must have left to be run, unless configured otherwise.
const DEFAULT_MIN_REMAINING: Duration = Duration::from_millis(1);

/// What the server layer does with a malformed or repeated deadline header.
///
/// Either way the header is counted ([`ServerStats::malformed`], and the
/// `stormguard_deadline_header_errors_total` metric). A repeated header is read as its
/// earliest valid value ([`stormguard::deadline::read_deadline`]), so ignoring it leaves the
/// request with the most conservative of the deadlines it announced, never with none.
///
/// # Default
///
/// [`MalformedPolicy::Ignore`]: a client with a buggy header still gets served, bounded by the
/// other headers, the server default and the server maximum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MalformedPolicy {
    /// Treat a malformed value as absent (and a repeated header as its earliest valid value).
    #[default]
    Ignore,
    /// Refuse the request without running the handler: HTTP 400, or gRPC `INVALID_ARGUMENT`,
    /// with the parse error as the message.
    Reject,
}

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

/// Counters of the server layer, read with [`DeadlineLayer::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerStats {
    /// Requests refused on arrival because their deadline had already passed, or left less
    /// than the minimum time ([`DeadlineLayer::with_min_remaining`]).
    pub refused_expired: u64,
    /// Handlers cancelled because the deadline passed while they ran.
    pub cancelled: u64,
    /// Requests refused because of a malformed deadline header ([`MalformedPolicy::Reject`]).
    pub rejected_malformed: u64,
    /// Malformed or repeated deadline headers seen, whatever the policy.
    pub malformed_headers: u64,
    /// Per header, in [`DeadlineHeaders::ALL`] order.
    malformed_by_header: [u64; 4],
}

/// The position of `header` in [`DeadlineHeaders::ALL`]: the index of its counter.
fn slot(header: DeadlineHeader) -> Option<usize> {
    DeadlineHeaders::ALL.iter().position(|h| h == header)
}

impl ServerStats {
    /// Malformed or repeated values of `header` seen.
    pub fn malformed(&self, header: DeadlineHeader) -> u64 {
        slot(header)
            .and_then(|i| self.malformed_by_header.get(i))
            .copied()
            .unwrap_or(0)
    }
}

#[derive(Debug, Default)]
struct ServerCounters {
    refused_expired: AtomicU64,
    cancelled: AtomicU64,
    rejected_malformed: AtomicU64,
    malformed: [AtomicU64; 4],
}

impl ServerCounters {
    fn header_error(&self, header: DeadlineHeader) {
        if let Some(counter) = slot(header).and_then(|i| self.malformed.get(i)) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        metrics::counter!(crate::metric_names::DEADLINE_HEADER_ERRORS, "header" => header.name())
            .increment(1);
    }

    fn dropped(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(crate::metric_names::DEADLINE_DROPS, "side" => "server").increment(1);
    }

    fn snapshot(&self) -> ServerStats {
        let malformed_by_header = [0, 1, 2, 3].map(|i| {
            self.malformed
                .get(i)
                .map_or(0, |c| c.load(Ordering::Relaxed))
        });
        ServerStats {
            refused_expired: self.refused_expired.load(Ordering::Relaxed),
            cancelled: self.cancelled.load(Ordering::Relaxed),
            rejected_malformed: self.rejected_malformed.load(Ordering::Relaxed),
            malformed_headers: malformed_by_header.iter().sum(),
            malformed_by_header,
        }
    }
}

#[derive(Clone, Debug)]
struct ServerConfig {
    headers: DeadlineHeaders,
    selection: Selection,
    malformed: MalformedPolicy,
    max: Option<Duration>,
    default: Option<Duration>,
    min_remaining: Duration,
    wall: WallClock,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            headers: DeadlineHeaders::ALL,
            selection: Selection::Earliest,
            malformed: MalformedPolicy::Ignore,
            max: None,
            default: None,
            min_remaining: DEFAULT_MIN_REMAINING,
            wall: WallClock::system(),
        }
    }
}

/// Server-side deadline middleware: reads the incoming deadline, runs the handler under it,
/// and answers by itself when it cannot be met.
///
/// For each request the layer
///
/// 1. reads the deadline headers (`grpc-timeout`, `connect-timeout-ms`,
///    `x-envoy-expected-rq-timeout-ms`, `x-request-deadline`; by default the earliest wins, see
///    [`stormguard::deadline::read_deadline`]), counting malformed and repeated ones and
///    ignoring or rejecting them per [`MalformedPolicy`];
/// 2. falls back to the server default when no header announced a deadline, and caps the
///    deadline at the server maximum;
/// 3. refuses at once, without calling the handler, a request with less than the minimum time
///    left ([`with_min_remaining`](DeadlineLayer::with_min_remaining), 1 ms by default): it
///    has expired, or will have before the handler could do anything useful;
/// 4. otherwise runs the handler with the deadline as its task's current deadline
///    ([`stormguard::deadline::scope`], so [`PropagateDeadline`](super::PropagateDeadline) and
///    the core's retrier see it) and in the request's extensions ([`IncomingDeadline`]), and
///    drops the handler's future when the deadline passes.
///
/// Refusals and cancellations are answered in the caller's protocol
/// ([`wire::Protocol::of`](crate::wire::Protocol::of)): HTTP 504; for gRPC a trailers-only
/// `DEADLINE_EXCEEDED` (HTTP 200, `grpc-status: 4`); for gRPC-Web the same trailers-only answer
/// with the request's own content type, which gRPC-Web clients read from the headers. (Behind
/// tonic-web's `GrpcWebLayer` the layer sees plain gRPC and tonic-web translates its answer;
/// in front of it, it answers gRPC-Web itself. A browser reads `grpc-status` only if the CORS
/// layer exposes it, so put this layer inside the CORS layer.) The response body type is
/// [`DeadlineBody<B>`]: the handler's body `B`, or the layer's own. A request without any
/// deadline (and no server default) passes through untouched, with no timer and no allocation.
///
/// The deadline is current while the handler's *future* runs (an axum or tonic handler's
/// `async fn` body); code in an inner service's synchronous `call` runs before it is set. It
/// covers the handler producing its response (headers), not the streaming of a response body
/// afterwards. Deadlines run on tokio's clock, so the layer must run inside a
/// tokio runtime with timers enabled (axum, hyper and tonic servers are), and follows paused
/// time in tests.
///
/// With tonic, note that tonic's own server also reads `grpc-timeout` and, when its timer fires
/// first, answers `CANCELLED`; this layer adds the other headers, the server maximum, the
/// refusal of expired requests before they reach tonic's routing, the current deadline, and
/// `DEADLINE_EXCEEDED`.
///
/// # Default
///
/// All four headers in [`DeadlineHeaders::ALL`] order, [`Selection::Earliest`],
/// [`MalformedPolicy::Ignore`], no server maximum, no server default, a minimum of 1 ms left,
/// the system wall clock.
///
/// # Example
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tower::{Layer, ServiceExt, service_fn};
/// use stormguard_tower::deadline::DeadlineLayer;
///
/// let layer = DeadlineLayer::new().with_max(Duration::from_secs(30)).validate()?;
/// let service = layer.layer(service_fn(|_req: Request<String>| async {
///     // The handler runs under the caller's deadline.
///     let left = stormguard::deadline::current().map(|d| d.remaining());
///     Ok::<_, std::convert::Infallible>(Response::new(format!("{left:?}")))
/// }));
///
/// // A request whose deadline has passed, or is about to, is refused without running the
/// // handler.
/// for timeout in ["0n", "1n", "999u"] {
///     let expired = Request::builder().header("grpc-timeout", timeout).body(String::new())?;
///     let response = service.clone().oneshot(expired).await?;
///     assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
/// }
/// assert_eq!(layer.stats().refused_expired, 3);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct DeadlineLayer {
    config: ServerConfig,
    counters: Arc<ServerCounters>,
}

impl DeadlineLayer {
    /// The layer with the defaults (see [the type's docs](DeadlineLayer#default)).
    pub fn new() -> DeadlineLayer {
        DeadlineLayer::default()
    }

    /// Reads these headers, first the most preferred.
    ///
    /// # Default
    ///
    /// [`DeadlineHeaders::ALL`]: the relative formats first, then `x-request-deadline`.
    pub fn with_headers(mut self, headers: DeadlineHeaders) -> DeadlineLayer {
        self.config.headers = headers;
        self
    }

    /// Picks among several headers this way.
    ///
    /// # Default
    ///
    /// [`Selection::Earliest`]: the request stops when the first of its callers stops waiting.
    pub fn with_selection(mut self, selection: Selection) -> DeadlineLayer {
        self.config.selection = selection;
        self
    }

    /// Ignores or rejects malformed and repeated deadline headers.
    ///
    /// # Default
    ///
    /// [`MalformedPolicy::Ignore`].
    pub fn with_malformed(mut self, policy: MalformedPolicy) -> DeadlineLayer {
        self.config.malformed = policy;
        self
    }

    /// Never lets a handler run longer than `max`, whatever the request asks for.
    ///
    /// # Default
    ///
    /// No maximum: a request runs as long as its deadline allows.
    pub fn with_max(mut self, max: Duration) -> DeadlineLayer {
        self.config.max = Some(max);
        self
    }

    /// Gives a request that announces no deadline this much time.
    ///
    /// # Default
    ///
    /// None: a request without a deadline header runs without a deadline.
    pub fn with_default_timeout(mut self, timeout: Duration) -> DeadlineLayer {
        self.config.default = Some(timeout);
        self
    }

    /// Refuses, as already expired, a request with less than `min` left: the handler is not
    /// run, the caller gets 504 (gRPC `DEADLINE_EXCEEDED`), and the refusal is counted in
    /// [`ServerStats::refused_expired`].
    ///
    /// A request with a few nanoseconds or microseconds left (`grpc-timeout: 1n`, or an
    /// absolute deadline a hair away) cannot be answered in time: running it only starts work
    /// that is cancelled at once, and hands every downstream call a deadline already spent.
    /// `Duration::ZERO` refuses only a request with no time left at all.
    ///
    /// # Default
    ///
    /// 1 ms: less than any handler needs to answer, more than any rounding of a timeout that
    /// was meant to leave time.
    pub fn with_min_remaining(mut self, min: Duration) -> DeadlineLayer {
        self.config.min_remaining = min;
        self
    }

    /// Reads this host's wall-clock time from `wall` (for `x-request-deadline`).
    ///
    /// # Default
    ///
    /// [`WallClock::system`]. Tests under paused time pass one that moves with tokio's clock.
    pub fn with_wall_clock(mut self, wall: WallClock) -> DeadlineLayer {
        self.config.wall = wall;
        self
    }

    /// Checks the configuration: a maximum or default that is zero, or below the minimum
    /// time left (so that every request, or every request without a header, would be
    /// refused), or a default above the maximum, is an error naming what is wrong.
    pub fn validate(self) -> Result<DeadlineLayer, InvalidDeadlineConfig> {
        let ServerConfig {
            max,
            default,
            min_remaining,
            ..
        } = self.config;
        if max.is_some_and(|m| m.is_zero()) {
            return Err(InvalidDeadlineConfig::ZeroMax);
        }
        if default.is_some_and(|d| d.is_zero()) {
            return Err(InvalidDeadlineConfig::ZeroDefault);
        }
        if let (Some(default), Some(max)) = (default, max) {
            if default > max {
                return Err(InvalidDeadlineConfig::DefaultAboveMax { default, max });
            }
        }
        if let Some(max) = max.filter(|&m| m < min_remaining) {
            return Err(InvalidDeadlineConfig::MaxBelowMinRemaining { max, min_remaining });
        }
        if let Some(default) = default.filter(|&d| d < min_remaining) {
            return Err(InvalidDeadlineConfig::DefaultBelowMinRemaining {
                default,
                min_remaining,
            });
        }
        Ok(self)
    }

    /// The counters so far, shared by every service this layer (and its clones) made.
    pub fn stats(&self) -> ServerStats {
        self.counters.snapshot()
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            shared: Arc::new(Shared {
                config: self.config.clone(),
                counters: Arc::clone(&self.counters),
            }),
        }
    }
}

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
                shared
                    .counters
                    .rejected_malformed
                    .fetch_add(1, Ordering::Relaxed);
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
            shared.counters.dropped(&shared.counters.refused_expired);
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
                    shared.counters.dropped(&shared.counters.cancelled);
                    #[cfg(feature = "tracing")]
                    tracing::debug!("handler cancelled: the request's deadline passed");
                    Ok(form.deadline_exceeded())
                }
            }
        }))
    }
}

type BoxedResponse<B, E> =
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
    fn ready(response: Response<DeadlineBody<B>>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
        }
    }

    fn inner(future: F) -> Self {
        ResponseFuture {
            state: State::Inner { future },
        }
    }

    fn bounded(future: BoxedResponse<B, E>) -> Self {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_problem() {
        let ms = Duration::from_millis;
        assert_eq!(
            DeadlineLayer::new()
                .with_max(Duration::ZERO)
                .validate()
                .err(),
            Some(InvalidDeadlineConfig::ZeroMax)
        );
        assert_eq!(
            DeadlineLayer::new()
                .with_default_timeout(Duration::ZERO)
                .validate()
                .err(),
            Some(InvalidDeadlineConfig::ZeroDefault)
        );
        assert_eq!(
            DeadlineLayer::new()
                .with_max(ms(100))
                .with_default_timeout(ms(200))
                .validate()
                .err(),
            Some(InvalidDeadlineConfig::DefaultAboveMax {
                default: ms(200),
                max: ms(100)
            })
        );
        assert!(
            DeadlineLayer::new()
                .with_max(ms(200))
                .with_default_timeout(ms(200))
                .validate()
                .is_ok()
        );
        // Below the minimum time left: every request (or every one without a header) would be
        // refused as expired.
        assert_eq!(
            DeadlineLayer::new()
                .with_min_remaining(ms(50))
                .with_max(ms(20))
                .validate()
                .err(),
            Some(InvalidDeadlineConfig::MaxBelowMinRemaining {
                max: ms(20),
                min_remaining: ms(50)
            })
        );
        assert_eq!(
            DeadlineLayer::new()
                .with_default_timeout(Duration::from_micros(500))
                .validate()
                .err(),
            Some(InvalidDeadlineConfig::DefaultBelowMinRemaining {
                default: Duration::from_micros(500),
                min_remaining: ms(1)
            })
        );
        assert!(
            DeadlineLayer::new()
                .with_min_remaining(Duration::ZERO)
                .with_default_timeout(Duration::from_micros(500))
                .validate()
                .is_ok()
        );
    }

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
    fn stats_slots_follow_the_header_list() {
        let headers = [
            DeadlineHeader::GrpcTimeout,
            DeadlineHeader::ConnectTimeoutMs,
            DeadlineHeader::EnvoyExpectedRqTimeoutMs,
            DeadlineHeader::RequestDeadline,
        ];
        let slots: Vec<_> = headers.iter().map(|&h| slot(h)).collect();
        assert_eq!(slots, [Some(0), Some(1), Some(2), Some(3)]);
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
