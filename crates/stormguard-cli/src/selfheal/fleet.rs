//! The users' side: client instances of the web service, each the one client stack
//! (`stormguard_tower::client`) in front of a hyper client, following the policy center.
//!
//! Each instance is what a real one would be: the stack built from the service's policy
//! file, the backup source installed as its fallback (asked only when the endpoint's
//! policy's `fallback` allows it), a [`CenterWatch`] that swaps in every version the center
//! publishes and ACKs it, and its own `/metrics` (the stack's counters in the Prometheus
//! text format) for the center to scrape. The instances share a process here, so each
//! records into its own Prometheus recorder ([`InstanceMetrics`]) rather than the process's
//! global one: scraping one instance reads that instance's calls only, as across processes.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};
use stormguard::admission::Refusal;
use stormguard::breaker::StateChange;
use stormguard::policy::PolicyFile;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::{
    CenterWatch, CenterWatchConfig, Client, ClientLayerBuilder, FALLBACK_HEADER, Fallback,
    FallbackFuture, FallbackRequest,
};
use stormguard_tower::metric_names::{ATTEMPT_DURATION, ATTEMPT_DURATION_BUCKETS};
use stormguard_tower::observe::{
    AttemptEnd, AttemptStart, CallEnd, CallInfo, FallbackReason, HedgeEvent, Observer, Telemetry,
};
use stormguard_tower::wire::REQUEST_ID;
use tokio::task::JoinHandle;
use tower::{Layer, ServiceExt};

use super::servers::{PlainClient, Serving, fetch, plain_client, serve};
use super::timeline::{Answer, Mark, Request as Seen, Timeline};

/// The center's service name of the clients.
pub(crate) const SERVICE: &str = "web";

/// How long a starting instance may take to receive and apply the center's first version.
const FIRST_VERSION_WITHIN: Duration = Duration::from_secs(30);

/// The stack's observer in each instance: its metrics into its own recorder, its calls
/// into the demo's record.
type Observed = (InstanceMetrics, Tap);

type Transport = HyperClient<HttpConnector, ReplayBody<Full<Bytes>>>;

/// The stack's metrics ([`Telemetry`]) recorded into one instance's own Prometheus
/// recorder instead of the process's global one.
pub(crate) struct InstanceMetrics {
    recorder: Arc<PrometheusRecorder>,
}

impl InstanceMetrics {
    fn record(&self, f: impl FnOnce()) {
        metrics::with_local_recorder(&*self.recorder, f);
    }
}

impl Observer for InstanceMetrics {
    fn attempt_started(&self, call: &CallInfo<'_>, attempt: &AttemptStart) {
        self.record(|| Telemetry.attempt_started(call, attempt));
    }
    fn attempt_ended(&self, call: &CallInfo<'_>, attempt: &AttemptEnd) {
        self.record(|| Telemetry.attempt_ended(call, attempt));
    }
    fn call_finished(&self, call: &CallInfo<'_>, end: &CallEnd) {
        self.record(|| Telemetry.call_finished(call, end));
    }
    fn budget_refused(&self, call: &CallInfo<'_>) {
        self.record(|| Telemetry.budget_refused(call));
    }
    fn refused(&self, call: &CallInfo<'_>, refusal: &Refusal) {
        self.record(|| Telemetry.refused(call, refusal));
    }
    fn breaker_changed(&self, endpoint: &str, change: &StateChange) {
        self.record(|| Telemetry.breaker_changed(endpoint, change));
    }
    fn hedge(&self, call: &CallInfo<'_>, event: HedgeEvent) {
        self.record(|| Telemetry.hedge(call, event));
    }
    fn fallback(&self, call: &CallInfo<'_>, reason: FallbackReason) {
        self.record(|| Telemetry.fallback(call, reason));
    }
}

/// Hands each finished call's attempt count to the record, by its request's id.
pub(crate) struct Tap {
    timeline: Arc<Timeline>,
}

impl Observer for Tap {
    fn call_finished(&self, call: &CallInfo<'_>, end: &CallEnd) {
        if let Some(id) = call.request_id {
            self.timeline.call_ended(id, end.attempts);
        }
    }
}

/// The fallback: the same image from the backup source.
struct Backup {
    url: String,
    client: PlainClient,
}

impl Fallback for Backup {
    fn answer(&self, request: &FallbackRequest<'_>) -> FallbackFuture {
        let url = format!("{}{}", self.url, request.head.uri.path());
        let client = self.client.clone();
        Box::pin(async move {
            let (status, body) = fetch(&client, &url).await?;
            let mut response = Response::new(body);
            *response.status_mut() = status;
            Some(response)
        })
    }
}

/// Where the instances connect and how many there are.
#[derive(Clone, Debug)]
pub(crate) struct FleetConfig {
    /// The center, `http://127.0.0.1:PORT`.
    pub(crate) center: String,
    /// One `instance` token per instance (the center's role for watchers).
    pub(crate) tokens: Vec<String>,
    /// The backup source their fallback calls.
    pub(crate) backup: String,
    /// Seeds the jitter: instance *i* draws from `seed + i`.
    pub(crate) seed: u64,
}

/// One running client instance.
pub(crate) struct Instance {
    client: Client<Transport, Observed>,
    watch: Arc<CenterWatch>,
    _metrics: Serving,
    follow: JoinHandle<()>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.follow.abort();
    }
}

/// The running instances and their request loops.
pub(crate) struct Fleet {
    instances: Vec<Arc<Instance>>,
    loops: Vec<JoinHandle<()>>,
}

impl Fleet {
    /// Starts one instance per token from `policy` (the version the center publishes first
    /// arrives over the watch) and waits until each runs a center version.
    pub(crate) async fn start(
        config: &FleetConfig,
        policy: &PolicyFile,
        timeline: &Arc<Timeline>,
    ) -> Result<Fleet, String> {
        let mut instances = Vec::new();
        for (index, token) in config.tokens.iter().enumerate() {
            let instance = Instance::start(index, token, config, policy, timeline).await?;
            instances.push(Arc::new(instance));
        }
        for (index, instance) in instances.iter().enumerate() {
            let applied = instance.watch.wait_for(|s| s.applied.is_some());
            if tokio::time::timeout(FIRST_VERSION_WITHIN, applied)
                .await
                .is_err()
            {
                let state = instance.watch.state();
                return Err(format!(
                    "{SERVICE}-{} did not run the center's first version within {:?}: {}",
                    index + 1,
                    FIRST_VERSION_WITHIN,
                    state.last_error.as_deref().unwrap_or("no error seen")
                ));
            }
        }
        Ok(Fleet {
            instances,
            loops: Vec::new(),
        })
    }

    /// Starts every instance's users: `rate` requests per second each, until
    /// [`stop`](Self::stop).
    pub(crate) fn start_users(&mut self, cdn: &str, rate: f64, timeline: &Arc<Timeline>) {
        let period = Duration::from_secs_f64(1.0 / rate.max(0.001));
        for (index, instance) in self.instances.iter().enumerate() {
            let instance = Arc::clone(instance);
            let timeline = Arc::clone(timeline);
            let cdn = cdn.to_owned();
            self.loops.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                let mut n = 0u64;
                loop {
                    tick.tick().await;
                    n += 1;
                    let id = format!("{}-{n}", index + 1);
                    let url = format!("{cdn}/img/{id}.jpg");
                    tokio::spawn(
                        instance
                            .clone()
                            .user_request(id, url, Arc::clone(&timeline)),
                    );
                }
            }));
        }
    }

    /// Resolves once every instance runs `version` (`false`: a watch ended first).
    #[cfg(test)]
    pub(crate) fn every_instance_runs(
        &self,
        version: u64,
    ) -> impl std::future::Future<Output = bool> + Send + 'static {
        let watches: Vec<_> = self
            .instances
            .iter()
            .map(|i| Arc::clone(&i.watch))
            .collect();
        async move {
            for watch in watches {
                let state = watch.wait_for(|s| s.applied == Some(version)).await;
                if state.applied != Some(version) {
                    return false;
                }
            }
            true
        }
    }

    /// Stops sending new requests (those in flight finish on their own).
    pub(crate) fn stop(&mut self) {
        for task in self.loops.drain(..) {
            task.abort();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Instance {
    async fn start(
        index: usize,
        token: &str,
        config: &FleetConfig,
        policy: &PolicyFile,
        timeline: &Arc<Timeline>,
    ) -> Result<Instance, String> {
        let name = format!("{SERVICE}-{}", index + 1);
        // Bucket counts, not the exporter's default summary: a summary's P99 is over its
        // own rolling minute and reads 0 when the window is empty.
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(ATTEMPT_DURATION.to_owned()),
                ATTEMPT_DURATION_BUCKETS,
            )
            .map_err(|e| format!("{name}: attempt-duration buckets: {e}"))?
            .build_recorder();
        let recorder = Arc::new(recorder);
        metrics::with_local_recorder(&*recorder, stormguard_tower::observe::describe_metrics);
        let handle = recorder.handle();
        let metrics = serve(Router::new().route(
            "/metrics",
            get(move || {
                let text = handle.render();
                async move { text }
            }),
        ))
        .await?;
        let observer = (
            InstanceMetrics { recorder },
            Tap {
                timeline: Arc::clone(timeline),
            },
        );
        let layer = ClientLayerBuilder::routes(policy)
            .with_observer(observer)
            .with_fallback(Backup {
                url: config.backup.clone(),
                client: plain_client(),
            })
            .with_seed(config.seed.wrapping_add(index as u64))
            .build()
            .map_err(|e| format!("the clients' policy: {e}"))?;
        let transport: Transport = HyperClient::builder(TokioExecutor::new()).build_http();
        let client = layer.layer(transport);
        let metrics_url = format!("{}/metrics", metrics.url);
        // The center scrapes this URL while the watch's stream is open.
        let watch = CenterWatchConfig::new(&config.center, SERVICE, &name, token)
            .with_metrics_url(&metrics_url)
            .with_seed(config.seed.wrapping_add(index as u64));
        let watch = Arc::new(
            CenterWatch::start(layer.policies(), watch)
                .map_err(|e| format!("{name} cannot follow the center: {e}"))?,
        );
        let follow = tokio::spawn(mark_versions(
            index,
            Arc::clone(&watch),
            Arc::clone(timeline),
        ));
        Ok(Instance {
            client,
            watch,
            _metrics: metrics,
            follow,
        })
    }

    /// One user's request `id` for the image at `url`, recorded when it ends.
    async fn user_request(self: Arc<Self>, id: String, url: String, timeline: Arc<Timeline>) {
        let at = timeline.now();
        let version = self.watch.state().applied;
        let request = Request::get(url)
            .header(REQUEST_ID, &id)
            .body(Full::new(Bytes::new()));
        let answer = match request {
            Ok(request) => match self.client.clone().oneshot(request).await {
                Ok(response) if response.status() == StatusCode::OK => {
                    if response.headers().contains_key(FALLBACK_HEADER) {
                        Answer::Backup
                    } else {
                        Answer::Cdn
                    }
                }
                _ => Answer::Error,
            },
            Err(_) => Answer::Error,
        };
        timeline.request(Seen {
            at,
            version,
            answer,
            attempts: timeline.take_attempts(&id),
        });
    }
}

/// Marks each version `watch` applies, when it applies it.
async fn mark_versions(instance: usize, watch: Arc<CenterWatch>, timeline: Arc<Timeline>) {
    let mut last = None;
    loop {
        let state = watch.wait_for(|s| s.applied != last).await;
        if state.applied == last {
            return; // the watch ended
        }
        last = state.applied;
        if let Some(version) = last {
            timeline.mark(Mark::Applied { instance, version });
        }
    }
}
