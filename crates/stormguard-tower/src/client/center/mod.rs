//! Following a policy center (feature `center`): the instance side of `stormguard center`.
//!
//! A [`CenterWatch`] keeps one server-sent event stream open to the center
//! (`GET /v1/services/{service}/watch`) and swaps every version it receives into the stack's
//! live [`Policies`] through [`Policies::swap`], the one entry point of a new policy: the
//! same validation, the same state carried over (a breaker stays open, a budget keeps its
//! tokens) as a file reload. Then it tells the center: an ACK when the version is in use, a
//! NACK with the reason when the policies were refused — the version in use stays.
//!
//! What goes wrong with a control plane is planned for:
//!
//! - **The center is down when the instance starts** (Istio proxies restarted during an
//!   outage came up with empty routes): every applied version is written to a last-good file
//!   ([`CenterWatchConfig::with_last_good`]), read at start before the center is asked.
//! - **The connection drops**: the watch reconnects after a jittered delay drawn from
//!   stormguard's own [`Backoff`] (full jitter, so a thousand instances that lost the same
//!   center do not come back in the same millisecond), resuming with `Last-Event-ID`.
//! - **The center sheds the reconnect** (503 or 429 while a restart's reconnect storm is
//!   admitted a few at a time): the next try waits at least the `Retry-After` and no poll is
//!   sent meanwhile, so a refused instance adds no load.
//! - **A snapshot is damaged on the way** (or a last-good file edited by hand): its policy
//!   must hash to its SHA-256; one that does not is NACKed with the reason, never applied.
//! - **Events are lost on the way** (a proxy that buffers streams): a conditional poll
//!   (`If-None-Match`) every [`poll_interval`](CenterWatchConfig::with_poll_interval), and
//!   after each failed connection, fetches the version if the stream did not bring it.
//!
//! Any language can follow a center with the same three calls (watch, poll, acks); see the
//! `stormguard-center` crate for the API.

mod session;
mod sse;

pub use sse::{SseError, SseEvent, SseParser};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use stormguard::backoff::{Backoff, Jitter};
use tokio::sync::watch;

use super::live::Policies;
use crate::observe::Observer;

/// Where a [`CenterWatch`] connects, as whom, and how it recovers.
///
/// # Default
///
/// No labels, no last-good file, a poll every 45 s, reconnects after an exponential backoff
/// from 100 ms to 30 s with full jitter, seeded from the operating system.
#[derive(Clone, Debug)]
pub struct CenterWatchConfig {
    pub(crate) url: String,
    pub(crate) service: String,
    pub(crate) instance: String,
    pub(crate) token: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) last_good: Option<PathBuf>,
    pub(crate) poll_interval: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) seed: Option<u64>,
    pub(crate) metrics_url: Option<String>,
    /// The NATS server and bucket to watch instead of the center's stream.
    #[cfg(feature = "center-nats")]
    pub(crate) nats: Option<(String, String)>,
}

impl CenterWatchConfig {
    /// Watch `service` at the center `url` (`http://center:7450`) as `instance`, with an
    /// `instance` token of that service.
    pub fn new(url: &str, service: &str, instance: &str, token: &str) -> CenterWatchConfig {
        CenterWatchConfig {
            url: url.trim_end_matches('/').to_owned(),
            service: service.to_owned(),
            instance: instance.to_owned(),
            token: token.to_owned(),
            labels: BTreeMap::new(),
            last_good: None,
            poll_interval: Duration::from_secs(45),
            backoff: Backoff::exponential(Duration::from_millis(100))
                .with_cap(Duration::from_secs(30))
                .with_jitter(Jitter::Full),
            seed: None,
            metrics_url: None,
            #[cfg(feature = "center-nats")]
            nats: None,
        }
    }

    /// The instance's labels (a canary can select instances by label).
    pub fn with_labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.labels = labels;
        self
    }

    /// Announce where this instance serves its Prometheus `/metrics`
    /// (`http://10.0.0.5:9100/metrics`): while the watch stream is open, the center scrapes
    /// it for its metric-driven rules. An `http` or `https` URL without credentials; the
    /// center refuses the watch (400) otherwise.
    pub fn with_metrics_url(mut self, url: &str) -> Self {
        self.metrics_url = Some(url.to_owned());
        self
    }

    /// Keep the last applied version in this file, and start from it.
    pub fn with_last_good(mut self, path: impl Into<PathBuf>) -> Self {
        self.last_good = Some(path.into());
        self
    }

    /// How often to poll the center besides the stream (30–60 s suits most).
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The delay before each reconnect (retry *n* = the *n*-th failed connection in a row).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Watch the center's NATS JetStream key-value bucket at `url` (the center's
    /// `--fanout`; its default bucket is `stormguard_policies`) instead of holding a stream
    /// to the center (feature `center-nats`). ACKs, NACKs and the poll still go to the
    /// center. The bucket carries stable versions only, and a version lower than the one in
    /// use is ignored; an instance meant for canaries watches the center.
    #[cfg(feature = "center-nats")]
    pub fn with_nats(mut self, url: &str, bucket: &str) -> Self {
        self.nats = Some((url.to_owned(), bucket.to_owned()));
        self
    }

    /// Seed the reconnect jitter (tests); by default each process draws its own.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
}

/// How a [`CenterWatch`] is doing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CenterState {
    /// The center version in use (from the center or the last-good file).
    pub applied: Option<u64>,
    /// Whether the stream is open now.
    pub connected: bool,
    /// Connections opened (the first included).
    pub connections: u64,
    /// Versions refused by [`Policies::swap`] (each NACKed).
    pub refused: u64,
    /// The last problem: a failed connection, a refused version, an ACK that did not arrive.
    pub last_error: Option<String>,
}

/// Why a watch could not start.
#[derive(Debug, thiserror::Error)]
pub enum CenterWatchError {
    /// The HTTP client could not be built.
    #[error("center client: {0}")]
    Client(#[from] reqwest::Error),
}

/// A running watch of a policy center. Dropping it stops the watch; the policies in use
/// stay.
#[derive(Debug)]
pub struct CenterWatch {
    task: tokio::task::JoinHandle<()>,
    state: watch::Receiver<CenterState>,
}

impl Drop for CenterWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CenterWatch {
    /// Applies the last-good file if there is one (a bad or missing file is recorded in
    /// the state and skipped), then follows the center on a task of the current tokio
    /// runtime.
    pub fn start<O: Observer>(
        policies: &Policies<O>,
        config: CenterWatchConfig,
    ) -> Result<CenterWatch, CenterWatchError> {
        // No idle connection kept: the stream holds one connection for good, and an ACK or
        // a poll (one per version, one every poll interval) would otherwise keep a second
        // one open on the center for each instance, doubling its sockets for nothing.
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .pool_max_idle_per_host(0)
            .build()?;
        let (sender, state) = watch::channel(CenterState::default());
        let session = session::Session::new(policies.clone(), config, client, sender);
        let task = tokio::spawn(session.run());
        Ok(CenterWatch { task, state })
    }

    /// The watch's state now.
    pub fn state(&self) -> CenterState {
        self.state.borrow().clone()
    }

    /// Waits until the state satisfies `until` (an applied version, a connection), and
    /// returns that state.
    pub async fn wait_for(&self, until: impl FnMut(&CenterState) -> bool) -> CenterState {
        let mut state = self.state.clone();
        match state.wait_for(until).await {
            Ok(state) => state.clone(),
            // The task ended (it never does unless aborted): the last state.
            Err(_) => self.state(),
        }
    }
}
