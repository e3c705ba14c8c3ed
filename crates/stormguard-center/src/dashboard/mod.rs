//! The dashboard: the center's state for people, at `/ui`, served by the center itself.
//!
//! A person answering "what runs where, who changed it, and is it working" should not need
//! the API's documentation or a second program. The dashboard is HTML rendered on the server
//! (`maud`: templates are Rust expressions, escaped by default and checked when the crate
//! compiles), with one stylesheet and one small script compiled into the binary: nothing is
//! fetched from elsewhere, and every page works without the script (it only refreshes the
//! live part of a service's overview every two seconds).
//!
//! - **Services** (`/ui`): each service's stable version, canary, how many instances
//!   acknowledged the version they should run, and its rules.
//! - **Overview** (`/ui/services/{s}`): the stable version and canary (with its share), every
//!   instance's target and ACK or NACK, the endpoints' settings, and live charts of each
//!   downstream's error ratio, P99 and attempts per request; an editor promotes or aborts
//!   the canary there.
//! - **History**: every version with what it changed, and a one-click rollback on each
//!   older one (a rollback publishes that version's policies again, as the API's does).
//! - **Publish**: the latest policies in a form; a publish goes through the API's publish
//!   path (validated, linted, compare-and-set on the version shown).
//! - **Rules**: each rule in words, whether it is active, and its firing history with the
//!   values that fired it.
//!
//! Signing in takes a token the center issued; what a page offers and what a form may do
//! follow the token's role exactly as the API does (a viewer reads, an editor also publishes
//! and rolls back). How sign-in and forms are protected is told in [`session`].

mod charts;
mod history;
mod overview;
mod page;
mod rules;
mod session;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

pub(crate) use charts::Downstream;

use crate::server::Center;

/// The stylesheet, compiled in.
const STYLE: &str = include_str!("assets/style.css");
/// The refresh script, compiled in.
const SCRIPT: &str = include_str!("assets/live.js");

/// The dashboard's routes, under `/ui` (and `/`, which leads there).
pub(crate) fn router() -> Router<Center> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route("/ui", get(overview::services))
        .route("/ui/", get(|| async { Redirect::to("/ui") }))
        .route(
            "/ui/login",
            get(session::sign_in_page).post(session::sign_in),
        )
        .route("/ui/logout", post(session::sign_out))
        .route("/ui/assets/style.css", get(style))
        .route("/ui/assets/live.js", get(script))
        .route("/ui/services/{service}", get(overview::overview))
        .route("/ui/services/{service}/live", get(overview::live))
        .route("/ui/services/{service}/history", get(history::history))
        .route("/ui/services/{service}/rollback", post(history::rollback))
        .route(
            "/ui/services/{service}/publish",
            get(history::publish_page).post(history::publish),
        )
        .route("/ui/services/{service}/rules", get(rules::rules))
        .route(
            "/ui/services/{service}/canary/{step}",
            post(history::canary_step),
        )
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    let mut response = text.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// How far back the charts go.
const CHART_SPAN_MS: i64 = 5 * 60 * 1000;

/// The recent rounds of `service` in the center's [`MetricHistory`](crate::MetricHistory)
/// (the last [`CHART_SPAN_MS`]), one [`Downstream`] per endpoint any of them saw.
fn observed(center: &Center, service: &str) -> Vec<Downstream> {
    let since = crate::server::now_ms() - CHART_SPAN_MS;
    let rounds: Vec<crate::Round> = center
        .metric_history()
        .rounds(service)
        .into_iter()
        .filter(|round| round.at_ms >= since)
        .collect();
    let endpoints: std::collections::BTreeSet<&String> = rounds
        .iter()
        .flat_map(|round| round.endpoints.keys())
        .collect();
    endpoints
        .into_iter()
        .map(|endpoint| Downstream {
            endpoint: endpoint.clone(),
            error_ratio: rounds
                .iter()
                .map(|r| (r.at_ms, r.error_ratio(endpoint)))
                .collect(),
            p99_seconds: rounds
                .iter()
                .map(|r| (r.at_ms, r.p99_seconds(endpoint)))
                .collect(),
            attempts_per_request: rounds
                .iter()
                .map(|r| (r.at_ms, r.attempts_per_request(endpoint)))
                .collect(),
        })
        .collect()
}
