//! Server-side adaptive concurrency and deadline-aware load shedding: keep goodput at capacity
//! when callers we do not control retry.
//!
//! # Why a server has to shed by itself
//!
//! Retry budgets and adaptive throttling protect a server only from the clients that use
//! them. A server whose callers retry blindly must protect itself, and the way it fails when
//! it does not is the metastable failure of Bronson et al. (HotOS 2021; `stormguard simulate
//! overload`): it keeps accepting work it cannot finish in time, every answer comes after its
//! caller left, every caller retries, and the overload outlives its cause. What breaks the
//! loop is to work on no more than the server can finish quickly and to refuse the rest at
//! once and cheaply, with an answer that tells well-behaved callers when to come back.
//!
//! # What the layer does, per request, before the handler runs
//!
//! 1. **Deadline first.** A request whose remaining deadline (read from the
//!    [`IncomingDeadline`] that an outer
//!    [`DeadlineLayer`](crate::DeadlineLayer) put in its extensions) is shorter than what
//!    admitted requests currently take ([`Limiter::expected_rtt`](stormguard::limit::Limiter::expected_rtt))
//!    cannot be answered in time: it is shed before it takes a slot.
//! 2. **Under the limit** ([`stormguard::limit`]: Vegas by default, or AIMD, Gradient2; one
//!    [`Limiter`] shared by every service the layer makes, with
//!    optional partitions such as 80 % guaranteed to paying traffic) it is admitted at once.
//! 3. **Otherwise it waits** in a short queue with CoDel-style patience and adaptive LIFO (see
//!    below), and is shed when the queue is full or its patience runs out; after waiting, its
//!    deadline is checked again.
//! 4. When the handler's response is ready (or the handler is cancelled, for instance by the
//!    `DeadlineLayer` when the deadline passes), the slot is given back with the request's
//!    round-trip time, and a cancellation, a 503 or a 429 counts as a drop.
//!
//! # The queue
//!
//! From Facebook's "Fail at Scale" (CoDel for RPC queues, after Nichols & Jacobson): a queue
//! absorbing a burst lets a request wait up to `interval` (100 ms); a standing queue, one
//! whose waiters are seen waiting long (their whole patience, or CoDel's `target` of 5 ms),
//! only `target`, and serves the newest waiter first (adaptive LIFO): the oldest are the
//! likeliest to have been given up on by their callers. A finished request's slot goes
//! straight to the waiter the queue picks, so no newcomer overtakes the waiters. An admitted
//! request waits about one no-load round trip at most, in front of the limit and behind it
//! together: the queue gets `2 × no-load − expected` of the limiter's round trips
//! ([`Limiter::no_load_rtt`](stormguard::limit::Limiter::no_load_rtt), known to Vegas), or
//! one expected round trip without a no-load estimate (a burst then still gets `target`):
//! waiting longer than a service time would double the latency the limit protects.
//!
//! While the round trips show a queue behind the limit, a slot that comes free is bound
//! late: the queue holds it for most of the time the request ahead still needs, then gives
//! it to the newest waiter (the queue's module docs say how long). A limit that keeps a request
//! waiting behind the limit keeps a small server busy, and binding late makes that waiter
//! one that arrived moments ago and waits a quarter of a service time instead of a whole
//! one (`tests/limit_one_worker.rs`: one worker at three times its capacity, the admitted
//! median 3.2 ms instead of 4.5 for 2.2 ms of work, the worker as busy).
//!
//! # The answer
//!
//! Shed requests are answered in the caller's protocol ([`wire::Protocol::of`](crate::wire::Protocol::of)): HTTP 503 with
//! `Retry-After`, or a trailers-only gRPC `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms`
//! (gRPC A6 server pushback). A stormguard client ([`client::ClientLayer`](crate::client::ClientLayer)) reads
//! either as overloaded and waits at least that long before a retry, or does not retry when
//! its deadline cannot wait. The response body type is
//! [`DeadlineBody<B>`](crate::deadline::DeadlineBody), as for the deadline layer.
//!
//! Counters are read with [`AdaptiveLimitLayer::stats`]; with the `metrics` feature the layer
//! emits the limit, the requests in flight, the queue delay and the shed requests by reason
//! (names in [`metric_names`](crate::metric_names)).

mod layer;
mod queue;
mod stats;

pub use layer::{AdaptiveLimitBuilder, AdaptiveLimitLayer, PartitionFn};
pub use stats::{LimitStats, ShedReason};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use http_body_util::Either;
use stormguard::classify::Outcome;
use stormguard::limit::{Limiter, Ticket};
use tokio::sync::oneshot;
use tower_service::Service;

use crate::deadline::IncomingDeadline;
use crate::deadline::reply::{DeadlineBody, ReplyForm};
use queue::{QueueConfig, WaitQueue};
use stats::LimitCounters;

/// What every service of one layer shares.
struct Shared {
    limiter: Limiter,
    queue: WaitQueue,
    queue_config: QueueConfig,
    counters: LimitCounters,
    retry_after: Duration,
    partition: Option<PartitionFn>,
}

/// The service [`AdaptiveLimitLayer`] wraps around a handler.
#[derive(Clone)]
pub struct AdaptiveLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for AdaptiveLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdaptiveLimit")
            .field("inner", &self.inner)
            .field("limit", &self.shared.limiter.limit())
            .finish_non_exhaustive()
    }
}

/// The response future of [`AdaptiveLimit`].
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<DeadlineBody<B>>, E>> + Send>>;

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// An admitted request's slot: given back with the request's RTT when the response is ready,
/// or as a drop when the handler is cancelled first.
struct Slot {
    shared: Arc<Shared>,
    ticket: Option<Ticket>,
}

impl Slot {
    fn finish(mut self, outcome: Outcome) {
        if let Some(ticket) = self.ticket.take() {
            give_back(&self.shared, ticket, Some(outcome));
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            give_back(&self.shared, ticket, Some(Outcome::InDoubt));
        }
    }
}

/// Gives a slot back, to the next waiter if there is one, or to the queue to hold until the
/// newest waiter is given it (late binding: a timer task binds it); `outcome` `None`: the
/// request did not run, and its slot's time says nothing.
fn give_back(shared: &Arc<Shared>, ticket: Ticket, outcome: Option<Outcome>) {
    if let Some(bind_at) = shared
        .queue
        .give_back(&shared.limiter, ticket, now(), outcome)
    {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let shared = Arc::clone(shared);
                runtime.spawn(async move {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(bind_at)).await;
                    shared.queue.bind(&shared.limiter, now(), bind_at);
                });
            }
            // Dropped outside a runtime: no timer to wait with, bind at once.
            Err(_) => shared.queue.bind(&shared.limiter, now(), bind_at),
        }
    }
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!(crate::metric_names::CONCURRENCY_LIMIT)
            .set(f64::from(shared.limiter.limit()));
        metrics::gauge!(crate::metric_names::CONCURRENCY_IN_FLIGHT)
            .set(f64::from(shared.limiter.in_flight()));
    }
}

/// A request's place in the queue, for as long as it waits: a slot handed to it after it
/// stopped waiting (it was shed, or its caller left) goes on to the next waiter.
struct Waiting<'a> {
    shared: &'a Arc<Shared>,
    slot: oneshot::Receiver<Ticket>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.slot.close();
        if let Ok(ticket) = self.slot.try_recv() {
            give_back(self.shared, ticket, None);
        }
    }
}

/// Whether a request with `remaining` time cannot be answered in time.
fn too_close(shared: &Shared, remaining: Option<Duration>) -> bool {
    match (remaining, shared.limiter.expected_rtt()) {
        (Some(remaining), Some(expected)) => remaining < expected,
        _ => false,
    }
}

/// How an admitted request ended, for the limiter: overloaded answers and server errors
/// from the handler count as drops.
fn outcome_of(status: StatusCode) -> Outcome {
    match status {
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
            Outcome::Overloaded { retry_after: None }
        }
        _ => Outcome::Success,
    }
}

/// Waits in the queue for a slot; `Err` is why the request is shed.
async fn wait_for_slot(
    shared: &Arc<Shared>,
    partition: usize,
    arrived: Instant,
    deadline: Option<&IncomingDeadline>,
) -> Result<Ticket, ShedReason> {
    let limiter = &shared.limiter;
    let Some(place) = shared.queue.join(limiter, arrived, partition) else {
        return Err(ShedReason::QueueFull);
    };
    let mut waiting = Waiting {
        shared,
        slot: place.slot,
    };
    // A slot given back between the refusal and joining the queue went to nobody: look again.
    // The fence orders joining (a SeqCst store of the queue's length) before this look at
    // the limiter, against a releaser's SeqCst give-back followed by its look at the length:
    // without it each side could miss the other's write and the waiter would wait out its
    // patience beside a free slot.
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    if let Ok(ticket) = limiter.try_acquire(partition, now()) {
        return Ok(ticket);
    }
    let give_up = tokio::time::Instant::from_std(arrived + place.patience);
    let ticket = match tokio::time::timeout_at(give_up, &mut waiting.slot).await {
        Ok(Ok(ticket)) => ticket,
        // The queue let the waiter go without a slot: it does not while the layer lives.
        Ok(Err(_)) => return Err(ShedReason::QueueTimeout),
        Err(_) => {
            shared.queue.gave_up(now());
            return Err(ShedReason::QueueTimeout);
        }
    };
    if too_close(shared, deadline.map(|d| d.deadline.remaining())) {
        give_back(shared, ticket, None);
        return Err(ShedReason::Deadline);
    }
    Ok(ticket)
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for AdaptiveLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<DeadlineBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        let arrived = now();
        let form = ReplyForm::of(req.headers());
        let deadline = req.extensions().get::<IncomingDeadline>().cloned();
        let partition = shared.partition.as_ref().map_or(0, |f| f(req.headers()));
        let shed = |shared: &Shared, reason: ShedReason, form: ReplyForm| {
            shared.counters.shed(reason);
            #[cfg(feature = "tracing")]
            tracing::debug!(reason = reason.label(), "request shed");
            Ok(form.overloaded(shared.retry_after, shed_message(reason)))
        };
        if too_close(&shared, deadline.as_ref().map(|d| d.deadline.remaining())) {
            let response = shed(&shared, ShedReason::Deadline, form);
            return Box::pin(std::future::ready(response));
        }
        // A slot taken here is held by a guard at once: a response future dropped before it
        // is polled still gives it back.
        let immediate = shared
            .limiter
            .try_acquire(partition, arrived)
            .ok()
            .map(|ticket| Slot {
                shared: Arc::clone(&shared),
                ticket: Some(ticket),
            });
        // The handler's future is made now (routing, no handler work) and polled only once
        // admitted.
        let handler = self.inner.call(req);
        Box::pin(async move {
            let slot = match immediate {
                Some(slot) => {
                    shared.counters.admitted(None);
                    slot
                }
                None => match wait_for_slot(&shared, partition, arrived, deadline.as_ref()).await {
                    Ok(ticket) => {
                        let waited = now().saturating_duration_since(arrived);
                        shared.counters.admitted(Some(waited));
                        Slot {
                            shared: Arc::clone(&shared),
                            ticket: Some(ticket),
                        }
                    }
                    Err(reason) => return shed(&shared, reason, form),
                },
            };
            let result = handler.await;
            match &result {
                Ok(response) => slot.finish(outcome_of(response.status())),
                Err(_) => slot.finish(Outcome::Retryable),
            }
            result.map(|response| response.map(Either::Left))
        })
    }
}

fn shed_message(reason: ShedReason) -> &'static str {
    match reason {
        ShedReason::Deadline => "shed: the deadline is shorter than the expected service time",
        ShedReason::QueueFull => "shed: over the concurrency limit",
        ShedReason::QueueTimeout => "shed: waited too long for a slot",
    }
}
