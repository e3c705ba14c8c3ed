//! What every page shares: the frame (header, tabs, sign-out), the error page, and how
//! times and states are written.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{DOCTYPE, Markup, html};

use super::session::Signed;
use crate::error::ApiError;
use crate::server::now_ms;

/// The tabs of a service's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tab {
    Overview,
    History,
    Publish,
    Rules,
}

impl Tab {
    const ALL: [Tab; 4] = [Tab::Overview, Tab::History, Tab::Publish, Tab::Rules];

    fn label(self) -> &'static str {
        match self {
            Tab::Overview => "Overview",
            Tab::History => "History",
            Tab::Publish => "Publish",
            Tab::Rules => "Rules",
        }
    }

    /// The tab's address for `service`.
    pub(crate) fn href(self, service: &str) -> String {
        match self {
            Tab::Overview => format!("/ui/services/{service}"),
            Tab::History => format!("/ui/services/{service}/history"),
            Tab::Publish => format!("/ui/services/{service}/publish"),
            Tab::Rules => format!("/ui/services/{service}/rules"),
        }
    }
}

/// A whole page: the header (who is signed in, sign out), the service's tabs when it is a
/// service's page, and `body`.
pub(crate) fn layout(
    title: &str,
    signed: Option<&Signed>,
    service: Option<(&str, Tab)>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · stormguard" }
                link rel="stylesheet" href="/ui/assets/style.css";
                script src="/ui/assets/live.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/ui" { "stormguard" span.muted { " policy center" } }
                    @if let Some(signed) = signed {
                        div.who {
                            span { "Signed in as " strong #who { (signed.caller.name) } " " span.role { (signed.caller.role.as_str()) } }
                            form.inline method="post" action="/ui/logout" {
                                input type="hidden" name="csrf" value=(signed.csrf);
                                button.link type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main {
                    @if let Some((service, current)) = service {
                        nav.crumbs { a href="/ui" { "Services" } " / " strong { (service) } }
                        nav.tabs {
                            @for tab in Tab::ALL {
                                a.tab.current[tab == current] href=(tab.href(service)) { (tab.label()) }
                            }
                        }
                    }
                    (body)
                }
            }
        }
    }
}

/// Why a page is not shown: not signed in (to the sign-in page), or the API's refusal
/// (an HTML page with its status and message).
#[derive(Debug)]
pub(crate) enum Failure {
    SignIn,
    Api(ApiError),
}

impl From<ApiError> for Failure {
    fn from(error: ApiError) -> Failure {
        Failure::Api(error)
    }
}

impl From<crate::store::StoreError> for Failure {
    fn from(error: crate::store::StoreError) -> Failure {
        Failure::Api(error.into())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        match self {
            Failure::SignIn => Redirect::to("/ui/login").into_response(),
            Failure::Api(error) => {
                let status = error.status();
                let body = html! {
                    section.card {
                        h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
                        p.notice.bad role="alert" { (error) }
                        p { a href="/ui" { "Back to the services" } }
                    }
                };
                html_response(status, layout("Error", None, None, body))
            }
        }
    }
}

/// A page with the dashboard's headers: never cached (it shows live state), never framed,
/// scripts and styles from the center only.
pub(crate) fn html_response(status: StatusCode, page: Markup) -> Response {
    let mut response = (status, page).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// `2026-12-02 23:04:05 UTC` for a time in milliseconds since the Unix epoch.
pub(crate) fn utc(at_ms: i64) -> String {
    let secs = at_ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a day number (days since 1970-01-01): H. Hinnant's
/// `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

/// `4 s ago`, `3 min ago`, `2 h ago`, `5 d ago` (`just now` under a second).
pub(crate) fn ago(at_ms: i64) -> String {
    let secs = (now_ms() - at_ms).max(0) / 1000;
    match secs {
        0 => "just now".to_owned(),
        1..=119 => format!("{secs} s ago"),
        120..=7199 => format!("{} min ago", secs / 60),
        7200..=172_799 => format!("{} h ago", secs / 3600),
        _ => format!("{} d ago", secs / 86_400),
    }
}

/// A time as `3 min ago`, with the exact UTC time on hover.
pub(crate) fn when(at_ms: i64) -> Markup {
    html! { time datetime=(utc(at_ms)) title=(utc(at_ms)) { (ago(at_ms)) } }
}

/// `rule:cdn-504` shows as a rule, anyone else as their token's name.
pub(crate) fn author(name: &str) -> Markup {
    html! {
        @match name.strip_prefix("rule:") {
            Some(rule) => { span.badge.rule { "rule" } " " (rule) },
            None => (name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_are_gregorian() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_798_931_045_000), "2027-01-02 23:04:05 UTC");
        assert_eq!(utc(-1000), "1969-12-31 23:59:59 UTC");
    }
}
