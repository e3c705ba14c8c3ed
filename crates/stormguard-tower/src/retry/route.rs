//! Per-route retry policies, from the core's policy file.
//!
//! A payment endpoint and a search endpoint of the same downstream should not share one
//! retry policy: the first must not be retried after a timeout without a key, the second
//! may be retried freely. The core's [`PolicyFile`] names a policy per endpoint
//! (`"POST /pay"`); [`Routes`] maps each request to one of them by method and path.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use stormguard::budget::RetryBudget;
use stormguard::clock::Clock;
use stormguard::policy::{EndpointPolicy, PolicyError, PolicyFile};
use stormguard::retry::RetryPolicy;

/// The endpoint name in a policy file that holds the policy for unmatched requests.
pub const DEFAULT_ROUTE: &str = "default";

/// Which requests a route applies to: a method (or any) and an exact path or a path prefix;
/// see [`Routes`](Routes#route-names) for the syntax.
///
/// ```
/// use http::Method;
/// use stormguard_tower::retry::RoutePattern;
///
/// let users: RoutePattern = "GET /users/*".parse()?;
/// assert!(users.matches(&Method::GET, "/users/7"));
/// assert!(!users.matches(&Method::POST, "/users/7"));
/// let pay: RoutePattern = "/pay".parse()?;
/// assert!(pay.matches(&Method::POST, "/pay"));
/// assert!(!pay.matches(&Method::POST, "/pay/7"));
/// # Ok::<(), stormguard_tower::retry::InvalidRoute>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutePattern {
    method: Option<Method>,
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
        if !path.starts_with('/') {
            return Err(InvalidRoute::PathNotAbsolute(path.to_owned()));
        }
        let path = match path.find('*') {
            None => PathMatch::Exact(path.into()),
            Some(at) if at + 1 == path.len() => PathMatch::Prefix(path[..at].into()),
            Some(_) => return Err(InvalidRoute::WildcardNotAtEnd(path.to_owned())),
        };
        Ok(RoutePattern { method, path })
    }
}

impl RoutePattern {
    /// Whether a request with this method and path is in the route.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        self.specificity(method, path).is_some()
    }

    /// How specifically the route matches (greater is more specific), or `None`.
    fn specificity(&self, method: &Method, path: &str) -> Option<(bool, usize, bool)> {
        if self.method.as_ref().is_some_and(|m| m != method) {
            return None;
        }
        let (exact, len) = match &self.path {
            PathMatch::Exact(p) => (**p == *path, p.len()),
            PathMatch::Prefix(p) => (false, p.len()),
        };
        let prefix_ok = matches!(&self.path, PathMatch::Prefix(p) if path.starts_with(&**p));
        (exact || prefix_ok).then_some((exact, len, self.method.is_some()))
    }
}

/// One route's policy, ready to run: the retry policy, the overall timeout and the budget
/// its callers share.
#[derive(Clone)]
pub(crate) struct RoutePolicy {
    pub(crate) retry: RetryPolicy,
    pub(crate) overall: Option<Duration>,
    pub(crate) budget: Option<Arc<dyn RetryBudget>>,
}

impl std::fmt::Debug for RoutePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutePolicy")
            .field("retry", &self.retry)
            .field("overall", &self.overall)
            .field("budget", &self.budget.is_some())
            .finish()
    }
}

impl RoutePolicy {
    fn from_endpoint(policy: &EndpointPolicy, clock: &Clock) -> Result<Self, PolicyError> {
        let budget = match policy.budget() {
            Some(config) => Some(config.build(clock.clone())?),
            None => None,
        };
        Ok(RoutePolicy {
            retry: *policy.retry(),
            overall: policy.overall_timeout(),
            budget,
        })
    }
}

/// A policy loaded for a route was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// The policy file (or an endpoint policy's budget) is invalid.
    #[error(transparent)]
    Config(#[from] PolicyError),
    /// An endpoint name is not a route pattern.
    #[error("endpoint {name:?}: {source}")]
    Pattern {
        /// The endpoint name.
        name: String,
        /// What is wrong with it.
        source: InvalidRoute,
    },
}

/// Retry policies by route, and the policy for everything else.
///
/// # Route names
///
/// An endpoint name is `"METHOD /path"`, `"* /path"` or `"/path"` (any method). A path
/// ending in `*` matches every path that starts with what comes before the `*`
/// (`"/users/*"` matches `/users/7`). When several routes match, the most specific wins:
/// an exact path over a prefix, a longer prefix over a shorter one, a named method over any
/// method. The endpoint named [`DEFAULT_ROUTE`] (`default`) is the policy for requests no
/// route matches. A gRPC method is a path too: `"/shop.Orders/Get"` or `"/shop.Orders/*"`.
///
/// # Budgets
///
/// Each route's budget is built once, here, and shared by every service the layer makes:
/// a budget is per downstream, not per connection or per clone.
///
/// ```
/// use stormguard::clock::Clock;
/// use stormguard::policy::PolicyFile;
/// use stormguard_tower::retry::Routes;
///
/// let file = PolicyFile::from_toml(r#"
///     [endpoints.default]
///     retry = { max_attempts = 2 }
///
///     [endpoints."GET /users/*"]
///     idempotency = "idempotent"
///     retry = { max_attempts = 4 }
///     budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
/// "#)?;
/// let routes = Routes::from_policy_file(&file, Clock::system())?;
/// assert_eq!(routes.len(), 1);
/// assert!(routes.has_default());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Routes {
    routes: Vec<(RoutePattern, RoutePolicy)>,
    default: Option<RoutePolicy>,
}

impl Routes {
    /// No routes: every request gets the layer's own policy.
    pub fn new() -> Self {
        Routes::default()
    }

    /// Adds a route; `pattern` as described [above](Routes#route-names). The policy's budget,
    /// if it names one, is built now with `Clock::default()`.
    pub fn with_route(
        mut self,
        pattern: &str,
        policy: &EndpointPolicy,
    ) -> Result<Self, RouteError> {
        let parsed = pattern.parse().map_err(|source| RouteError::Pattern {
            name: pattern.to_owned(),
            source,
        })?;
        let policy = RoutePolicy::from_endpoint(policy, &Clock::default())?;
        self.routes.push((parsed, policy));
        Ok(self)
    }

    /// Sets the policy for requests that no route matches (it replaces the layer builder's
    /// policy).
    pub fn with_default(mut self, policy: &EndpointPolicy) -> Result<Self, RouteError> {
        self.default = Some(RoutePolicy::from_endpoint(policy, &Clock::default())?);
        Ok(self)
    }

    /// Validates `file` and makes one route per endpoint; the endpoint named
    /// [`DEFAULT_ROUTE`] becomes the default. `clock` drives ratio budgets' windows.
    pub fn from_policy_file(file: &PolicyFile, clock: Clock) -> Result<Self, RouteError> {
        let mut routes = Routes::new();
        for (name, policy) in file.endpoints().clone() {
            let ready = RoutePolicy::from_endpoint(&policy, &clock)?;
            if name == DEFAULT_ROUTE {
                routes.default = Some(ready);
                continue;
            }
            let pattern = name
                .parse()
                .map_err(|source| RouteError::Pattern { name, source })?;
            routes.routes.push((pattern, ready));
        }
        Ok(routes)
    }

    /// The number of routes (the default not counted).
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether there are no routes (the default not counted).
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Whether a default policy is set.
    pub fn has_default(&self) -> bool {
        self.default.is_some()
    }

    pub(crate) fn into_parts(self) -> (Vec<(RoutePattern, RoutePolicy)>, Option<RoutePolicy>) {
        (self.routes, self.default)
    }
}

/// The index of the most specific route that matches, if any.
pub(crate) fn best_match<'a, T: 'a>(
    routes: impl IntoIterator<Item = (&'a RoutePattern, T)>,
    method: &Method,
    path: &str,
) -> Option<T> {
    routes
        .into_iter()
        .filter_map(|(pattern, item)| pattern.specificity(method, path).map(|s| (s, item)))
        .fold(
            None::<((bool, usize, bool), T)>,
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
        let pick = |m: Method, path: &str| best_match(routes.iter().zip(0..), &m, path);
        assert_eq!(pick(Method::GET, "/users/me"), Some(3));
        assert_eq!(pick(Method::POST, "/users/me"), Some(4));
        assert_eq!(pick(Method::GET, "/users/7"), Some(2));
        assert_eq!(pick(Method::POST, "/users/7"), Some(1));
        assert_eq!(pick(Method::POST, "/orders"), Some(0));
        assert_eq!(
            best_match(routes[1..].iter().zip(0..), &Method::GET, "/x"),
            None
        );
    }

    #[test]
    fn a_policy_file_becomes_routes_and_a_default() {
        let file = PolicyFile::from_toml(
            r#"
            [endpoints.default]
            retry = { max_attempts = 2 }
            [endpoints."POST /pay"]
            retry = { max_attempts = 5 }
            budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
            "#,
        )
        .expect("parses");
        let routes = Routes::from_policy_file(&file, Clock::system()).expect("valid");
        let (list, default) = routes.into_parts();
        assert_eq!(default.map(|d| d.retry.max_attempts()), Some(2));
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].1.retry.max_attempts(), 5);
        assert!(list[0].1.budget.is_some());

        let bad = PolicyFile::from_toml("[endpoints.\"GET nope\"]\n").expect("parses");
        assert!(matches!(
            Routes::from_policy_file(&bad, Clock::system()),
            Err(RouteError::Pattern { .. })
        ));
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
