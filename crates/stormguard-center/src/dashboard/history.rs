//! A service's history (every version with what it changed, and a rollback button on each
//! older one) and the publish form: both write through the API's own publish path.

use axum::Form;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::page::{Failure, Tab, author, html_response, layout, when};
use super::session::Signed;
use crate::api::check_name;
use crate::api::versions::{Publish, Rollback, end_canary_as, publish_text, roll_back};
use crate::error::ApiError;
use crate::server::Center;
use crate::version::Version;

/// How many versions the history page shows.
const HISTORY_PAGE: u32 = 100;

/// The body of a rollback button's form.
#[derive(Debug, Deserialize)]
pub(crate) struct RollbackForm {
    csrf: String,
    base: u64,
    to: u64,
}

/// The body of the publish form.
#[derive(Debug, Deserialize)]
pub(crate) struct PublishForm {
    csrf: String,
    base: u64,
    policy: String,
    #[serde(default)]
    message: String,
    /// A canary share in percent; empty publishes for every instance.
    #[serde(default)]
    share: String,
}

pub(crate) async fn history(
    State(center): State<Center>,
    signed: Signed,
    Path(service): Path<String>,
) -> Result<Response, Failure> {
    check_name("service", &service)?;
    let versions: Vec<Version> = center
        .store()
        .history(&service, HISTORY_PAGE)
        .await?
        .into_iter()
        .map(Version::from)
        .collect();
    Ok(history_page(
        &signed,
        &service,
        &versions,
        None,
        StatusCode::OK,
    ))
}

fn history_page(
    signed: &Signed,
    service: &str,
    versions: &[Version],
    error: Option<&ApiError>,
    status: StatusCode,
) -> Response {
    let latest = versions.first().map_or(0, |v| v.version);
    let body = html! {
        h1 { "History" }
        @if let Some(error) = error { p.notice.bad role="alert" { (error) } }
        @if !signed.may_edit() {
            p.notice { "You are signed in as a " (signed.caller.role.as_str()) ": you can read the history; rolling back needs an editor token." }
        }
        @if versions.is_empty() { p.muted { "Nothing published yet." } }
        table.history {
            thead { tr { th { "Version" } th { "Published" } th { "By" } th { "Message" } th { "What changed" } th {} } }
            tbody {
                @for version in versions {
                    tr #(format!("v{}", version.version)) {
                        td { strong { "v" (version.version) } @if version.version == latest { " " span.badge.good { "latest" } } }
                        td { (when(version.created_ms)) }
                        td { (author(&version.author)) }
                        td { (version.message) @if let Some(of) = version.rollback_of { " " span.badge.muted { "rollback of v" (of) } } }
                        td { (diff(version)) }
                        td {
                            @if signed.may_edit() && version.version != latest {
                                form.inline method="post" action=(format!("/ui/services/{service}/rollback")) {
                                    input type="hidden" name="csrf" value=(signed.csrf);
                                    input type="hidden" name="base" value=(latest);
                                    input type="hidden" name="to" value=(version.version);
                                    button.rollback type="submit" title=(format!("Publish v{}'s policies again as v{}", version.version, latest + 1)) { "Roll back to v" (version.version) }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    html_response(
        status,
        layout(
            &format!("{service} history"),
            Some(signed),
            Some((service, Tab::History)),
            body,
        ),
    )
}

fn diff(version: &Version) -> Markup {
    html! {
        @if version.diff.is_empty() {
            span.muted { "no change" }
        } @else if version.diff.len() > FOLDED_DIFF {
            details.diff {
                summary { (version.diff.len()) " fields " @if version.diff.iter().all(|c| c.old.is_none()) { "set" } @else { "changed" } }
                (changes(version))
            }
        } @else {
            (changes(version))
        }
    }
}

/// Past this many changed fields a version's diff is folded (a first version sets them all).
const FOLDED_DIFF: usize = 8;

fn changes(version: &Version) -> Markup {
    html! {
        ul.diff {
                @for change in &version.diff {
                    li {
                        code.path { (change.path) } " "
                        @match (&change.old, &change.new) {
                            (Some(old), Some(new)) => { del { (old) } " → " ins { (new) } },
                            (None, Some(new)) => { ins { (new) } " " span.muted { "(added)" } },
                            (Some(old), None) => { del { (old) } " " span.muted { "(removed)" } },
                            (None, None) => {},
                        }
                    }
                }
        }
    }
}

pub(crate) async fn rollback(
    State(center): State<Center>,
    signed: Signed,
    Path(service): Path<String>,
    headers: HeaderMap,
    Form(form): Form<RollbackForm>,
) -> Result<Response, Failure> {
    signed.check_form(&headers, &form.csrf)?;
    let body = Rollback::to(form.base, form.to);
    match roll_back(&center, &signed.caller, &service, &body).await {
        Ok(version) => Ok(published(&service, version.version)),
        Err(error @ (ApiError::Conflict(_) | ApiError::Forbidden(_))) => {
            let versions: Vec<Version> = center
                .store()
                .history(&service, HISTORY_PAGE)
                .await?
                .into_iter()
                .map(Version::from)
                .collect();
            let status = error.status();
            Ok(history_page(
                &signed,
                &service,
                &versions,
                Some(&error),
                status,
            ))
        }
        Err(other) => Err(other.into()),
    }
}

/// After a change: the overview, which shows the instances picking it up.
fn published(service: &str, version: u64) -> Response {
    Redirect::to(&format!("/ui/services/{service}?published={version}")).into_response()
}

pub(crate) async fn publish_page(
    State(center): State<Center>,
    signed: Signed,
    Path(service): Path<String>,
) -> Result<Response, Failure> {
    check_name("service", &service)?;
    let latest = center.store().latest(&service).await?;
    let (base, policy) = latest.map_or((0, String::new()), |row| (row.version(), row.policy));
    Ok(publish_form(
        &signed,
        &service,
        base,
        &policy,
        "",
        None,
        StatusCode::OK,
    ))
}

fn publish_form(
    signed: &Signed,
    service: &str,
    base: u64,
    policy: &str,
    message: &str,
    error: Option<&ApiError>,
    status: StatusCode,
) -> Response {
    let body = html! {
        h1 { "Publish a new version" }
        @if let Some(error) = error { p.notice.bad role="alert" { (error) } }
        @if signed.may_edit() {
            p.muted { "Edit the policies (TOML) and publish: the center checks and lints them, writes version " (base + 1) " on top of v" (base) " (refused if someone published meanwhile), and pushes it to every instance." }
            form.publish method="post" action=(format!("/ui/services/{service}/publish")) {
                input type="hidden" name="csrf" value=(signed.csrf);
                input type="hidden" name="base" value=(base);
                label for="policy" { "Policies" }
                textarea #policy name="policy" rows="18" spellcheck="false" required { (policy) }
                label for="message" { "Why (shown in the history)" }
                input #message type="text" name="message" value=(message) maxlength="4096" placeholder="e.g. fewer retries to the image CDN during the incident";
                label for="share" { "Canary share (optional)" }
                div.row {
                    input #share type="number" name="share" min="0" max="100" placeholder="all";
                    span.muted { "% of instances; leave empty to publish for every instance" }
                }
                button.primary type="submit" { "Publish v" (base + 1) }
            }
        } @else {
            p.notice { "You are signed in as a " (signed.caller.role.as_str()) ": publishing needs an editor token. The latest policies are shown below." }
            pre.policy { (policy) }
        }
    };
    html_response(
        status,
        layout(
            &format!("Publish {service}"),
            Some(signed),
            Some((service, Tab::Publish)),
            body,
        ),
    )
}

pub(crate) async fn publish(
    State(center): State<Center>,
    signed: Signed,
    Path(service): Path<String>,
    headers: HeaderMap,
    Form(form): Form<PublishForm>,
) -> Result<Response, Failure> {
    signed.check_form(&headers, &form.csrf)?;
    let share = match form.share.trim() {
        "" => None,
        text => match text.parse::<u8>() {
            Ok(percent) if percent <= 100 => Some(percent),
            _ => {
                let error = ApiError::BadRequest(format!(
                    "canary share {text:?}: expected a whole number from 0 to 100, or nothing"
                ));
                return Ok(publish_form(
                    &signed,
                    &service,
                    form.base,
                    &form.policy,
                    &form.message,
                    Some(&error),
                    StatusCode::BAD_REQUEST,
                ));
            }
        },
    };
    // Browsers send a textarea's lines with CRLF; the policy text is TOML either way.
    let policy = form.policy.replace("\r\n", "\n");
    let body = Publish::toml(form.base, policy, form.message.clone(), share);
    match publish_text(&center, &signed.caller, &service, &body).await {
        Ok(version) => Ok(published(&service, version.version)),
        Err(error) if error.status().is_client_error() => Ok(publish_form(
            &signed,
            &service,
            form.base,
            &form.policy,
            &form.message,
            Some(&error),
            error.status(),
        )),
        Err(other) => Err(other.into()),
    }
}

/// The body of a canary step's form.
#[derive(Debug, Deserialize)]
pub(crate) struct StepForm {
    csrf: String,
    /// The canary the page showed (a page served before the field existed has none).
    version: Option<u64>,
}

pub(crate) async fn canary_step(
    State(center): State<Center>,
    signed: Signed,
    Path((service, step)): Path<(String, String)>,
    headers: HeaderMap,
    Form(form): Form<StepForm>,
) -> Result<Response, Failure> {
    signed.check_form(&headers, &form.csrf)?;
    let promote = match step.as_str() {
        "promote" => true,
        "abort" => false,
        other => {
            return Err(ApiError::NotFound(format!("no canary step {other:?}")).into());
        }
    };
    end_canary_as(&center, &signed.caller, &service, "", promote, form.version).await?;
    Ok(Redirect::to(&Tab::Overview.href(&service)).into_response())
}
