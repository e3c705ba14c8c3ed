//! Where a request goes: a fixed upstream (`--upstream 127.0.0.1:8080`), or the host the
//! request names (an egress proxy that its callers reach as an HTTP proxy).
//!
//! An ingress proxy sits in front of one service, so its upstream is fixed. An egress proxy
//! serves every outgoing call of its service: a caller configured with
//! `http_proxy=http://127.0.0.1:PORT` (Python's `requests` and `urllib`, curl, Java's
//! `http.proxyHost`) sends each request in absolute form, `GET http://users:8080/users/7`, and
//! the proxy calls `users:8080`; a caller that sends to the proxy's address with a `Host`
//! header gets the same. A fixed upstream on an egress proxy makes it a reverse proxy for one
//! downstream (how the benchmarks run it, beside HAProxy and nginx).

use std::str::FromStr;

use http::uri::{Authority, Scheme};
use http::{Request, Uri};

/// A fixed upstream: `http://host:port` or `host:port` (only cleartext HTTP: the proxy sits
/// on the same host as its service, or the mesh encrypts).
///
/// ```
/// use stormguard_proxy::Upstream;
///
/// let up: Upstream = "127.0.0.1:8080".parse()?;
/// assert_eq!(up.authority(), "127.0.0.1:8080");
/// assert_eq!("http://users.internal:80/".parse::<Upstream>()?.authority(), "users.internal:80");
/// assert!("https://users:443".parse::<Upstream>().is_err());
/// # Ok::<(), stormguard_proxy::InvalidUpstream>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    authority: Authority,
}

/// Why a string is not an upstream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidUpstream {
    /// Not a URI authority (`host:port`) or an `http://` URI.
    #[error("upstream {0:?} is not host:port or http://host:port")]
    Syntax(String),
    /// The scheme is not `http` (TLS to the upstream is not supported).
    #[error("upstream {0:?}: only http:// is supported")]
    Scheme(String),
    /// The URI has a path or query: an upstream is a host and port only.
    #[error("upstream {0:?} has a path; give host:port only")]
    Path(String),
    /// No port: the proxy does not guess one.
    #[error("upstream {0:?} has no port")]
    NoPort(String),
}

impl FromStr for Upstream {
    type Err = InvalidUpstream;

    fn from_str(s: &str) -> Result<Self, InvalidUpstream> {
        let syntax = || InvalidUpstream::Syntax(s.to_owned());
        let uri: Uri = if s.contains("://") {
            s.parse().map_err(|_| syntax())?
        } else {
            format!("http://{s}").parse().map_err(|_| syntax())?
        };
        if uri.scheme() != Some(&Scheme::HTTP) {
            return Err(InvalidUpstream::Scheme(s.to_owned()));
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(InvalidUpstream::Path(s.to_owned()));
        }
        let authority = uri.authority().cloned().ok_or_else(syntax)?;
        if authority.host().is_empty() || authority.as_str().contains('@') {
            return Err(syntax());
        }
        if authority.port_u16().is_none() {
            return Err(InvalidUpstream::NoPort(s.to_owned()));
        }
        Ok(Upstream { authority })
    }
}

impl Upstream {
    /// The upstream's `host:port`.
    pub fn authority(&self) -> &str {
        self.authority.as_str()
    }

    pub(crate) fn authority_ref(&self) -> &Authority {
        &self.authority
    }
}

/// The authority a request names: its URI's (absolute form, HTTP/2 `:authority`) without
/// any userinfo, else its `Host` header.
pub(crate) fn named_authority<B>(request: &Request<B>) -> Option<Authority> {
    if let Some(authority) = request.uri().authority() {
        return without_userinfo(authority);
    }
    request
        .headers()
        .get(http::header::HOST)
        .and_then(|h| Authority::try_from(h.as_bytes()).ok())
}

/// `host:port` of an authority that may carry `user:password@` (which names a host to no
/// one, and is a credential the next hop must not see); `None` when nothing is left of it.
pub(crate) fn without_userinfo(authority: &Authority) -> Option<Authority> {
    match authority.as_str().rsplit_once('@') {
        Some((_, host)) => Authority::try_from(host).ok(),
        None => Some(authority.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_broken_rule_is_named() {
        let err = |s: &str| s.parse::<Upstream>().expect_err(s);
        assert!(matches!(err(""), InvalidUpstream::Syntax(_)));
        assert!(matches!(err("a b:1"), InvalidUpstream::Syntax(_)));
        assert!(matches!(err("https://a:1"), InvalidUpstream::Scheme(_)));
        assert!(matches!(err("http://a:1/x"), InvalidUpstream::Path(_)));
        assert!(matches!(err("a"), InvalidUpstream::NoPort(_)));
        assert!(matches!(err("u@a:1"), InvalidUpstream::Syntax(_)));
        assert_eq!(
            "[::1]:9"
                .parse::<Upstream>()
                .map(|u| u.authority().to_owned()),
            Ok("[::1]:9".to_owned())
        );
    }

    #[test]
    fn userinfo_is_not_part_of_the_named_host() {
        let named = |uri: &str| {
            let request = Request::get(uri).body(()).expect("request");
            named_authority(&request).map(|a| a.as_str().to_owned())
        };
        assert_eq!(
            named("http://u:pw@users:8080/x").as_deref(),
            Some("users:8080")
        );
        assert_eq!(named("http://users:8080/x").as_deref(), Some("users:8080"));
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<Upstream>();
        }

        #[test]
        fn host_and_port_round_trip(host in "[a-z][a-z0-9.-]{0,20}", port in 1u16..) {
            let text = format!("{host}:{port}");
            let up: Upstream = text.parse().expect("valid");
            prop_assert_eq!(up.authority(), text.as_str());
        }
    }
}
