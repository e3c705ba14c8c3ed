//! The risk service (a fault-injecting stand-in) and the budgeted client that calls it.
//!
//! # The client
//!
//! The risk check is the one dependency retried here: two retries, 300 ms then 600 ms
//! (jittered), through the core [`Retrier`] and a token bucket shared by every callback, so a
//! risk outage costs the risk service at most the bucket's headroom in retries instead of
//! tripling its load. Each attempt is bounded by `min(read timeout, what is left of the
//! callback's deadline)` and the retrier gives up when the deadline cannot fit another wait plus
//! a minimum call. When it gives up, [`RiskClient::check`] returns the whole attempt history,
//! which the handler logs and answers with `500` and `X-Retry-Exhausted: true`: the platform
//! redelivers on its own schedule, and nobody upstream retries again.
//!
//! Every attempt carries its number in [`ATTEMPT_HEADER`], which is how the harness measures
//! the retry rate from the risk service's side.
//!
//! # The service
//!
//! [`RiskServer`] answers `POST /risk/check` with `200` or, as told by its [`RiskFaults`],
//! with `503` at a seeded failure rate, after a seeded extra latency, or always while "down".

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::BoxError;
use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use stormguard::budget::RetryBudget;
use stormguard::classify::{Outcome, classify_http_response};
use stormguard::fault::{Abort, FaultConfig, FaultInjector, Latency};
use stormguard::policy::EndpointPolicy;
use stormguard::retry::{
    AttemptOutcome, Call, Failure, Retrier, RetryObserver, RetryReason, SeededRandom, StopReason,
};
use stormguard_tower::fault::FaultLayer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower::ServiceBuilder;
use tracing::Instrument;

use crate::callback::PaymentCallback;

/// The request header carrying the attempt number (1 for the first attempt).
pub const ATTEMPT_HEADER: &str = "x-stormguard-attempt";

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
        .get(ATTEMPT_HEADER)
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
    /// What came back: `status 503`, `connect error: …`, `cut by per-try timeout`.
    pub result: String,
}

/// The risk check did not pass: the retrier gave up.
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
    /// The policy's budget could not be built.
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
}

/// A response from the risk service, as the classifier needs it.
#[derive(Clone, Copy, Debug)]
struct RiskResponse {
    status: u16,
    retry_after: Option<Duration>,
    exhausted: bool,
}

fn classify(result: &Result<RiskResponse, reqwest::Error>) -> Outcome {
    match result {
        Ok(r) => classify_http_response(r.status, r.retry_after, r.exhausted),
        // Nothing was sent when the connection could not be made.
        Err(e) if e.is_connect() => Outcome::Retryable,
        // Sent and then lost or timed out: in doubt (the check is read-only, and the policy
        // declares it idempotent, so it is retried).
        Err(_) => Outcome::InDoubt,
    }
}

/// Counts attempts, retries and give-ups of the risk check.
#[derive(Debug, Default)]
pub struct RetryMetrics;

impl RetryObserver for RetryMetrics {
    fn attempt_started(&self, _attempt: u32) {
        metrics::counter!("payment_dependency_attempts_total", "dependency" => DEPENDENCY)
            .increment(1);
    }

    fn retry_scheduled(&self, _next: u32, delay: Duration, reason: RetryReason) {
        metrics::counter!("payment_dependency_retries_total", "dependency" => DEPENDENCY, "reason" => reason.label())
            .increment(1);
        metrics::histogram!("payment_dependency_retry_delay_seconds", "dependency" => DEPENDENCY)
            .record(delay.as_secs_f64());
    }

    fn attempt_ended(&self, _attempt: u32, ended: &AttemptOutcome) {
        if ended.outcome.is_failure() {
            metrics::counter!("payment_dependency_failures_total", "dependency" => DEPENDENCY, "outcome" => ended.outcome.label())
                .increment(1);
        }
    }

    fn gave_up(&self, _attempts: u32, reason: StopReason) {
        metrics::counter!("payment_dependency_gave_up_total", "dependency" => DEPENDENCY, "reason" => reason.label())
            .increment(1);
    }
}

/// Calls the risk service under the `risk-check` policy.
pub struct RiskClient {
    http: reqwest::Client,
    url: String,
    retrier: Retrier<Arc<dyn RetryBudget>, RetryMetrics, SeededRandom>,
}

impl std::fmt::Debug for RiskClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RiskClient")
            .field("url", &self.url)
            .field("policy", self.retrier.policy())
            .finish_non_exhaustive()
    }
}

/// Records an attempt that the per-try timeout cut (its future is dropped mid-way).
struct Pending<'a> {
    history: &'a Mutex<Vec<AttemptRecord>>,
    record: Option<AttemptRecord>,
    started: Instant,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let (Some(mut record), Ok(mut history)) = (self.record.take(), self.history.lock()) {
            record.took = self.started.elapsed();
            record.result = "cut by the per-try timeout".to_owned();
            history.push(record);
        }
    }
}

impl RiskClient {
    /// A client for `url` under `policy` (connect timeout → connect, per-try timeout →
    /// read timeout and per-attempt bound), sharing `budget`, with jitter drawn from `seed`.
    pub fn new(
        url: impl Into<String>,
        policy: &EndpointPolicy,
        budget: Arc<dyn RetryBudget>,
        seed: u64,
    ) -> Result<Self, RiskClientError> {
        let mut http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(64);
        if let Some(connect) = policy.connect_timeout() {
            http = http.connect_timeout(connect);
        }
        if let Some(read) = policy.retry().per_try_timeout() {
            http = http.read_timeout(read);
        }
        let retrier = Retrier::new(*policy.retry())
            .with_budget(budget)
            .with_observer(RetryMetrics)
            .with_random(SeededRandom::new(seed));
        Ok(RiskClient {
            http: http.build()?,
            url: url.into(),
            retrier,
        })
    }

    /// Checks `cb`: `Ok` when the service passed it, or the whole story of why not.
    pub async fn check(&self, cb: &PaymentCallback) -> Result<(), RiskExhausted> {
        let body =
            serde_json::json!({ "out_trade_no": cb.out_trade_no, "amount": cb.amount }).to_string();
        let history = Mutex::new(Vec::new());
        let log = &history;
        let origin = Instant::now();
        let report = self
            .retrier
            .run_report(
                Call::new(),
                |attempt| {
                    let started = Instant::now();
                    let mut pending = Pending {
                        history: log,
                        record: Some(AttemptRecord {
                            number: attempt.number,
                            started: started.duration_since(origin),
                            took: Duration::ZERO,
                            result: String::new(),
                        }),
                        started,
                    };
                    let request = self
                        .http
                        .post(&self.url)
                        .header(ATTEMPT_HEADER, attempt.number)
                        .header("content-type", "application/json")
                        .body(body.clone());
                    // One span per attempt, named and shaped like the RetryLayer's.
                    let span = tracing::info_span!(
                        target: "stormguard::retry",
                        "stormguard.attempt",
                        dependency = DEPENDENCY,
                        retry.attempt = attempt.number,
                        http.request.resend_count = attempt.number.saturating_sub(1),
                        http.response.status_code = tracing::field::Empty,
                        elapsed_ms = tracing::field::Empty,
                    );
                    let attempt_span = span.clone();
                    async move {
                        let result = request.send().await.map(|r| RiskResponse {
                            status: r.status().as_u16(),
                            retry_after: r.headers().get("retry-after").and_then(|v| {
                                stormguard::classify::parse_retry_after(
                                    v.as_bytes(),
                                    std::time::SystemTime::now(),
                                )
                                .ok()
                            }),
                            exhausted: stormguard_tower::wire::is_exhausted(r.headers()),
                        });
                        if let (Some(mut record), Ok(mut h)) = (pending.record.take(), log.lock()) {
                            record.took = started.elapsed();
                            record.result = match &result {
                                Ok(r) => format!("status {}", r.status),
                                Err(e) => describe(e),
                            };
                            h.push(record);
                        }
                        if let Ok(r) = &result {
                            attempt_span.record("http.response.status_code", r.status);
                        }
                        let elapsed_ms =
                            u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                        attempt_span.record("elapsed_ms", elapsed_ms);
                        result
                    }
                    .instrument(span)
                },
                classify,
            )
            .await;
        if report.stop == StopReason::Succeeded {
            return Ok(());
        }
        let last = match &report.result {
            Ok(r) => format!("status {}", r.status),
            Err(Failure::Error(e)) => describe(e),
            Err(Failure::TimedOut(after)) => format!("attempt timed out after {after:?}"),
            Err(Failure::Refused(refusal)) => format!("not sent: {refusal}"),
        };
        let history = history.into_inner().unwrap_or_default();
        Err(RiskExhausted {
            reason: report.stop,
            attempts: report.attempts,
            last,
            history,
        })
    }
}

fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_connect() {
        "connect error"
    } else if e.is_timeout() {
        "timeout"
    } else {
        "transport error"
    };
    let mut text = format!("{kind}: {e}");
    let mut source = std::error::Error::source(e);
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
    fn classification_follows_the_core() {
        let ok = |status, exhausted| -> Result<RiskResponse, reqwest::Error> {
            Ok(RiskResponse {
                status,
                retry_after: None,
                exhausted,
            })
        };
        assert_eq!(classify(&ok(200, false)), Outcome::Success);
        assert_eq!(classify(&ok(503, false)), Outcome::Retryable);
        // A risk service that already retried is not retried again.
        assert_eq!(classify(&ok(503, true)), Outcome::NeverRetry);
        assert_eq!(classify(&ok(400, false)), Outcome::NeverRetry);
    }

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
