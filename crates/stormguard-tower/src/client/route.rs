//! Which endpoint policy a request follows: route patterns matched by method, host and path.
//!
//! A payment endpoint and a search endpoint of the same downstream should not share one
//! policy: the first must not be retried after a timeout without a key, the second may be
//! retried freely. A [`PolicyFile`](stormguard::policy::PolicyFile) names a policy per
//! endpoint (`"POST /pay"`, `"GET /users/*"`); the most specific pattern that matches a
//! request wins, and the endpoint named [`DEFAULT_ROUTE`] takes the rest.
//!
//! # Route names
//!
//! `"METHOD /path"` or `"/path"` (any method; `"* /path"` says the same). A path ending in
//! `*` is a prefix (`"/users/*"` matches `/users/7` and `/users/`), any other path is exact.
//!
//! A route may name a host before its path, `"GET users.internal/users/*"`: it then matches
//! only requests to that host (the request URI's authority, else its `Host` header; without a
//! port in the pattern, any port; case-insensitive). One policy file can so hold the routes
//! of several downstreams, as a sidecar proxy that calls them all needs. A host has a `.` or
//! a port, or is `localhost`: a single word before the first `/` (`"GET api/users"`) is far
//! likelier a path missing its `/` than a host, and is refused rather than read as one
//! (a one-label service name is written with its port, `"GET users:8080/users/*"`).
//!
//! Specificity: a route naming the host beats one that does not, then an exact path beats a
//! prefix, a longer prefix beats a shorter one, and a route naming its method beats one that
//! does not.

use std::str::FromStr;

use http::Method;

/// The endpoint name in a policy file that holds the policy for unmatched requests.
pub const DEFAULT_ROUTE: &str = "default";

/// Which requests a route applies to: a method (or any) and an exact path or a path prefix;
/// see [`RoutePattern`] for the syntax.
///
/// ```
/// use http::Method;
/// use stormguard_tower::client::RoutePattern;
///
/// let users: RoutePattern = "GET /users/*".parse()?;
/// assert!(users.matches(&Method::GET, "/users/7"));
/// assert!(!users.matches(&Method::POST, "/users/7"));
/// let pay: RoutePattern = "/pay".parse()?;
/// assert!(pay.matches(&Method::POST, "/pay"));
/// assert!(!pay.matches(&Method::POST, "/pay/7"));
/// let hosted: RoutePattern = "GET users.internal/users/*".parse()?;
/// assert!(hosted.matches_host(&Method::GET, Some("users.internal:8080"), "/users/7"));
/// assert!(!hosted.matches_host(&Method::GET, Some("orders.internal"), "/users/7"));
/// assert!(!hosted.matches(&Method::GET, "/users/7")); // no host: a hosted route does not match
/// # Ok::<(), stormguard_tower::client::InvalidRoute>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutePattern {
    method: Option<Method>,
    host: Option<Box<str>>,
    path: PathMatch,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PathMatch {
    Exact(Box<str>),
    Prefix(Box<str>),
}

/// Why an endpoint name is not a route pattern.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRoute {
    /// The name is empty.
    #[error("route is empty")]
    Empty,
    /// The name has more than a method and a path.
    #[error("route {0:?} has more than a method and a path")]
    TooManyParts(String),
    /// The method is not an HTTP method token.
    #[error("route method {0:?} is not an HTTP method")]
    BadMethod(String),
    /// The path does not start with `/`.
    #[error("route path {0:?} does not start with '/'")]
    PathNotAbsolute(String),
    /// A `*` appears other than at the end of the path.
    #[error("route path {0:?} has a '*' before its end")]
    WildcardNotAtEnd(String),
    /// The host before the path is not a host name (letters, digits, `-`, `.`, and an
    /// optional `:port`).
    #[error("route host {0:?} is not a host name")]
    BadHost(String),
    /// The text before the path is one word without a `.` or a port: a path missing its
    /// leading `/`, or a one-label host that must name its port.
    #[error(
        "route {0:?} does not start with '/': a host before the path needs a '.' or a ':port' \
         (\"users:8080/list\"), and a path starts with '/'"
    )]
    HostOrPath(String),
}

impl FromStr for RoutePattern {
    type Err = InvalidRoute;

    fn from_str(s: &str) -> Result<Self, InvalidRoute> {
        let mut parts = s.split_ascii_whitespace();
        let (method, path) = match (parts.next(), parts.next(), parts.next()) {
            (None, _, _) => return Err(InvalidRoute::Empty),
            (Some(path), None, _) => (None, path),
            (Some("*"), Some(path), None) => (None, path),
            (Some(method), Some(path), None) => {
                let method = Method::from_bytes(method.as_bytes())
                    .map_err(|_| InvalidRoute::BadMethod(method.to_owned()))?;
                (Some(method), path)
            }
            (Some(_), Some(_), Some(_)) => return Err(InvalidRoute::TooManyParts(s.to_owned())),
        };
        let (host, path) = match path.find('/') {
            Some(0) => (None, path),
            Some(at) => (Some(parse_host(&path[..at], path)?), &path[at..]),
            None => return Err(InvalidRoute::PathNotAbsolute(path.to_owned())),
        };
        let path = match path.find('*') {
            None => PathMatch::Exact(path.into()),
            Some(at) if at + 1 == path.len() => PathMatch::Prefix(path[..at].into()),
            Some(_) => return Err(InvalidRoute::WildcardNotAtEnd(path.to_owned())),
        };
        Ok(RoutePattern { method, host, path })
    }
}

/// A route's host, lowercased: a name of letters, digits, `-` and `.`, and an optional port;
/// with a `.` or a port, or `localhost` (`route` is the whole host and path, for the error).
fn parse_host(host: &str, route: &str) -> Result<Box<str>, InvalidRoute> {
    let (name, port) = match host.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    };
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok());
    if !(name_ok && port_ok) {
        return Err(InvalidRoute::BadHost(host.to_owned()));
    }
    if port.is_none() && !name.contains('.') && !name.eq_ignore_ascii_case("localhost") {
        return Err(InvalidRoute::HostOrPath(route.to_owned()));
    }
    Ok(host.to_ascii_lowercase().into())
}

/// Whether a request to `host` (as written in a URI authority or a `Host` header) goes to the
/// route host `pattern` (lowercase; without a port it matches any port).
fn host_matches(pattern: &str, host: &str) -> bool {
    if pattern.contains(':') {
        pattern.eq_ignore_ascii_case(host)
    } else {
        let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
        pattern.eq_ignore_ascii_case(name)
    }
}

impl RoutePattern {
    /// Whether a request with this method and path, and no known host, is in the route (a
    /// route that names a host does not match it).
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        self.specificity(method, None, path).is_some()
    }

    /// Whether a request with this method, to `host` (a URI authority or `Host` header value,
    /// port included or not) and with this path is in the route.
    pub fn matches_host(&self, method: &Method, host: Option<&str>, path: &str) -> bool {
        self.specificity(method, host, path).is_some()
    }

    /// How specifically the route matches (greater is more specific), or `None`.
    fn specificity(
        &self,
        method: &Method,
        host: Option<&str>,
        path: &str,
    ) -> Option<(bool, bool, usize, bool)> {
        if self.method.as_ref().is_some_and(|m| m != method) {
            return None;
        }
        if let Some(pattern) = &self.host {
            if !host.is_some_and(|host| host_matches(pattern, host)) {
                return None;
            }
        }
        let (exact, len) = match &self.path {
            PathMatch::Exact(p) => (**p == *path, p.len()),
            PathMatch::Prefix(p) => (false, p.len()),
        };
        let prefix_ok = matches!(&self.path, PathMatch::Prefix(p) if path.starts_with(&**p));
        (exact || prefix_ok).then_some((self.host.is_some(), exact, len, self.method.is_some()))
    }
}

/// The host a request is addressed to: its URI's authority (a proxy's absolute-form or an
/// HTTP/2 `:authority`), else its `Host` header.
pub(crate) fn request_host<B>(request: &http::Request<B>) -> Option<&str> {
    request.uri().authority().map(|a| a.as_str()).or_else(|| {
        request
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
    })
}

/// The index of the most specific route that matches, if any.
pub(crate) fn best_match<'a, T: 'a>(
    routes: impl IntoIterator<Item = (&'a RoutePattern, T)>,
    method: &Method,
    host: Option<&str>,
    path: &str,
) -> Option<T> {
    routes
        .into_iter()
        .filter_map(|(pattern, item)| pattern.specificity(method, host, path).map(|s| (s, item)))
        .fold(
            None::<((bool, bool, usize, bool), T)>,
            |best, (s, item)| match best {
                Some((b, _)) if b >= s => best,
                _ => Some((s, item)),
            },
        )
        .map(|(_, item)| item)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> RoutePattern {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn each_broken_rule_is_named() {
        assert_eq!("".parse::<RoutePattern>(), Err(InvalidRoute::Empty));
        assert_eq!("  ".parse::<RoutePattern>(), Err(InvalidRoute::Empty));
        assert!(matches!(
            "GET /a b".parse::<RoutePattern>(),
            Err(InvalidRoute::TooManyParts(_))
        ));
        assert!(matches!(
            "G(T /a".parse::<RoutePattern>(),
            Err(InvalidRoute::BadMethod(_))
        ));
        assert!(matches!(
            "GET a".parse::<RoutePattern>(),
            Err(InvalidRoute::PathNotAbsolute(_))
        ));
        assert!(matches!(
            "/a/*/b".parse::<RoutePattern>(),
            Err(InvalidRoute::WildcardNotAtEnd(_))
        ));
    }

    #[test]
    fn the_most_specific_route_wins() {
        let routes = [
            p("/*"),
            p("/users/*"),
            p("GET /users/*"),
            p("GET /users/me"),
            p("* /users/me"),
        ];
        let pick = |m: Method, path: &str| best_match(routes.iter().zip(0..), &m, None, path);
        assert_eq!(pick(Method::GET, "/users/me"), Some(3));
        assert_eq!(pick(Method::POST, "/users/me"), Some(4));
        assert_eq!(pick(Method::GET, "/users/7"), Some(2));
        assert_eq!(pick(Method::POST, "/users/7"), Some(1));
        assert_eq!(pick(Method::POST, "/orders"), Some(0));
        assert_eq!(
            best_match(routes[1..].iter().zip(0..), &Method::GET, None, "/x"),
            None
        );
    }

    #[test]
    fn a_route_naming_the_host_beats_one_that_does_not() {
        let routes = [
            p("GET /users/me"),
            p("users.internal/*"),
            p("orders.internal:8080/orders/*"),
        ];
        let pick = |host: Option<&str>, path: &str| {
            best_match(routes.iter().zip(0..), &Method::GET, host, path)
        };
        assert_eq!(pick(Some("USERS.internal:9000"), "/users/me"), Some(1));
        assert_eq!(pick(Some("other"), "/users/me"), Some(0));
        assert_eq!(pick(None, "/users/me"), Some(0));
        assert_eq!(pick(Some("orders.internal:8080"), "/orders/1"), Some(2));
        assert_eq!(pick(Some("orders.internal:8081"), "/orders/1"), None);
        assert_eq!(pick(Some("orders.internal"), "/orders/1"), None);
        assert!(matches!(
            "GET us_ers/x".parse::<RoutePattern>(),
            Err(InvalidRoute::BadHost(_))
        ));
        assert!(matches!(
            "a:99999/x".parse::<RoutePattern>(),
            Err(InvalidRoute::BadHost(_))
        ));
    }

    #[test]
    fn a_single_word_before_the_path_is_refused_unless_it_names_a_port() {
        let typo = "GET api/users"
            .parse::<RoutePattern>()
            .expect_err("a path without its slash");
        assert_eq!(typo, InvalidRoute::HostOrPath("api/users".to_owned()));
        assert!(typo.to_string().contains("starts with '/'"), "{typo}");
        let one_label: RoutePattern = "GET users:8080/list"
            .parse()
            .expect("a one-label host with a port");
        assert!(one_label.matches_host(&Method::GET, Some("users:8080"), "/list"));
        let local: RoutePattern = "GET LocalHost/list".parse().expect("localhost");
        assert!(local.matches_host(&Method::GET, Some("localhost:3000"), "/list"));
        assert!("GET users.internal/list".parse::<RoutePattern>().is_ok());
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in "\\PC{0,40}", method in "[A-Z]{1,7}", path in "/[a-z/*]{0,12}") {
            let _ = s.parse::<RoutePattern>();
            if let Ok(pattern) = format!("{method} {path}").parse::<RoutePattern>() {
                let _ = pattern.matches(&Method::GET, &path);
            }
        }

        #[test]
        fn an_exact_route_matches_its_own_path(method in "[A-Z]{1,7}", path in "/[a-z/]{0,12}") {
            let pattern: RoutePattern = format!("{method} {path}").parse().expect("valid");
            let m = Method::from_bytes(method.as_bytes()).expect("token");
            prop_assert!(pattern.matches(&m, &path));
            let prefix: RoutePattern = format!("{method} {path}*").parse().expect("valid");
            let longer = format!("{path}x");
            prop_assert!(prefix.matches(&m, &longer));
        }
    }
}
