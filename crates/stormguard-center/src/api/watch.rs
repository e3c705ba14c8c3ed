//! What instances call: the watch stream, the conditional poll, and ACK/NACK.
//!
//! A watch is a server-sent event stream. Each event is a full [`Snapshot`] of the version
//! the instance should run (event `policy`, id = the version's number), sent when the
//! stream opens (unless the instance's `Last-Event-ID` already names it) and whenever it
//! changes: a publish, a rollback, a canary that selects the instance, its promotion or its
//! abort. Full snapshots, never deltas, so a missed event cannot leave an instance on a
//! policy nobody published. The poll serves the same snapshot with the version as `ETag`,
//! and 304 when `If-None-Match` names it.

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::Deserialize;

use super::{check_name, parse_labels};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::hub::Subscription;
use crate::metric_names::{NACKS, PUBLISH_TO_ACK, WATCHERS};
use crate::server::{Center, now_ms};
use crate::store::NewAudit;
use crate::version::Snapshot;

/// Who is watching or polling: the query of both.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Instance {
    instance: String,
    /// `key=value,key=value`.
    #[serde(default)]
    labels: Option<String>,
    /// Where the instance serves its Prometheus `/metrics`, scraped while it watches.
    #[serde(default)]
    metrics: Option<String>,
}

impl Instance {
    fn checked(&self) -> Result<BTreeMap<String, String>, ApiError> {
        check_name("instance", &self.instance)?;
        parse_labels(self.labels.as_deref())
    }
}

/// The body of `POST /v1/services/{service}/acks`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Ack {
    instance: String,
    version: u64,
    /// True when the instance runs the version; false (a NACK) with a reason when it could
    /// not apply it.
    applied: bool,
    #[serde(default)]
    reason: Option<String>,
}

const MAX_REASON: usize = 4096;

pub(crate) async fn watch(
    State(center): State<Center>,
    caller: Caller,
    Path(service): Path<String>,
    Query(who): Query<Instance>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    caller.may_watch(&service)?;
    check_name("service", &service)?;
    let labels = who.checked()?;
    let last_seen = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let announced = match who.metrics.as_deref().filter(|m| !m.is_empty()) {
        Some(url) => Some(
            center
                .scrape_targets()
                .announce(&service, &who.instance, url)?,
        ),
        None => None,
    };
    let labels_text = serde_json::to_string(&labels).unwrap_or_default();
    center
        .store()
        .instance_seen(&service, &who.instance, &labels_text, now_ms())
        .await?;
    let releases = center.hub().subscribe(&service).await?;
    let stream = WatchStream {
        releases,
        instance: who.instance,
        labels,
        sent: last_seen,
        _gauge: WatcherGauge::new(),
        _announced: announced,
    };
    Ok(
        Sse::new(futures_util::stream::unfold(stream, WatchStream::next))
            .keep_alive(KeepAlive::new().interval(center.config().keep_alive)),
    )
}

/// One instance's watch.
struct WatchStream {
    releases: Subscription,
    instance: String,
    labels: BTreeMap<String, String>,
    /// The version last sent (or named by `Last-Event-ID`).
    sent: Option<u64>,
    _gauge: WatcherGauge,
    /// Keeps the instance's metrics URL listed while the stream lives.
    _announced: Option<crate::collect::Announced>,
}

impl WatchStream {
    async fn next(mut self) -> Option<(Result<Event, Infallible>, WatchStream)> {
        loop {
            let target = {
                let release = self.releases.receiver.borrow_and_update();
                release.target(&self.instance, &self.labels).cloned()
            };
            if let Some(snapshot) = target {
                if Some(snapshot.version) != self.sent {
                    self.sent = Some(snapshot.version);
                    return Some((Ok(event(&snapshot)), self));
                }
            }
            // The sender is dropped when the replica shuts down: the stream ends.
            self.releases.receiver.changed().await.ok()?;
        }
    }
}

fn event(snapshot: &Snapshot) -> Event {
    Event::default()
        .event("policy")
        .id(snapshot.version.to_string())
        .data(serde_json::to_string(snapshot).unwrap_or_default())
}

/// Counts a watch in the watchers gauge while it lives.
struct WatcherGauge;

impl WatcherGauge {
    fn new() -> WatcherGauge {
        metrics::gauge!(WATCHERS).increment(1.0);
        WatcherGauge
    }
}

impl Drop for WatcherGauge {
    fn drop(&mut self) {
        metrics::gauge!(WATCHERS).decrement(1.0);
    }
}

pub(crate) async fn poll(
    State(center): State<Center>,
    caller: Caller,
    Path(service): Path<String>,
    Query(who): Query<Instance>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    caller.may_read(&service)?;
    check_name("service", &service)?;
    let labels = who.checked()?;
    let release = center.hub().current(&service).await?;
    let snapshot = release
        .target(&who.instance, &labels)
        .cloned()
        .ok_or_else(|| ApiError::NotFound(format!("{service} has no published version")))?;
    let etag = format!("\"{}\"", snapshot.version);
    let etag_value = HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("\"0\""));
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|tag| tag.trim() == etag));
    if unchanged {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag_value)]).into_response());
    }
    Ok(([(header::ETAG, etag_value)], Json(&*snapshot)).into_response())
}

pub(crate) async fn acknowledge(
    State(center): State<Center>,
    caller: Caller,
    Path(service): Path<String>,
    Json(ack): Json<Ack>,
) -> Result<StatusCode, ApiError> {
    caller.may_watch(&service)?;
    check_name("service", &service)?;
    check_name("instance", &ack.instance)?;
    let reason = ack.reason.unwrap_or_default();
    if reason.len() > MAX_REASON {
        return Err(ApiError::BadRequest(format!(
            "reason: longer than {MAX_REASON} bytes"
        )));
    }
    if reason.contains('\0') {
        return Err(ApiError::BadRequest(
            "reason: contains a NUL character".to_owned(),
        ));
    }
    if !ack.applied && reason.is_empty() {
        return Err(ApiError::BadRequest(
            "a NACK (applied = false) needs a reason".to_owned(),
        ));
    }
    let now = now_ms();
    let audit = NewAudit {
        at_ms: now,
        actor: &caller.name,
        action: if ack.applied { "ack" } else { "nack" },
        service: &service,
        version: Some(ack.version),
        instance: Some(&ack.instance),
        detail: &reason,
    };
    center.store().acknowledge(ack.applied, &audit).await?;
    if ack.applied {
        // Timed to the commit (the ACK is on disk, not only received), and for an ACK that
        // arrives after a newer publish too, or the histogram would leave out exactly the
        // slowest instances. A failed lookup costs the sample, not the committed ACK.
        if let Some(published) = published_ms(&center, &service, ack.version).await {
            let seconds = (now_ms() - published).max(0) as f64 / 1000.0;
            metrics::histogram!(PUBLISH_TO_ACK).record(seconds);
        }
    } else {
        metrics::counter!(NACKS).increment(1);
    }
    Ok(StatusCode::NO_CONTENT)
}

/// When `version` of `service` was published: from the release in memory (the stable and
/// canary versions), else from the store.
async fn published_ms(center: &Center, service: &str, version: u64) -> Option<i64> {
    let release = center.hub().current(service).await.ok()?;
    if let Some(snapshot) = release.find(version) {
        return Some(snapshot.created_ms);
    }
    let row = center.store().version(service, version).await.ok()??;
    Some(row.created_ms)
}
