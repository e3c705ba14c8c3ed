//! The admin port: what an operator or a scraper asks a running proxy.
//!
//! | path | answer |
//! | --- | --- |
//! | `GET /metrics` | the library's metrics (attempts, retries, refusals, breaker transitions, budget, policy version and reload errors, limit) in Prometheus text |
//! | `GET /status` | JSON: the direction, the policy version and how the last reloads went, each endpoint's breaker state, the policy center's version applied and connection, the adaptive limit, the fault injector |
//! | `POST /faults/on`, `POST /faults/off` | switch the egress fault injector, for a chaos drill |
//!
//! The admin port is separate from the proxied port so that it can be bound to a private
//! address and never reached by the traffic the proxy serves: it can switch faults on. The
//! CLI binds it to loopback unless told an address (`--admin 15000` is `127.0.0.1:15000`).

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::{get, post};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};
use stormguard::breaker::BreakerState;
use stormguard::fault::FaultInjector;
use stormguard_tower::client::{CenterWatch, Policies};
use stormguard_tower::limit::AdaptiveLimitLayer;
use stormguard_tower::metric_names::{ATTEMPT_DURATION, ATTEMPT_DURATION_BUCKETS};
use stormguard_tower::observe::Telemetry;
use tokio::net::TcpListener;

/// What the admin port reads.
pub(crate) struct AdminState {
    pub(crate) direction: &'static str,
    pub(crate) policies: Option<Policies<Telemetry>>,
    pub(crate) center: Option<Arc<CenterWatch>>,
    pub(crate) limit: Option<AdaptiveLimitLayer>,
    pub(crate) faults: Option<Arc<FaultInjector>>,
}

/// The process's Prometheus recorder, installed by the first proxy that asks. `None` when the
/// program installed another recorder first (its metrics go there instead).
pub fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // Attempt durations as bucket counts, which sum over instances, rather than the
            // exporter's default summary over its own rolling window.
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(ATTEMPT_DURATION.to_owned()),
                    ATTEMPT_DURATION_BUCKETS,
                )
                .ok()?
                .install_recorder()
                .ok()?;
            stormguard_tower::observe::describe_metrics();
            Some(handle)
        })
        .clone()
}

pub(crate) async fn serve(listener: TcpListener, state: AdminState) {
    let router = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/status", get(status))
        .route("/faults/on", post(faults_on))
        .route("/faults/off", post(faults_off))
        .with_state(Arc::new(state));
    if let Err(error) = axum::serve(listener, router).await {
        tracing::error!(%error, "stormguard proxy: the admin port stopped");
    }
}

async fn render_metrics() -> impl IntoResponse {
    match metrics_handle() {
        Some(handle) => (StatusCode::OK, handle.render()),
        None => (
            StatusCode::NOT_FOUND,
            "another metrics recorder is installed in this process\n".to_owned(),
        ),
    }
}

async fn status(State(state): State<Arc<AdminState>>) -> Json<Value> {
    Json(status_json(&state))
}

/// The `/status` document.
pub(crate) fn status_json(state: &AdminState) -> Value {
    let policy = state.policies.as_ref().map(|policies| {
        let status = policies.status();
        let endpoints: Vec<Value> = policies
            .endpoint_status()
            .into_iter()
            .map(|e| json!({ "name": e.name, "breaker": e.breaker.map(BreakerState::label) }))
            .collect();
        json!({
            "version": format!("{:012x}", status.version),
            "swaps": status.swaps,
            "errors": status.errors,
            "last_error": status.last_error.map(|(_, message)| message),
            "warnings": status.warnings,
            "endpoints": endpoints,
        })
    });
    let center = state.center.as_ref().map(|center| {
        let watch = center.state();
        json!({
            "applied": watch.applied,
            "connected": watch.connected,
            "connections": watch.connections,
            "refused": watch.refused,
            "last_error": watch.last_error,
        })
    });
    let limit = state.limit.as_ref().map(|limit| {
        json!({
            "limit": limit.limiter().limit(),
            "in_flight": limit.limiter().in_flight(),
            "queued": limit.queued(),
        })
    });
    let faults = state.faults.as_ref().map(|f| {
        json!({
            "enabled": f.is_enabled(),
            "abort_rate": f.abort_rate(),
            "latency_rate": f.latency_rate(),
        })
    });
    json!({
        "direction": state.direction,
        "policy": policy,
        "center": center,
        "limit": limit,
        "faults": faults,
    })
}

async fn faults_on(State(state): State<Arc<AdminState>>) -> StatusCode {
    switch(&state, true)
}

async fn faults_off(State(state): State<Arc<AdminState>>) -> StatusCode {
    switch(&state, false)
}

fn switch(state: &AdminState, on: bool) -> StatusCode {
    match &state.faults {
        Some(faults) if on => {
            faults.enable();
            StatusCode::NO_CONTENT
        }
        Some(faults) => {
            faults.disable();
            StatusCode::NO_CONTENT
        }
        None => StatusCode::NOT_FOUND,
    }
}
