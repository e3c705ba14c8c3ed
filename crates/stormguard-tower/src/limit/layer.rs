//! The limit layer's configuration.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use stormguard::clock::Clock;
use stormguard::health::{InvalidConfig, Problem};
use stormguard::limit::{Limiter, LimiterConfig};
use tower_layer::Layer;

use super::queue::{QueueConfig, WaitQueue};
use super::stats::{LimitCounters, LimitStats};
use super::{AdaptiveLimit, Shared};

/// Picks a request's partition from its headers (an index into the shares given to
/// [`AdaptiveLimitBuilder::with_partitions`]).
pub type PartitionFn = Arc<dyn Fn(&HeaderMap) -> usize + Send + Sync>;

/// Server middleware that works on at most an adaptive number of requests at once and sheds
/// the rest before their handler runs (see [the module docs](super)).
///
/// All services a layer makes share one [`Limiter`]: put the layer once around the whole
/// router, inside [`DeadlineLayer`](crate::DeadlineLayer) so that it sees each request's
/// deadline.
///
/// # Default
///
/// A [`Vegas`](stormguard::limit::Vegas) limit with Netflix's defaults in 100 ms windows, a
/// queue of 32 with a CoDel target of 5 ms and interval of 100 ms (Facebook's numbers), no
/// partitions, `Retry-After: 1` (gRPC: `grpc-retry-pushback-ms: 1000`).
///
/// # Example
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use http::{Request, Response};
/// use stormguard::limit::{LimiterConfig, Vegas};
/// use stormguard_tower::limit::AdaptiveLimitLayer;
/// use tower::{Layer, ServiceExt, service_fn};
///
/// let layer = AdaptiveLimitLayer::builder(LimiterConfig::new(Vegas::new().with_limits(1, 8, 64)))
///     .with_queue(16, Duration::from_millis(5), Duration::from_millis(100))
///     .build()?;
/// let service = layer.layer(service_fn(|_req: Request<String>| async {
///     Ok::<_, std::convert::Infallible>(Response::new(String::from("done")))
/// }));
/// let response = service.oneshot(Request::new(String::new())).await?;
/// assert_eq!(response.status(), 200);
/// assert_eq!(layer.stats().admitted, 1);
/// assert_eq!(layer.limiter().in_flight(), 0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AdaptiveLimitLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for AdaptiveLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimitLayer")
            .field("limit", &self.shared.limiter.limit())
            .field("in_flight", &self.shared.limiter.in_flight())
            .field("queue", &self.shared.queue_config)
            .field("retry_after", &self.shared.retry_after)
            .finish_non_exhaustive()
    }
}

impl AdaptiveLimitLayer {
    /// A layer with the defaults around `config`'s limiter; `Err` names the first invalid
    /// field. For other settings, see [`AdaptiveLimitLayer::builder`].
    pub fn new(config: LimiterConfig) -> Result<AdaptiveLimitLayer, InvalidConfig> {
        AdaptiveLimitLayer::builder(config).build()
    }

    /// A builder for a layer around `config`'s limiter.
    pub fn builder(config: LimiterConfig) -> AdaptiveLimitBuilder {
        AdaptiveLimitBuilder {
            config,
            queue: QueueConfig {
                capacity: 32,
                target: Duration::from_millis(5),
                interval: Duration::from_millis(100),
            },
            retry_after: Duration::from_secs(1),
            partition: None,
        }
    }

    /// The shared limiter (its limit, in-flight count, expected RTT).
    pub fn limiter(&self) -> &Limiter {
        &self.shared.limiter
    }

    /// The counters so far.
    pub fn stats(&self) -> LimitStats {
        self.shared.counters.snapshot()
    }

    /// Requests waiting in the queue.
    pub fn queued(&self) -> usize {
        self.shared.queue.len()
    }
}

/// Settings of an [`AdaptiveLimitLayer`] before it is built (see [its defaults](AdaptiveLimitLayer#default)).
pub struct AdaptiveLimitBuilder {
    config: LimiterConfig,
    queue: QueueConfig,
    retry_after: Duration,
    partition: Option<PartitionFn>,
}

impl fmt::Debug for AdaptiveLimitBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimitBuilder")
            .field("config", &self.config)
            .field("queue", &self.queue)
            .field("retry_after", &self.retry_after)
            .field("partitioned", &self.partition.is_some())
            .finish()
    }
}

impl AdaptiveLimitBuilder {
    /// A queue of at most `capacity` requests waiting for a slot (0: no queue, shed at once);
    /// a request waits at most `interval`, or only `target` while the queue stands (until
    /// `interval` after a waiter was seen waiting `target` or its whole patience; served newest
    /// first); neither longer than the limiter's round trips allow (see
    /// [the queue](super#the-queue)).
    pub fn with_queue(mut self, capacity: usize, target: Duration, interval: Duration) -> Self {
        self.queue = QueueConfig {
            capacity,
            target,
            interval,
        };
        self
    }

    /// Tells shed callers to come back after `after` (`Retry-After`, rounded up to whole
    /// seconds, or `grpc-retry-pushback-ms`).
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    /// Puts each request in the partition `classify` picks: an index into the shares of
    /// [`LimiterConfig::with_partitions`]; an index without a share is admitted only under the
    /// limit.
    pub fn with_partitions(
        mut self,
        classify: impl Fn(&HeaderMap) -> usize + Send + Sync + 'static,
    ) -> Self {
        self.partition = Some(Arc::new(classify));
        self
    }

    /// Builds the layer; `Err` names the first invalid field.
    pub fn build(self) -> Result<AdaptiveLimitLayer, InvalidConfig> {
        let clock = Clock::tokio();
        let limiter = Limiter::new(self.config, &clock)?;
        if self.queue.capacity > 0 && self.queue.target.is_zero() {
            return Err(InvalidConfig {
                field: "limit.queue.target",
                problem: Problem::Zero,
            });
        }
        if self.queue.interval < self.queue.target {
            return Err(InvalidConfig {
                field: "limit.queue.interval",
                problem: Problem::LessThan("limit.queue.target"),
            });
        }
        Ok(AdaptiveLimitLayer {
            shared: Arc::new(Shared {
                queue: WaitQueue::new(self.queue),
                queue_config: self.queue,
                limiter,
                counters: LimitCounters::default(),
                retry_after: self.retry_after,
                partition: self.partition,
            }),
        })
    }
}

impl<S> Layer<S> for AdaptiveLimitLayer {
    type Service = AdaptiveLimit<S>;

    fn layer(&self, inner: S) -> AdaptiveLimit<S> {
        AdaptiveLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}
