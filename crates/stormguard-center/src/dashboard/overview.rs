//! The list of services, and a service's overview: what its instances should run and run
//! (ACK state, canary share), its endpoints' settings, and live charts of its downstreams.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;
use stormguard::policy::PolicyFile;
use stormguard::policy::diff::PolicyDiff;

use super::charts;
use super::page::{Failure, Tab, author, html_response, layout, when};
use super::session::Signed;
use crate::api::admin::{InstanceStatus, Status, service_status};
use crate::api::check_name;
use crate::hub::Selector;
use crate::server::Center;
use crate::store::VersionRow;

/// What the overview says after a change the reader made (the redirect after a publish).
#[derive(Debug, Deserialize)]
pub(crate) struct Notice {
    published: Option<u64>,
}

pub(crate) async fn services(
    State(center): State<Center>,
    signed: Signed,
) -> Result<Response, Failure> {
    let names = center.store().services().await?;
    let mut rows = Vec::with_capacity(names.len());
    for name in names {
        let status = service_status(&center, name).await?;
        let rules = center.store().rules(&status.service).await?.len();
        rows.push((status, rules));
    }
    let body = html! {
        h1 { "Services" }
        @if rows.is_empty() {
            p.notice { "No service has a policy yet. Publish one with " code { "stormguard policy push" } " or " code { "POST /v1/services/{service}/versions" } "." }
        } @else {
            table.services {
                thead { tr { th { "Service" } th { "Stable" } th { "Canary" } th { "Instances on target" } th { "Rules" } } }
                tbody {
                    @for (status, rules) in &rows {
                        tr {
                            td { a href=(Tab::Overview.href(&status.service)) { strong { (status.service) } } }
                            td { (version_or_none(status.stable)) }
                            td { (canary_text(status)) }
                            td { (on_target_badge(status)) }
                            td { (rules) }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(
        StatusCode::OK,
        layout("Services", Some(&signed), None, body),
    ))
}

pub(crate) async fn overview(
    State(center): State<Center>,
    signed: Signed,
    Path(service): Path<String>,
    Query(notice): Query<Notice>,
) -> Result<Response, Failure> {
    check_name("service", &service)?;
    let live = Live::read(&center, &service).await?;
    let endpoints = live
        .stable
        .as_ref()
        .and_then(|row| PolicyFile::from_toml(&row.policy).ok())
        .map(|file| PolicyDiff::between(&PolicyFile::default(), &file).endpoints)
        .unwrap_or_default();
    let body = html! {
        @if let Some(v) = notice.published {
            p.notice.good role="status" { "Version " (v) " published. The instances below pick it up within a round trip; their state updates by itself." }
        }
        section #live data-refresh=(format!("/ui/services/{service}/live")) data-every="2" {
            (live_part(&center, &signed, &live))
        }
        section {
            h2 { "Endpoints" span.muted.small { " · as the stable version sets them" } }
            @if endpoints.is_empty() {
                p.muted { "The stable version has no endpoints." }
            } @else {
                table.endpoints {
                    thead { tr { th { "Endpoint" } @for (_, label) in SUMMARY { th { (label) } } } }
                    tbody {
                        @for endpoint in &endpoints {
                            tr data-endpoint=(endpoint.endpoint) {
                                td { code { (endpoint.endpoint) } }
                                @for (field, _) in SUMMARY {
                                    td { (setting(&endpoint.fields, field)) }
                                }
                            }
                        }
                    }
                }
                @for endpoint in &endpoints {
                    details.endpoint {
                        summary { "All settings of " code { (endpoint.endpoint) } }
                        table.settings {
                            @for field in &endpoint.fields {
                                tr { th { (field.field) } td { code { (field.new.as_deref().unwrap_or("")) } } }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(html_response(
        StatusCode::OK,
        layout(
            &service,
            Some(&signed),
            Some((&service, Tab::Overview)),
            body,
        ),
    ))
}

/// The settings the endpoints table shows, by field and column label.
const SUMMARY: [(&str, &str); 6] = [
    ("retry.max_attempts", "Attempts"),
    ("timeouts.per_try", "Per try"),
    ("timeouts.overall", "Overall"),
    ("budget.kind", "Retry budget"),
    ("breaker.failure_ratio", "Breaker opens at"),
    ("fallback", "Fallback"),
];

/// One field's value among an endpoint's settings, or a dash.
fn setting(fields: &[stormguard::policy::diff::FieldChange], name: &str) -> Markup {
    match fields
        .iter()
        .find(|f| f.field == name)
        .and_then(|f| f.new.as_deref())
    {
        Some(value) => html! { code { (value) } },
        None => html! { span.muted { "—" } },
    }
}

/// The part of the overview that refreshes itself: the versions, the instances and the
/// charts.
pub(crate) async fn live(
    State(center): State<Center>,
    signed: Signed,
    Path(service): Path<String>,
) -> Result<Response, Failure> {
    check_name("service", &service)?;
    let live = Live::read(&center, &service).await?;
    Ok(html_response(
        StatusCode::OK,
        live_part(&center, &signed, &live),
    ))
}

/// What the live part shows: the status, the stable version, and when the recent versions
/// were published (the charts' marks).
struct Live {
    status: Status,
    stable: Option<VersionRow>,
    versions: Vec<(i64, u64)>,
}

impl Live {
    async fn read(center: &Center, service: &str) -> Result<Live, Failure> {
        let status = service_status(center, service.to_owned()).await?;
        let stable = match status.stable {
            Some(v) => center.store().version(service, v).await?,
            None => None,
        };
        let versions = center
            .store()
            .history(service, 20)
            .await?
            .into_iter()
            .map(|row| (row.created_ms, row.version()))
            .collect();
        Ok(Live {
            status,
            stable,
            versions,
        })
    }
}

fn live_part(center: &Center, signed: &Signed, live: &Live) -> Markup {
    let status = &live.status;
    html! {
        div.cards {
            div.card {
                h2 { "Stable version" }
                @match &live.stable {
                    Some(row) => {
                        p.big { "v" (row.version()) }
                        p.muted { "by " (author(&row.author)) ", " (when(row.created_ms)) }
                        @if !row.message.is_empty() { p { (row.message) } }
                    }
                    None => { p.big.muted { "none" } p.muted { "Nothing published yet." } }
                }
            }
            div.card.canary {
                h2 { "Canary" }
                @match &status.canary {
                    Some((v, selector)) => {
                        p.big { "v" (v) }
                        p { (selector_text(selector)) }
                        p.muted { (canary_count(status)) }
                        @if signed.may_edit() {
                            div.actions {
                                @for (step, label) in [("promote", "Promote to everyone"), ("abort", "Abort")] {
                                    form.inline method="post" action=(format!("/ui/services/{}/canary/{step}", status.service)) {
                                        input type="hidden" name="csrf" value=(signed.csrf);
                                        input type="hidden" name="version" value=(v);
                                        button class={"step " (step)} type="submit" { (label) }
                                    }
                                }
                            }
                        }
                    }
                    None => { p.big.muted { "none" } p.muted { "Every instance runs the stable version." } }
                }
            }
            div.card {
                h2 { "Instances" }
                p.big { (on_target_badge(status)) }
                p.muted { "acknowledged the version they should run" }
            }
        }
        h2 { "Instances" }
        @if status.instances.is_empty() {
            p.muted { "No instance has watched this service yet." }
        } @else {
            table.instances {
                thead { tr { th { "Instance" } th { "Labels" } th { "Should run" } th { "Acknowledged" } th { "State" } th { "Last seen" } } }
                tbody {
                    @for instance in &status.instances {
                        tr data-instance=(instance.instance) data-acked=(instance.version.map_or_else(String::new, |v| v.to_string())) data-state=(ack_state(instance)) {
                            td { code { (instance.instance) } }
                            td { @for (k, v) in &instance.labels { span.label { (k) "=" (v) } " " } }
                            td {
                                (version_or_none(instance.target))
                                @if is_canary(status, instance) { " " span.badge.canary { "canary" } }
                            }
                            td { (version_or_none(instance.version)) }
                            td { (ack_badge(instance)) }
                            td { (when(instance.seen_ms)) }
                        }
                    }
                }
            }
        }
        (charts::section(center, &status.service, &live.versions))
    }
}

fn is_canary(status: &Status, instance: &InstanceStatus) -> bool {
    matches!((&status.canary, instance.target), (Some((canary, _)), Some(target)) if *canary == target)
}

/// The instance's state: `ack` (it applied the version it should run), `nack` (it could
/// not apply what it last got), or `waiting`.
fn ack_state(instance: &InstanceStatus) -> &'static str {
    let on_target = instance.version.is_some() && instance.version == instance.target;
    match (instance.applied, on_target) {
        (Some(true), true) => "ack",
        (Some(false), _) => "nack",
        _ => "waiting",
    }
}

fn ack_badge(instance: &InstanceStatus) -> Markup {
    let reason = instance.reason.as_deref().unwrap_or("no reason given");
    html! {
        @match ack_state(instance) {
            "ack" => span.badge.good.ack { "ACK" },
            "nack" => span.badge.bad.ack title=(reason) {
                "NACK v" (instance.version.unwrap_or(0)) ": " (reason)
            },
            _ => span.badge.wait.ack { "waiting" },
        }
    }
}

fn on_target_badge(status: &Status) -> Markup {
    let total = status.instances.len();
    let good = status
        .instances
        .iter()
        .filter(|i| i.applied == Some(true) && i.version.is_some() && i.version == i.target)
        .count();
    let class = if total == 0 {
        "muted"
    } else if good == total {
        "good"
    } else {
        "wait"
    };
    html! { span class={"badge " (class)} { (good) " of " (total) } }
}

fn version_or_none(version: Option<u64>) -> Markup {
    html! {
        @match version {
            Some(v) => { "v" (v) },
            None => span.muted { "—" },
        }
    }
}

fn selector_text(selector: &Selector) -> String {
    match selector {
        Selector::Share(percent) => format!("for {percent}% of instances"),
        Selector::Labels(labels) => {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("for instances labelled {}", labels.join(", "))
        }
    }
}

fn canary_text(status: &Status) -> Markup {
    html! {
        @match &status.canary {
            Some((v, selector)) => { "v" (v) " " span.muted { (selector_text(selector)) } },
            None => span.muted { "—" },
        }
    }
}

/// How many of the instances the canary selects: its real share.
fn canary_count(status: &Status) -> String {
    let selected = status
        .instances
        .iter()
        .filter(|i| is_canary(status, i))
        .count();
    format!(
        "{selected} of {} instances selected",
        status.instances.len()
    )
}
