//! The risk service (a fault-injecting stand-in) and the client that calls it.
//!
//! # The client
//!
//! The risk check is the one dependency retried here, and it is retried by the product, not
//! by a loop of our own: a reqwest client with stormguard-tower's [`ClientMiddleware`] built
//! from the `risk-check` [`EndpointPolicy`] — two retries, 300 ms then 600 ms (jittered), a
//! token bucket shared by every callback (so a risk outage costs the risk service at most the
//! bucket's headroom in retries instead of tripling its load), each attempt bounded by
//! `min(per-try timeout, what is left of the callback's deadline)` and that bound written on
//! the wire, and no retry when the deadline cannot fit another wait plus a minimum call.
//! Every attempt carries its number in [`ATTEMPT`] (`x-stormguard-attempt`), which is how the
//! harness measures the retry rate from the risk service's side.
//!
//! What the stack does is observed twice: [`Telemetry`] gives the stack's own metrics and
//! spans (endpoint `risk-check`), and a [`CheckLog`] keeps each check's attempts by request
//! id, so that when the stack gives up, [`RiskClient::check`] returns the whole attempt
//! history, which the handler logs and answers with `500` and `X-Retry-Exhausted: true`: the
//! platform redelivers on its own schedule, and nobody upstream retries again.
//!
//! # The service
//!
//! [`RiskServer`] answers `POST /risk/check` with `200` or, as told by its [`RiskFaults`],
//! with `503` at a seeded failure rate, after a seeded extra latency, or always while "down"
//! (or, with [`RiskFaults::set_hanging`], never: it holds every request open).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::BoxError;
use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use reqwest_middleware::ClientWithMiddleware;
use stormguard::fault::{Abort, FaultConfig, FaultInjector, Latency};
use stormguard::policy::EndpointPolicy;
use stormguard::retry::StopReason;
use stormguard_tower::client::{ClientLayerBuilder, InvalidPolicies};
use stormguard_tower::fault::FaultLayer;
use stormguard_tower::observe::{AttemptEnd, AttemptStart, CallEnd, CallInfo, Observer, Telemetry};
use stormguard_tower::reqwest::ClientMiddleware;
use stormguard_tower::wire::{ATTEMPT, REQUEST_ID};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::ServiceBuilder;

use crate::callback::PaymentCallback;

/// The dependency label of the risk service in metrics and logs.
pub const DEPENDENCY: &str = "risk-check";

// ---------------------------------------------------------------------------------------
// The service
// ---------------------------------------------------------------------------------------

/// What the risk service does wrong, changeable while it runs, and what it saw.
///
/// Three seeded [`FaultInjector`]s, each served by a stormguard-tower [`FaultLayer`]: an
/// extra latency on every request, `503` at a failure rate, and an outage switch that
/// answers every request with `503` while it is on.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use stormguard_payment_callback::risk::RiskFaults;
///
/// let faults = RiskFaults::new(7).with_failure_rate(0.12).with_latency(Duration::from_millis(5), Duration::from_millis(40));
/// faults.set_down(true);
/// assert!(faults.is_down());
/// ```
#[derive(Debug)]
pub struct RiskFaults {
    seed: u64,
    latency: Arc<FaultInjector>,
    failures: Arc<FaultInjector>,
    outage: Arc<FaultInjector>,
    hanging: AtomicBool,
    stats: RiskStats,
}

/// Requests the risk service saw.
#[derive(Debug, Default)]
pub struct RiskStats {
    requests: AtomicU64,
    retries: AtomicU64,
    failed: AtomicU64,
    requests_while_down: AtomicU64,
    retries_while_down: AtomicU64,
    in_flight: AtomicU64,
    peak_in_flight_while_down: AtomicU64,
}

/// A snapshot of [`RiskStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RiskCounts {
    /// Requests received, retries included.
    pub requests: u64,
    /// Requests whose attempt number was above 1.
    pub retries: u64,
    /// Requests answered with a failure.
    pub failed: u64,
    /// Requests received while down.
    pub requests_while_down: u64,
    /// Retries received while down.
    pub retries_while_down: u64,
    /// The most requests in flight at once while down.
    pub peak_in_flight_while_down: u64,
}

impl RiskCounts {
    /// Retries as a share of all requests: with every failure retried once it equals the
    /// failure rate.
    pub fn retry_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.retries as f64 / self.requests as f64
        }
    }

    /// Logical checks (first attempts).
    pub fn first_attempts(&self) -> u64 {
        self.requests - self.retries
    }
}

impl RiskFaults {
    /// A healthy service whose later faults draw from `seed`.
    pub fn new(seed: u64) -> Self {
        RiskFaults {
            seed,
            latency: injector(FaultConfig::new(seed)),
            failures: injector(FaultConfig::new(seed ^ 0x9e37).with_abort(0.0, UNAVAILABLE)),
            outage: injector(
                FaultConfig::new(seed ^ 0x7f4a)
                    .with_abort(1.0, UNAVAILABLE)
                    .with_enabled(false),
            ),
            hanging: AtomicBool::new(false),
            stats: RiskStats::default(),
        }
    }

    /// Fails this share of requests (0.0 to 1.0) with `503`.
    pub fn with_failure_rate(self, rate: f64) -> Self {
        self.set_failure_rate(rate);
        self
    }

    /// Adds a uniformly drawn latency in `min..max` to every request.
    pub fn with_latency(mut self, min: Duration, max: Duration) -> Self {
        let latency = Latency::Uniform {
            min,
            max: max.max(min),
        };
        self.latency = injector(FaultConfig::new(self.seed).with_latency(1.0, latency));
        self
    }

    /// Changes the failure rate (clamped to 0.0..=1.0; NaN means 0).
    pub fn set_failure_rate(&self, rate: f64) {
        let rate = if rate.is_nan() {
            0.0
        } else {
            rate.clamp(0.0, 1.0)
        };
        // In range after clamping, so the injector accepts it.
        let _ = self.failures.set_abort_rate(rate);
    }

    /// Switches "down" (every request answered `503`) on or off.
    pub fn set_down(&self, down: bool) {
        if down {
            self.outage.enable();
        } else {
            self.outage.disable();
        }
    }

    /// Switches "hanging" (every request held open, never answered) on or off.
    pub fn set_hanging(&self, hanging: bool) {
        self.hanging.store(hanging, Ordering::SeqCst);
    }

    /// Whether the service is down.
    pub fn is_down(&self) -> bool {
        self.outage.is_enabled()
    }

    /// What the service has seen so far.
    pub fn counts(&self) -> RiskCounts {
        let s = &self.stats;
        RiskCounts {
            requests: s.requests.load(Ordering::SeqCst),
            retries: s.retries.load(Ordering::SeqCst),
            failed: s.failed.load(Ordering::SeqCst),
            requests_while_down: s.requests_while_down.load(Ordering::SeqCst),
            retries_while_down: s.retries_while_down.load(Ordering::SeqCst),
            peak_in_flight_while_down: s.peak_in_flight_while_down.load(Ordering::SeqCst),
        }
    }
}

/// The risk service's failure answer.
const UNAVAILABLE: Abort = Abort::Status {
    status: 503,
    retry_after: None,
};

/// An injector from a configuration that is valid by construction: rates of 0 or 1 (the
/// failure rate is clamped before it is set), status 503, a uniform range never reversed.
fn injector(config: FaultConfig) -> Arc<FaultInjector> {
    Arc::new(
        FaultInjector::new(config).expect("risk fault configurations are valid by construction"),
    )
}

/// Decrements the in-flight count when a request ends, however it ends.
struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

// The risk service's own bookkeeping, outside its fault layers: which attempt each request
// is, whether the service was down, how many answers were failures.
async fn count_requests(
    State(faults): State<Arc<RiskFaults>>,
    req: Request,
    next: Next,
) -> Response {
    let s = &faults.stats;
    let attempt: u32 = req
        .headers()
        .get(ATTEMPT)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let down = faults.is_down();
    s.requests.fetch_add(1, Ordering::SeqCst);
    if attempt > 1 {
        s.retries.fetch_add(1, Ordering::SeqCst);
    }
    let now_in_flight = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _in_flight = InFlight(&s.in_flight);
    if down {
        s.requests_while_down.fetch_add(1, Ordering::SeqCst);
        if attempt > 1 {
            s.retries_while_down.fetch_add(1, Ordering::SeqCst);
        }
        s.peak_in_flight_while_down
            .fetch_max(now_in_flight, Ordering::SeqCst);
    }
    if faults.hanging.load(Ordering::SeqCst) {
        // Held open until the caller gives up (or the server stops).
        std::future::pending::<()>().await;
    }
    let response = next.run(req).await;
    if response.status() == StatusCode::SERVICE_UNAVAILABLE {
        s.failed.fetch_add(1, Ordering::SeqCst);
    }
    response
}

async fn check_handler() -> &'static str {
    "{\"verdict\":\"pass\"}"
}

/// A running risk service on 127.0.0.1.
#[derive(Debug)]
pub struct RiskServer {
    addr: SocketAddr,
    faults: Arc<RiskFaults>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl RiskServer {
    /// Starts the service on an ephemeral port of 127.0.0.1.
    pub async fn start(faults: Arc<RiskFaults>) -> std::io::Result<RiskServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/risk/check", post(check_handler))
            // Latency first, then the outage switch, then the failure rate; the bookkeeping
            // around them all. Only injected resets would be errors, and none are configured.
            .layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(|error: BoxError| async move {
                        (StatusCode::SERVICE_UNAVAILABLE, error.to_string())
                    }))
                    .layer(FaultLayer::new(faults.latency.clone()))
                    .layer(FaultLayer::new(faults.outage.clone()))
                    .layer(FaultLayer::new(faults.failures.clone())),
            )
            .layer(middleware::from_fn_with_state(
                faults.clone(),
                count_requests,
            ));
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = rx.await;
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "risk service stopped");
            }
        });
        Ok(RiskServer {
            addr,
            faults,
            shutdown: Some(tx),
            task,
        })
    }

    /// The check URL to give the client.
    pub fn url(&self) -> String {
        format!("http://{}/risk/check", self.addr)
    }

    /// Its faults and counters.
    pub fn faults(&self) -> &Arc<RiskFaults> {
        &self.faults
    }

    /// Stops it (connections in flight are dropped).
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.task.abort();
        let _ = self.task.await;
    }
}

// ---------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------

/// One attempt of a risk check, as logged when the retries are exhausted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRecord {
    /// 1 for the first attempt.
    pub number: u32,
    /// When it started, after the first attempt started.
    pub started: Duration,
    /// How long it took.
    pub took: Duration,
    /// What came back: `status 503`, `transport error: connection_refused`, `cut by the
    /// per-try timeout`.
    pub result: String,
}

/// The risk check did not pass: the client stack gave up.
#[derive(Clone, Debug, thiserror::Error)]
#[error("risk check gave up after {attempts} attempt(s) ({}): {last}", reason.label())]
pub struct RiskExhausted {
    /// Why it stopped.
    pub reason: StopReason,
    /// Attempts sent.
    pub attempts: u32,
    /// The last failure.
    pub last: String,
    /// Every attempt, in order.
    pub history: Vec<AttemptRecord>,
}

impl RiskExhausted {
    /// The history on one line for the log: `#1 +0ms 31ms status 503; #2 +331ms …`.
    pub fn history_line(&self) -> String {
        self.history
            .iter()
            .map(|a| {
                format!(
                    "#{} +{}ms {}ms {}",
                    a.number,
                    a.started.as_millis(),
                    a.took.as_millis(),
                    a.result
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Building the client failed.
#[derive(Debug, thiserror::Error)]
pub enum RiskClientError {
    /// The HTTP client could not be built.
    #[error("building the risk HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// The policy cannot drive the client stack.
    #[error("the risk-check policy: {0}")]
    Policy(#[from] InvalidPolicies),
}

/// What the client stack reported about each risk check in flight, by request id: the
/// attempts (for the history line) and how the check ended. The stack's own metrics, spans
/// and log events come from [`Telemetry`], beside it.
#[derive(Debug, Default)]
pub struct CheckLog {
    checks: Mutex<HashMap<String, Check>>,
}

/// One check's story.
#[derive(Debug, Default)]
struct Check {
    origin: Option<Instant>,
    attempts: Vec<AttemptRecord>,
    end: Option<CallEnd>,
}

impl CheckLog {
    fn with_check(&self, call: &CallInfo<'_>, f: impl FnOnce(&mut Check)) {
        let Some(id) = call.request_id else { return };
        if let Ok(mut checks) = self.checks.lock() {
            f(checks.entry(id.to_owned()).or_default());
        }
    }

    fn take(&self, id: &str) -> Check {
        self.checks
            .lock()
            .ok()
            .and_then(|mut checks| checks.remove(id))
            .unwrap_or_default()
    }
}

impl Observer for CheckLog {
    fn attempt_started(&self, call: &CallInfo<'_>, attempt: &AttemptStart) {
        let now = Instant::now();
        self.with_check(call, |check| {
            let origin = *check.origin.get_or_insert(now);
            check.attempts.push(AttemptRecord {
                number: attempt.number,
                started: now.duration_since(origin),
                took: Duration::ZERO,
                // Until it ends: an attempt dropped with the whole check never does.
                result: "cancelled".to_owned(),
            });
        });
    }

    fn attempt_ended(&self, call: &CallInfo<'_>, attempt: &AttemptEnd) {
        self.with_check(call, |check| {
            let Some(record) = check
                .attempts
                .iter_mut()
                .rfind(|r| r.number == attempt.number)
            else {
                return;
            };
            record.took = attempt.elapsed;
            record.result = match (attempt.timed_out, attempt.status, attempt.error_type) {
                (true, _, _) => "cut by the per-try timeout".to_owned(),
                (false, Some(status), _) => format!("status {}", status.as_u16()),
                (false, None, Some(kind)) => format!("transport error: {kind}"),
                (false, None, None) => attempt.outcome.label().to_owned(),
            };
        });
    }

    fn call_finished(&self, call: &CallInfo<'_>, end: &CallEnd) {
        self.with_check(call, |check| check.end = Some(*end));
    }
}

/// Forgets a check's story however the check ends (the business deadline may drop it).
struct Forget<'a> {
    log: &'a CheckLog,
    id: &'a str,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        drop(self.log.take(self.id));
    }
}

/// Calls the risk service through the client stack, under the `risk-check` policy.
pub struct RiskClient {
    http: ClientWithMiddleware,
    url: String,
    log: Arc<CheckLog>,
    checks: AtomicU64,
}

impl std::fmt::Debug for RiskClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RiskClient")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl RiskClient {
    /// A client for `url` under `policy` (its connect timeout on the connection; its per-try
    /// timeout, retries, backoff and budget in the [`ClientMiddleware`]), with jitter drawn
    /// from `seed`.
    pub fn new(
        url: impl Into<String>,
        policy: &EndpointPolicy,
        seed: u64,
    ) -> Result<Self, RiskClientError> {
        let mut http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(64);
        if let Some(connect) = policy.connect_timeout() {
            http = http.connect_timeout(connect);
        }
        let log = Arc::new(CheckLog::default());
        let stack = ClientLayerBuilder::single(DEPENDENCY, policy.clone())
            .with_seed(seed)
            .with_observer((Telemetry, Arc::clone(&log)))
            .build()?;
        let http = reqwest_middleware::ClientBuilder::new(http.build()?)
            .with(ClientMiddleware::from(stack))
            .build();
        Ok(RiskClient {
            http,
            url: url.into(),
            log,
            checks: AtomicU64::new(0),
        })
    }

    /// Checks `cb`: `Ok` when the service passed it, or the whole story of why not.
    pub async fn check(&self, cb: &PaymentCallback) -> Result<(), RiskExhausted> {
        let n = self.checks.fetch_add(1, Ordering::Relaxed);
        let id = format!("risk-{}-{n}", cb.out_trade_no);
        let _forget = Forget {
            log: &self.log,
            id: &id,
        };
        let body =
            serde_json::json!({ "out_trade_no": cb.out_trade_no, "amount": cb.amount }).to_string();
        let sent = self
            .http
            .post(&self.url)
            .header(REQUEST_ID, &id)
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await;
        let last = match &sent {
            Ok(response) if response.status().is_success() => return Ok(()),
            Ok(response) => format!("status {}", response.status().as_u16()),
            Err(error) => describe(error),
        };
        let check = self.log.take(&id);
        let (reason, attempts) = match check.end {
            Some(end) => (end.stop, end.attempts),
            None => (StopReason::NeverRetry, check.attempts.len() as u32),
        };
        Err(RiskExhausted {
            reason,
            attempts,
            last,
            history: check.attempts,
        })
    }
}

/// An error and its causes on one line, its kind first.
fn describe(error: &reqwest_middleware::Error) -> String {
    let kind = if error.is_connect() {
        "connect error"
    } else if error.is_timeout() {
        "timeout"
    } else {
        match error {
            reqwest_middleware::Error::Reqwest(_) => "transport error",
            reqwest_middleware::Error::Middleware(_) => "not answered",
        }
    };
    let mut text = format!("{kind}: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_draws_follow_the_rate() {
        let faults = RiskFaults::new(1).with_failure_rate(0.12);
        let fails = |f: &RiskFaults| f.failures.draw().abort.is_some();
        let failed = (0..10_000).filter(|_| fails(&faults)).count();
        assert!((1_000..1_400).contains(&failed), "{failed}");
        let healthy = RiskFaults::new(1);
        assert!((0..1000).all(|_| !fails(&healthy)));
        let always = RiskFaults::new(1).with_failure_rate(f64::INFINITY);
        assert!((0..1000).all(|_| fails(&always)));
        always.set_failure_rate(f64::NAN);
        assert!((0..1000).all(|_| !fails(&always)), "NaN means no failures");
        let down = RiskFaults::new(1);
        down.set_down(true);
        assert!((0..100).all(|_| down.outage.draw().abort.is_some()));
        down.set_down(false);
        assert!((0..100).all(|_| down.outage.draw().is_none()));
    }

    #[test]
    fn the_history_line_lists_every_attempt() {
        let e = RiskExhausted {
            reason: StopReason::AttemptsExhausted,
            attempts: 2,
            last: "status 503".into(),
            history: vec![
                AttemptRecord {
                    number: 1,
                    started: Duration::ZERO,
                    took: Duration::from_millis(31),
                    result: "status 503".into(),
                },
                AttemptRecord {
                    number: 2,
                    started: Duration::from_millis(340),
                    took: Duration::from_millis(12),
                    result: "status 503".into(),
                },
            ],
        };
        assert_eq!(
            e.history_line(),
            "#1 +0ms 31ms status 503; #2 +340ms 12ms status 503"
        );
        assert!(e.to_string().contains("attempts_exhausted"));
    }
}
