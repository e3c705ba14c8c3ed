//! The client side: hand the rest of the deadline downstream, minus what this hop keeps.
//!
//! A downstream timeout longer than the time the caller has left buys nothing: the answer
//! would arrive after nobody waits for it. So every outgoing call carries the current
//! deadline minus this hop's reserve (the time it needs afterwards to use the answer and
//! reply), and a call that would get less than the minimum useful call time is not sent at
//! all: it could not succeed, and sending it only adds load to a downstream that may be the
//! reason time ran short.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use pin_project_lite::pin_project;
use stormguard::admission::DeadlineTooClose;
use stormguard::deadline::{
    self, Deadline, DeadlineHeader, DeadlineHeaders, Reserve, Selection, WallClock,
};
use tower_layer::Layer;
use tower_service::Service;

use super::error::InvalidDeadlineConfig;
use crate::wire::{self, BoxError};

/// Probe used to tell a reserve that keeps everything: an hour is longer than any request.
const RESERVE_PROBE: Duration = Duration::from_secs(3600);

/// Counters of the client layer, read with [`PropagateDeadlineLayer::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Calls not sent because too little time was left ([`DeadlineTooClose`]).
    pub refused_too_close: u64,
}

#[derive(Debug, Default)]
struct ClientCounters {
    refused_too_close: AtomicU64,
}

#[derive(Clone, Debug)]
struct ClientConfig {
    reserve: Reserve,
    min_call: Duration,
    formats: DeadlineHeaders,
    wall: WallClock,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            reserve: Reserve::NONE,
            min_call: Duration::ZERO,
            formats: DeadlineHeaders::only(DeadlineHeader::GrpcTimeout),
            wall: WallClock::system(),
        }
    }
}

/// Client-side deadline middleware: writes the current deadline, minus this hop's reserve,
/// into each outgoing request's headers, and refuses to send a call that could not finish.
///
/// The deadline is the earlier of the task's current deadline
/// ([`stormguard::deadline::current`], set by [`DeadlineLayer`](super::DeadlineLayer) on the
/// server side or by [`stormguard::deadline::scope`]) and a [`Deadline`] in the request's
/// extensions. The layer hands downstream that deadline's [`child`](Deadline::child) for the
/// configured [`Reserve`]; a timeout already in the request's deadline headers (say tonic's
/// per-call timeout in `grpc-timeout`) can only shorten it, never extend it. It then removes
/// every deadline header from the request and writes the result in each configured format.
///
/// When the time left for downstream is zero or below the minimum useful call time, the call is
/// not sent: the inner service is not called and the error is the core's [`DeadlineTooClose`],
/// boxed (counted in [`ClientStats`] and as `stormguard_deadline_drops_total{side="client"}`).
/// It is a *refusal*, not a failure of the downstream: [`wire::refusal_of`] finds it in the
/// error's cause chain (through tonic's `Status` too), so a retrier above stops at once and a
/// breaker records nothing.
///
/// A request with no deadline at all passes through untouched.
///
/// The current deadline is task-local: put this layer *outside* anything that moves the call
/// to another task (tower's `Buffer`, tonic's `Channel` internals), so that its `call` runs in
/// the handler's task.
///
/// # Default
///
/// No reserve, a minimum useful call time of zero (only a call with no time left at all is
/// refused), writing `grpc-timeout` only, the system wall clock.
///
/// # Example
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use std::time::Duration;
/// use http::{Request, Response};
/// use stormguard::clock::Clock;
/// use stormguard::deadline::{self, Deadline, DeadlineHeader, DeadlineHeaders, Reserve};
/// use stormguard_tower::deadline::PropagateDeadlineLayer;
/// use tower::{Layer, ServiceExt, service_fn};
///
/// let layer = PropagateDeadlineLayer::new()
///     .with_reserve(Reserve::fraction(0.1)?)
///     .with_min_call(Duration::from_millis(20))
///     .with_headers(DeadlineHeaders::new(&[DeadlineHeader::GrpcTimeout, DeadlineHeader::ConnectTimeoutMs])?)
///     .validate()?;
/// // A downstream that echoes the timeout it was given.
/// let client = layer.layer(service_fn(|req: Request<()>| async move {
///     let sent = req.headers()["connect-timeout-ms"].to_str().unwrap_or_default().to_owned();
///     Ok::<_, std::convert::Infallible>(Response::new(sent))
/// }));
///
/// let request_deadline = Deadline::after(Duration::from_millis(1000), Clock::tokio());
/// let response = deadline::scope(request_deadline, client.oneshot(Request::new(()))).await?;
/// assert_eq!(response.body(), "900"); // 1000 ms minus the 10 % reserve
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct PropagateDeadlineLayer {
    config: ClientConfig,
    counters: Arc<ClientCounters>,
}

impl PropagateDeadlineLayer {
    /// The layer with the defaults (see [the type's docs](PropagateDeadlineLayer#default)).
    pub fn new() -> PropagateDeadlineLayer {
        PropagateDeadlineLayer::default()
    }

    /// Keeps `reserve` of the remaining time for this hop (a fraction, a fixed amount, or both).
    ///
    /// # Default
    ///
    /// [`Reserve::NONE`]: the whole remaining time goes downstream.
    pub fn with_reserve(mut self, reserve: Reserve) -> PropagateDeadlineLayer {
        self.config.reserve = reserve;
        self
    }

    /// Does not send a call with less than `min_call` left for it after the reserve.
    ///
    /// # Default
    ///
    /// Zero: only a call with no time left at all is refused.
    pub fn with_min_call(mut self, min_call: Duration) -> PropagateDeadlineLayer {
        self.config.min_call = min_call;
        self
    }

    /// Writes the deadline in each of these formats (and removes any other deadline header
    /// from the request).
    ///
    /// # Default
    ///
    /// `grpc-timeout` only.
    pub fn with_headers(mut self, formats: DeadlineHeaders) -> PropagateDeadlineLayer {
        self.config.formats = formats;
        self
    }

    /// Reads this host's wall-clock time from `wall` (for `x-request-deadline`).
    ///
    /// # Default
    ///
    /// [`WallClock::system`].
    pub fn with_wall_clock(mut self, wall: WallClock) -> PropagateDeadlineLayer {
        self.config.wall = wall;
        self
    }

    /// Checks the configuration: a reserve that keeps all the remaining time (a fraction of
    /// 1.0, or a fixed hour or more) would never let a call through.
    pub fn validate(self) -> Result<PropagateDeadlineLayer, InvalidDeadlineConfig> {
        if self.config.reserve.kept_from(RESERVE_PROBE) >= RESERVE_PROBE {
            return Err(InvalidDeadlineConfig::ReserveKeepsEverything);
        }
        Ok(self)
    }

    /// The counters so far, shared by every service this layer (and its clones) made.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            refused_too_close: self.counters.refused_too_close.load(Ordering::Relaxed),
        }
    }
}

impl<S> Layer<S> for PropagateDeadlineLayer {
    type Service = PropagateDeadline<S>;

    fn layer(&self, inner: S) -> PropagateDeadline<S> {
        PropagateDeadline {
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
    config: ClientConfig,
    counters: Arc<ClientCounters>,
}

/// The service [`PropagateDeadlineLayer`] wraps around a client.
#[derive(Clone, Debug)]
pub struct PropagateDeadline<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> PropagateDeadline<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// What to hand downstream for a call whose parent deadline is `parent`: the time left after
/// the reserve, shortened by any timeout already on the request.
fn downstream_remaining(
    parent: &Deadline,
    reserve: Reserve,
    existing: Option<Duration>,
) -> Duration {
    let handed = parent.child(reserve).remaining();
    existing.map_or(handed, |explicit| explicit.min(handed))
}

impl<S, B> Service<Request<B>> for PropagateDeadline<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let from_request = req.extensions().get::<Deadline>();
        let parent = deadline::with_current(|current| match (current, from_request) {
            (Some(a), Some(b)) => Some(a.clone().min(b.clone())),
            (a, b) => a.or(b).cloned(),
        });
        let Some(parent) = parent else {
            return ResponseFuture::inner(self.inner.call(req));
        };
        let config = &self.shared.config;
        let existing = wire::read_deadline(
            req.headers(),
            DeadlineHeaders::ALL,
            Selection::Earliest,
            &config.wall,
        )
        .found
        .map(|found| found.remaining);
        let remaining = downstream_remaining(&parent, config.reserve, existing);
        if remaining.is_zero() || remaining < config.min_call {
            self.shared
                .counters
                .refused_too_close
                .fetch_add(1, Ordering::Relaxed);
            #[cfg(feature = "metrics")]
            metrics::counter!(crate::metric_names::DEADLINE_DROPS, "side" => "client").increment(1);
            #[cfg(feature = "tracing")]
            tracing::debug!(
                remaining_ms = remaining.as_secs_f64() * 1e3,
                "call not sent: too little time left"
            );
            return ResponseFuture::refused(DeadlineTooClose {
                remaining,
                min_call: config.min_call,
            });
        }
        wire::write_deadline(req.headers_mut(), config.formats, remaining, &config.wall);
        ResponseFuture::inner(self.inner.call(req))
    }
}

pin_project! {
    /// The response future of [`PropagateDeadline`].
    pub struct ResponseFuture<F, E> {
        #[pin]
        state: State<F>,
        // Converts the inner error. A function pointer chosen in `call`, rather than an
        // `E: Into<BoxError>` bound on the `Future` impl, so that proving this future `Send`
        // inside other async blocks does not trip over the `'static` in `BoxError`.
        into_box: fn(E) -> BoxError,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Refused { error: Option<DeadlineTooClose> },
        Inner { #[pin] future: F },
    }
}

impl<F, E: Into<BoxError>> ResponseFuture<F, E> {
    fn refused(error: DeadlineTooClose) -> Self {
        ResponseFuture {
            state: State::Refused { error: Some(error) },
            into_box: Into::into,
        }
    }

    fn inner(future: F) -> Self {
        ResponseFuture {
            state: State::Inner { future },
            into_box: Into::into,
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F, E>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Refused { error } => match error.take() {
                Some(error) => Poll::Ready(Err(Box::new(error))),
                // Polled again after completing: a caller bug; stay pending rather than panic.
                None => Poll::Pending,
            },
            StateProj::Inner { future } => future.poll(cx).map_err(*this.into_box),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stormguard::clock::ManualClock;

    #[test]
    fn validate_rejects_a_reserve_that_keeps_everything() {
        let all = Reserve::fraction(1.0).expect("valid fraction");
        assert_eq!(
            PropagateDeadlineLayer::new()
                .with_reserve(all)
                .validate()
                .err(),
            Some(InvalidDeadlineConfig::ReserveKeepsEverything)
        );
        let hour = Reserve::fixed(RESERVE_PROBE);
        assert!(
            PropagateDeadlineLayer::new()
                .with_reserve(hour)
                .validate()
                .is_err()
        );
        let tenth = Reserve::fraction(0.1).expect("valid fraction");
        assert!(
            PropagateDeadlineLayer::new()
                .with_reserve(tenth)
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn existing_timeout_only_shortens() {
        let ms = Duration::from_millis;
        let parent = Deadline::after(ms(1000), ManualClock::new().clock());
        let reserve = Reserve::fixed(ms(100));
        assert_eq!(downstream_remaining(&parent, reserve, None), ms(900));
        assert_eq!(downstream_remaining(&parent, reserve, Some(ms(50))), ms(50));
        assert_eq!(
            downstream_remaining(&parent, reserve, Some(ms(5000))),
            ms(900)
        );
    }
}
