//! Signing in to the dashboard: the bearer token in a cookie, and a form token against
//! cross-site requests.
//!
//! The dashboard keeps no sessions of its own. Signing in checks the token exactly as the API
//! does and stores it in an `HttpOnly`, `SameSite=Strict` cookie scoped to `/ui`; each page
//! then looks the token up again, so a deleted token signs its holder out everywhere, every
//! replica behind a load balancer accepts the cookie, and a viewer's cookie can do exactly
//! what a viewer's token can ([`Caller`]'s checks, the API's own).
//!
//! Every change is a `POST` of a form carrying a token derived from the bearer token (a
//! SHA-256 of it under a fixed label): a page on another site can neither send the cookie
//! (`SameSite=Strict`) nor know the form token. A `POST` whose `Origin` names another host
//! is refused as well, sign-in included (so another site cannot sign a browser in under its
//! own token).

use axum::Form;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::page::{Failure, html_response, layout};
use crate::auth::{Caller, Role};
use crate::error::ApiError;
use crate::server::Center;
use crate::version::hex;

/// The sign-in cookie's name.
const COOKIE: &str = "stormguard_dashboard";
/// How long a sign-in lasts, in seconds (8 hours: a working day).
const MAX_AGE: u32 = 8 * 3600;

/// A signed-in reader of the dashboard: who, and the form token of their pages.
#[derive(Clone, Debug)]
pub(crate) struct Signed {
    pub(crate) caller: Caller,
    pub(crate) csrf: String,
}

impl Signed {
    /// Whether the caller may publish and roll back (what the pages offer).
    pub(crate) fn may_edit(&self) -> bool {
        self.caller.may_edit().is_ok()
    }

    /// Refuses a form whose token is not this caller's, or that came from another site.
    pub(crate) fn check_form(&self, headers: &HeaderMap, csrf: &str) -> Result<(), Failure> {
        same_origin(headers)?;
        if same_bytes(csrf.as_bytes(), self.csrf.as_bytes()) {
            Ok(())
        } else {
            Err(Failure::Api(ApiError::Forbidden(
                "the form's token is missing or stale: reload the page and try again",
            )))
        }
    }
}

/// The form token of a bearer token.
fn form_token(token: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"stormguard dashboard form token\0");
    hash.update(token.as_bytes());
    hex(&hash.finalize())
}

/// Equal, in a time that depends only on the lengths.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The bearer token in the request's sign-in cookie.
fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, token)| token)
        .filter(|token| !token.is_empty())
}

/// Refuses a request whose `Origin` names a host other than the one it was sent to.
///
/// The host it was sent to is `Host`, or, behind a reverse proxy that rewrites `Host` to
/// the center's own address (nginx's default), the `X-Forwarded-Host` the proxy is set to
/// add (`proxy_set_header X-Forwarded-Host $host;` in nginx). A
/// page on another site cannot forge either: a form cannot set headers, and a script that
/// sets one needs a CORS preflight the center never answers.
fn same_origin(headers: &HeaderMap) -> Result<(), Failure> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest);
    let sent_to = |name: &str| {
        headers
            .get(name)
            .and_then(|h| h.to_str().ok())
            // A chain of proxies lists the hosts it saw; the browser's is the first.
            .and_then(|h| h.split(',').next())
            .map(str::trim)
    };
    let hosts = [sent_to("host"), sent_to("x-forwarded-host")];
    match origin_host {
        Some(origin) if hosts.contains(&Some(origin)) => Ok(()),
        _ => Err(Failure::Api(ApiError::Forbidden(
            "the form was sent from another site",
        ))),
    }
}

impl FromRequestParts<Center> for Signed {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, center: &Center) -> Result<Self, Failure> {
        let token = cookie_token(&parts.headers).ok_or(Failure::SignIn)?;
        let caller = match Caller::of_token(center, token).await {
            Ok(caller) => caller,
            Err(ApiError::Unauthorized(_)) => return Err(Failure::SignIn),
            Err(other) => return Err(Failure::Api(other)),
        };
        caller.may_read_all().map_err(|_| Failure::SignIn)?;
        Ok(Signed {
            csrf: form_token(token),
            caller,
        })
    }
}

/// The body of the sign-in form.
#[derive(Debug, Deserialize)]
pub(crate) struct SignIn {
    token: String,
}

/// The body of a form that only carries its form token (sign out).
#[derive(Debug, Deserialize)]
pub(crate) struct Plain {
    csrf: String,
}

pub(crate) async fn sign_in_page() -> Response {
    html_response(StatusCode::OK, sign_in_form(None))
}

fn sign_in_form(error: Option<&str>) -> Markup {
    let body = html! {
        section.signin {
            h1 { "Sign in" }
            p.muted { "Paste a token the center issued (" code { "stormguard center --admin-token" } " or " code { "POST /v1/tokens" } "). Viewers can read; editors and admins can also publish and roll back." }
            @if let Some(error) = error {
                p.notice.bad role="alert" { (error) }
            }
            form method="post" action="/ui/login" {
                label for="token" { "Token" }
                input #token type="password" name="token" autocomplete="off" required placeholder="sg_…" autofocus;
                button.primary type="submit" { "Sign in" }
            }
        }
    };
    layout("Sign in", None, None, body)
}

pub(crate) async fn sign_in(
    State(center): State<Center>,
    headers: HeaderMap,
    Form(form): Form<SignIn>,
) -> Response {
    if let Err(failure) = same_origin(&headers) {
        return failure.into_response();
    }
    let token = form.token.trim();
    let refused = |status: StatusCode, why: &str| html_response(status, sign_in_form(Some(why)));
    if token.is_empty() || token.len() > 256 || token.contains(char::is_whitespace) {
        return refused(
            StatusCode::BAD_REQUEST,
            "That is not a token: expected sg_ and 64 hex digits.",
        );
    }
    if !token.bytes().all(cookie_octet) {
        return refused(
            StatusCode::BAD_REQUEST,
            "This token has characters a cookie cannot carry (quotes, commas, semicolons, backslashes): sign in with a token the center made.",
        );
    }
    match Caller::of_token(&center, token).await {
        Ok(caller) if caller.role == Role::Instance => refused(
            StatusCode::FORBIDDEN,
            "This is an instance token: it can only watch its service. Sign in with a viewer, editor or admin token.",
        ),
        Ok(_) => {
            let secure = if forwarded_https(&headers) {
                "; Secure"
            } else {
                ""
            };
            let cookie = format!(
                "{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={MAX_AGE}{secure}"
            );
            with_cookie(Redirect::to("/ui"), &cookie)
        }
        Err(ApiError::Unauthorized(_)) => refused(
            StatusCode::UNAUTHORIZED,
            "The center does not know this token.",
        ),
        Err(other) => Failure::Api(other).into_response(),
    }
}

pub(crate) async fn sign_out(
    signed: Signed,
    headers: HeaderMap,
    Form(form): Form<Plain>,
) -> Result<Response, Failure> {
    signed.check_form(&headers, &form.csrf)?;
    let cookie = format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0");
    Ok(with_cookie(Redirect::to("/ui/login"), &cookie))
}

/// A byte a cookie value may hold (RFC 6265 §4.1.1 `cookie-octet`).
fn cookie_octet(b: u8) -> bool {
    matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E)
}

/// Whether a proxy in front says the browser used HTTPS (then the cookie is `Secure`).
fn forwarded_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"))
}

fn with_cookie(redirect: Redirect, cookie: &str) -> Response {
    let mut response = redirect.into_response();
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; stormguard_dashboard=sg_x; b=2"),
        );
        assert_eq!(cookie_token(&headers), Some("sg_x"));
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("stormguard_dashboard="),
        );
        assert_eq!(cookie_token(&headers), None);
    }

    #[test]
    fn tokens_the_center_makes_fit_in_a_cookie() {
        assert!(crate::auth::new_token().bytes().all(cookie_octet));
        for bad in [b';', b',', b'"', b'\\', b' '] {
            assert!(!cookie_octet(bad));
        }
    }

    #[test]
    fn a_form_from_another_site_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7450"));
        assert!(same_origin(&headers).is_ok());
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:7450"),
        );
        assert!(same_origin(&headers).is_ok());
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(same_origin(&headers).is_err());
        headers.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(same_origin(&headers).is_err());
        // Behind a proxy that rewrites Host to the center's address, the public host is
        // the one the proxy forwards.
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://center.example"),
        );
        assert!(same_origin(&headers).is_err());
        headers.insert(
            "x-forwarded-host",
            HeaderValue::from_static("center.example, 10.0.0.7"),
        );
        assert!(same_origin(&headers).is_ok());
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(same_origin(&headers).is_err());
    }

    #[test]
    fn form_tokens_differ_by_bearer_token_and_compare_exactly() {
        assert_ne!(form_token("sg_a"), form_token("sg_b"));
        assert!(same_bytes(
            form_token("sg_a").as_bytes(),
            form_token("sg_a").as_bytes()
        ));
        assert!(!same_bytes(b"abc", b"abd"));
        assert!(!same_bytes(b"abc", b"ab"));
    }
}
