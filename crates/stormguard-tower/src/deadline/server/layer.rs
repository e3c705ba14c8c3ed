//! The server layer's configuration: which headers, which policies, which bounds.

use std::sync::Arc;
use std::time::Duration;

use stormguard::deadline::{DeadlineHeaders, Selection, WallClock};
use tower_layer::Layer;

use super::stats::{ServerCounters, ServerStats};
use super::{Deadline, Shared};
use crate::deadline::error::InvalidDeadlineConfig;

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

/// What a [`DeadlineLayer`] was configured with, shared by the services it makes.
#[derive(Clone, Debug)]
pub(super) struct ServerConfig {
    pub(super) headers: DeadlineHeaders,
    pub(super) selection: Selection,
    pub(super) malformed: MalformedPolicy,
    pub(super) max: Option<Duration>,
    pub(super) default: Option<Duration>,
    pub(super) min_remaining: Duration,
    pub(super) wall: WallClock,
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
///    ([`stormguard::deadline::scope`], so [`PropagateDeadline`](crate::deadline::PropagateDeadline) and
///    the core's retrier see it) and in the request's extensions ([`IncomingDeadline`](crate::deadline::IncomingDeadline)), and
///    drops the handler's future when the deadline passes.
///
/// Refusals and cancellations are answered in the caller's protocol
/// ([`wire::Protocol::of`](crate::wire::Protocol::of)): HTTP 504; for gRPC a trailers-only
/// `DEADLINE_EXCEEDED` (HTTP 200, `grpc-status: 4`); for gRPC-Web the same trailers-only answer
/// with the request's own content type, which gRPC-Web clients read from the headers. (Behind
/// tonic-web's `GrpcWebLayer` the layer sees plain gRPC and tonic-web translates its answer;
/// in front of it, it answers gRPC-Web itself. A browser reads `grpc-status` only if the CORS
/// layer exposes it, so put this layer inside the CORS layer.) The response body type is
/// [`DeadlineBody<B>`](crate::deadline::DeadlineBody): the handler's body `B`, or the layer's own. A request without any
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
}
