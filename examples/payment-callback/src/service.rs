//! The callback endpoint: router, handler, business deadline and metrics.
//!
//! `POST /pay/callback` does, in order:
//!
//! 1. **verify the signature** over the raw body — a missing, malformed or wrong one is `401`
//!    `fail`, with no call and no write;
//! 2. **parse** the payload — an invalid one is `400` `fail`;
//! 3. **answer a known duplicate at once** — an order already paid is `200` `success` without a
//!    risk check (its first delivery passed one): a redelivery storm costs the risk service
//!    nothing;
//! 4. **check risk** with budgeted retries, ending [`HANDLER_RESERVE`] before the business
//!    deadline — when they are exhausted: `500` with
//!    `X-Retry-Exhausted: true`, the whole attempt history logged at error level, and a count
//!    in `payment_retry_exhausted_total`; the platform redelivers on its own schedule;
//! 5. **record the payment exactly once** — one transaction: the row keyed by `out_trade_no`,
//!    and the `order.paid` outbox message only if the row is new;
//! 6. answer `200` `success` — for a concurrent duplicate too, since the order *is* paid.
//!
//! The callback itself is never retried here: the platform owns that schedule, and retrying
//! under it would only interfere. The whole request runs under a 4.5 s business deadline (the
//! platform waits 5 s), set by stormguard-tower's `DeadlineLayer`: every outgoing call reads
//! it, and the request is cut (`504`) if it is ever reached.
//!
//! Duplicates that arrive while the first delivery is still running (the concurrent half of a
//! burst) are all risk-checked; the insert decides which one records the payment.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use stormguard::budget::Unlimited;
use stormguard::classify::Outcome;
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline, WallClock};
use stormguard::retry::{Call, InvalidPolicy, Retrier, SeededRandom};
use stormguard_tower::DeadlineLayer;
use stormguard_tower::deadline::InvalidDeadlineConfig;
use stormguard_tower::wire::mark_exhausted;
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

use crate::broker::{Broker, BrokerError, BrokerUrl};
use crate::callback::{Rejection, TradeStatus, verify_and_parse};
use crate::outbox::{Background, BrokerPublisher};
use crate::policy::{Policies, PolicyError};
use crate::risk::{DEPENDENCY as RISK, RiskClient, RiskClientError};
use crate::signature::{EmptySecret, SIGNATURE_HEADER, Signer};
use crate::store::{DatabaseUrl, Recorded, Store, StoreError, StoreOptions, classify_db_error};

/// The callback's path.
pub const CALLBACK_PATH: &str = "/pay/callback";

/// The business deadline: the platform waits 5 s; 4.5 s leaves room for the network.
pub const BUSINESS_DEADLINE: Duration = Duration::from_millis(4500);

/// What the handler keeps of the business deadline for its own work: the risk check ends
/// this long before it, so that a risk service that hangs is answered with a marked `500`
/// (the platform redelivers) and never cut by the deadline (`504`) in the middle of a step.
pub const HANDLER_RESERVE: Duration = Duration::from_millis(250);

/// The largest callback body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// What a service needs to run.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Where to listen (port 0 for an ephemeral one).
    pub listen: SocketAddr,
    /// The database.
    pub database: DatabaseUrl,
    /// The risk service's check URL.
    pub risk_url: String,
    /// The broker `order.paid` is published to.
    pub broker: BrokerUrl,
    /// The secret shared with the platform.
    pub secret: String,
    /// The dependencies' policies.
    pub policies: Policies,
    /// Seed of the retry jitter.
    pub seed: u64,
    /// The business deadline ([`BUSINESS_DEADLINE`] in production).
    pub deadline: Duration,
    /// How long binding the port may keep failing (a restarted process may find its port
    /// briefly still taken).
    pub bind_patience: Duration,
}

/// Starting the service failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The database.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The broker.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The policy file.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A retry policy a retrier refuses.
    #[error(transparent)]
    Retry(#[from] InvalidPolicy),
    /// The risk client.
    #[error(transparent)]
    Risk(#[from] RiskClientError),
    /// The secret.
    #[error(transparent)]
    Secret(#[from] EmptySecret),
    /// The business deadline (zero is refused).
    #[error("business deadline: {0}")]
    Deadline(#[from] InvalidDeadlineConfig),
    /// Binding or serving the port.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

struct AppState {
    signer: Signer,
    risk: RiskClient,
    store: Store,
    database: Retrier<Unlimited, (), SeededRandom>,
    relay: Arc<Notify>,
    wall: WallClock,
}

/// The process-wide Prometheus recorder (installed on first use; `None` if another recorder
/// was installed first).
pub fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            const BUCKETS: [f64; 12] = [
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.5, 5.0,
            ];
            PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &BUCKETS)
                .and_then(|b| b.install_recorder())
                .ok()
        })
        .clone()
}

fn answer(status: StatusCode, body: &'static str) -> Response {
    (status, body).into_response()
}

fn retry_exhausted() -> Response {
    let mut response = answer(StatusCode::INTERNAL_SERVER_ERROR, "fail");
    mark_exhausted(response.headers_mut());
    response
}

async fn callback(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let started = Instant::now();
    let (result, response) = handle(&app, &headers, &body).await;
    metrics::counter!("payment_callbacks_total", "result" => result).increment(1);
    metrics::histogram!("payment_callback_duration_seconds")
        .record(started.elapsed().as_secs_f64());
    response
}

/// The handler's steps; returns the metrics label and the answer.
async fn handle(app: &AppState, headers: &HeaderMap, body: &[u8]) -> (&'static str, Response) {
    let signature = headers.get(SIGNATURE_HEADER).map(HeaderValue::as_bytes);
    let cb = match verify_and_parse(&app.signer, signature, body) {
        Ok(cb) => cb,
        Err(Rejection::Signature(e)) => {
            tracing::warn!(error = %e, "callback refused: signature");
            return ("bad_signature", answer(StatusCode::UNAUTHORIZED, "fail"));
        }
        Err(Rejection::Payload(e)) => {
            tracing::warn!(error = %e, "callback refused: payload");
            return ("bad_request", answer(StatusCode::BAD_REQUEST, "fail"));
        }
    };
    if cb.status == TradeStatus::Closed {
        tracing::info!(
            out_trade_no = cb.out_trade_no,
            "trade closed; nothing to record"
        );
        return ("closed", answer(StatusCode::OK, "success"));
    }
    // A redelivery of an order already paid needs no risk check: its first delivery passed
    // one. (A failed read is not fatal: the insert below decides exactly-once either way.)
    if let Ok(true) = app.store.is_paid(&cb.out_trade_no).await {
        tracing::info!(
            out_trade_no = cb.out_trade_no,
            "duplicate callback; already paid"
        );
        return ("duplicate", answer(StatusCode::OK, "success"));
    }
    // The risk check ends HANDLER_RESERVE before the business deadline: the rest is the
    // handler's own, to answer (or record) before the platform stops listening.
    let checked = match deadline::current() {
        Some(business) => {
            let left = business.remaining().saturating_sub(HANDLER_RESERVE);
            deadline::scope(Deadline::after(left, Clock::tokio()), app.risk.check(&cb)).await
        }
        None => app.risk.check(&cb).await,
    };
    if let Err(exhausted) = checked {
        metrics::counter!("payment_retry_exhausted_total", "dependency" => RISK).increment(1);
        tracing::error!(
            out_trade_no = cb.out_trade_no,
            trade_no = cb.trade_no,
            amount = cb.amount,
            dependency = RISK,
            attempts = exhausted.attempts,
            stop = exhausted.reason.label(),
            last_error = exhausted.last,
            history = exhausted.history_line(),
            "risk check retries exhausted; answering 500 with X-Retry-Exhausted (the platform will redeliver)"
        );
        return ("retry_exhausted", retry_exhausted());
    }
    let now = app.wall.now_millis();
    let recorded = app
        .database
        .run_report(
            Call::new(),
            |_| app.store.record_payment(&cb, now),
            |r: &Result<Recorded, sqlx::Error>| match r {
                Ok(_) => Outcome::Success,
                Err(e) => classify_db_error(e),
            },
        )
        .await;
    match recorded.result {
        Ok(Recorded::New) => {
            app.relay.notify_one();
            tracing::info!(out_trade_no = cb.out_trade_no, "order paid");
            ("paid", answer(StatusCode::OK, "success"))
        }
        Ok(_) => {
            tracing::info!(
                out_trade_no = cb.out_trade_no,
                "duplicate callback; already paid"
            );
            ("duplicate", answer(StatusCode::OK, "success"))
        }
        Err(e) => {
            tracing::error!(
                out_trade_no = cb.out_trade_no,
                attempts = recorded.attempts,
                stop = recorded.stop.label(),
                error = %e,
                "recording the payment failed; answering 500 (the platform will redeliver)"
            );
            (
                "db_error",
                answer(StatusCode::INTERNAL_SERVER_ERROR, "fail"),
            )
        }
    }
}

async fn render_metrics() -> Response {
    match metrics_handle() {
        Some(handle) => {
            handle.run_upkeep();
            (
                [("content-type", "text/plain; version=0.0.4")],
                handle.render(),
            )
                .into_response()
        }
        None => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder not installed",
        ),
    }
}

/// A running service.
#[derive(Debug)]
pub struct Service {
    addr: SocketAddr,
    store: Store,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), std::io::Error>>,
    _background: Background,
}

impl Service {
    /// Connects the database, starts the relay and consumer, binds and serves.
    pub async fn start(config: ServiceConfig) -> Result<Service, ServiceError> {
        let _ = metrics_handle();
        let signer = Signer::new(&config.secret)?;
        let policies = &config.policies;
        let options = StoreOptions {
            acquire_timeout: policies
                .database
                .connect_timeout()
                .unwrap_or(Duration::from_secs(1)),
            ..StoreOptions::default()
        };
        let store = Store::connect(&config.database, options).await?;
        let risk = RiskClient::new(config.risk_url.clone(), &policies.risk, config.seed)?;
        let broker = Broker::connect(&config.broker, &store).await?;
        let publisher =
            BrokerPublisher::new(broker.clone(), &policies.publish, config.seed ^ 0x5eed)?;
        let background =
            Background::start(store.clone(), broker, publisher, Duration::from_millis(50));
        let state = Arc::new(AppState {
            signer,
            risk,
            store: store.clone(),
            database: Retrier::new(*policies.database.retry())?
                .with_random(SeededRandom::new(config.seed ^ 0xdb)),
            relay: background.relay_waker(),
            wall: WallClock::system(),
        });
        let app = Router::new()
            .route(CALLBACK_PATH, post(callback))
            // The business deadline (4.5 s): the task's current deadline for every retrier and
            // per-try timeout below, and the handler is cut (504) when it passes. The platform
            // sends no deadline header, so the default applies; the maximum caps one that would.
            .route_layer(
                DeadlineLayer::new()
                    .with_default_timeout(config.deadline)
                    .with_max(config.deadline)
                    .validate()?,
            )
            .layer(DefaultBodyLimit::max(MAX_BODY))
            .with_state(state)
            .route("/metrics", get(render_metrics))
            .route("/healthz", get(|| async { "ok" }));
        let listener = bind(config.listen, config.bind_patience).await?;
        let addr = listener
            .local_addr()
            .map_err(|source| ServiceError::Listen {
                addr: config.listen,
                source,
            })?;
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await
        });
        tracing::info!(
            %addr,
            database = config.database.kind(),
            broker = config.broker.kind(),
            "payment callback service listening"
        );
        Ok(Service {
            addr,
            store,
            shutdown: Some(tx),
            task,
            _background: background,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The callback URL.
    pub fn callback_url(&self) -> String {
        format!("http://{}{CALLBACK_PATH}", self.addr)
    }

    /// Serves until the server stops (it stops only on error).
    pub async fn wait(mut self) -> Result<(), ServiceError> {
        let addr = self.addr;
        let joined = (&mut self.task).await;
        match joined {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(ServiceError::Listen { addr, source }),
            Err(join) => Err(ServiceError::Listen {
                addr,
                source: std::io::Error::other(join.to_string()),
            }),
        }
    }

    /// Stops serving (requests in flight are dropped), the relay and the consumer.
    pub async fn stop(self) {
        let Service {
            store,
            shutdown,
            task,
            _background: background,
            ..
        } = self;
        if let Some(tx) = shutdown {
            let _ = tx.send(());
        }
        task.abort();
        let _ = task.await;
        // The relay and consumer first, so they never see the pool closed under them.
        background.stop().await;
        store.close().await;
    }
}

/// Binds `addr`, trying again for up to `patience` while it is in use.
async fn bind(addr: SocketAddr, patience: Duration) -> Result<TcpListener, ServiceError> {
    let until = Instant::now() + patience;
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(source) => return Err(ServiceError::Listen { addr, source }),
        }
    }
}
