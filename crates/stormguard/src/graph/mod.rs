//! Call graphs: which services call which endpoints, with which policy, and how fast those
//! endpoints answer.
//!
//! # Why a graph
//!
//! A policy is judged by where it sits. Three retries are harmless on a leaf call and a
//! 27-fold storm three layers up; a 5 s timeout is reasonable over a downstream whose P99 is
//! 4 s and a review finding over one whose P99 is 1.8 s. A policy file alone cannot say
//! which, so the governance tools (the [`lint`](crate::lint) rules, the policy review of
//! [`lint::review`](crate::lint::review)) read a [`CallGraph`]: services, their endpoints,
//! each endpoint's outgoing calls with the [`EndpointPolicy`] that governs the call, and what
//! is known of each endpoint's latency, failure rate and request rate.
//!
//! This module lives in the core crate beside [`policy`](crate::policy) because the graph
//! *is* policy data (its policies are the production [`EndpointPolicy`] values, read by the
//! same loader) and because the linter, the reviewer and the simulator all read it: the core
//! is the one crate every one of them depends on.
//!
//! # The file
//!
//! TOML or JSON of the same shape, known by the file's extension:
//!
//! ```toml
//! [services.web]
//! retry_signal = true          # sends X-Retry-Exhausted when it gives up, honours it from below
//! workers = 200                # requests worked on at once (default: no limit)
//! queue = 1000                 # requests waiting for a worker (default: no limit)
//! honours_deadline = true      # drops work whose caller's deadline passed (default)
//!
//! [services.web.endpoints."GET /checkout"]
//! requests_per_sec = 200
//!
//! [[services.web.endpoints."GET /checkout".calls]]
//! to = "pay"                    # the service called
//! endpoint = "POST /pay"        # its endpoint
//! policy_ref = "policies.toml#POST /pay"   # a policy file (relative to this file) and endpoint
//! idempotency_key = true        # the call sends an Idempotency-Key
//!
//! [services.pay.endpoints."POST /pay"]
//! idempotent = false            # default: true for GET, HEAD, OPTIONS, PUT, DELETE names
//! latency = { p50 = "300ms", p99 = "1.8s", p999 = "2.5s" }
//! failure_rate = 0.002
//! ```
//!
//! A call's policy is either a reference (`policy_ref = "FILE#ENDPOINT"`, the file read by
//! [`PolicyFile::load`]) or written inline (`policy = { retry = { max_attempts = 2 }, … }`,
//! the same fields as an endpoint of a policy file); exactly one of the two. A call's
//! `retry_on` lists the HTTP statuses its client retries (default `[502, 503, 504]`, what
//! [`classify`](crate::classify) retries).
//!
//! An endpoint's latency is given as percentiles (`p50`, `p90`, `p99`, `p999`, each
//! optional; none below an earlier one) or as a histogram,
//! `histogram = [{ le = "100ms", count = 950 }, …]`: each bucket counts the requests that
//! took at most `le` and more than the bucket before it (not cumulative), and the
//! percentiles are read from it as the upper bound of the bucket where the cumulative count
//! reaches them.
//!
//! Calls must not form a cycle, no path may make more than [`MAX_DEPTH`] calls, and every
//! call must name a service and endpoint the graph has. A file that breaks a rule is refused with a [`GraphError`] naming the file, line,
//! column and field, like the policy loader's.
//!
//! ```
//! use stormguard::graph::CallGraph;
//!
//! let graph = CallGraph::from_toml(r#"
//!     [[services.web.endpoints."GET /".calls]]
//!     to = "db"
//!     endpoint = "GET /row"
//!     policy = { retry = { max_attempts = 2 }, timeouts = { per_try = "100ms" } }
//!
//!     [services.db.endpoints."GET /row"]
//!     latency = { p99 = "40ms" }
//! "#)?;
//! let call = &graph.service("web").unwrap().endpoints["GET /"].calls[0];
//! assert_eq!(call.policy.retry().max_attempts(), 2);
//! assert_eq!(graph.callee(call).unwrap().latency.p99.unwrap().as_millis(), 40);
//! # Ok::<(), stormguard::graph::GraphError>(())
//! ```

mod error;
mod raw;
mod walk;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::policy::{EndpointPolicy, Location, PolicyFile};

pub use error::GraphError;
pub use walk::{EndpointId, MAX_DEPTH};

/// The statuses a call retries when its graph entry does not say: 502, 503 and 504.
pub const DEFAULT_RETRY_ON: [u16; 3] = [502, 503, 504];

/// A validated call graph (see the [module docs](self) for the file).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallGraph {
    services: BTreeMap<String, Service>,
    source: Option<Source>,
}

/// The text a graph was read from, kept so findings can be placed at a line.
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    /// The file, when read from one.
    pub file: Option<PathBuf>,
    /// The text.
    pub text: String,
    /// Whether the text is JSON (else TOML).
    pub json: bool,
}

impl Source {
    /// Where the text writes `field` (a dotted path with quoted names, as a
    /// [`Call::field`] or a policy error holds one): the line and column of that field or of
    /// the nearest enclosing table the text writes.
    pub fn locate(&self, field: &str) -> Location {
        raw::locate(self, field)
    }
}

/// One service of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Service {
    /// Whether the service's client stack says "don't retry" upstream when it gives up
    /// (`X-Retry-Exhausted: true`) and honours that signal from below, so only one layer of
    /// a path retries.
    pub retry_signal: bool,
    /// Requests it works on at once (threads, worker tasks); `None`: no limit. Read by the
    /// simulator (`stormguard simulate policy`), where a request holds its worker while it
    /// works and while it waits for its own calls.
    pub workers: Option<u32>,
    /// Requests that may wait for a worker (FIFO) when all are busy; `None`: no limit. A
    /// request that finds the queue full is refused with a 503.
    pub queue: Option<u32>,
    /// Whether the service reads the deadline its callers send (as stormguard's server
    /// deadline layer does): it refuses a request whose deadline passed while it waited,
    /// and stops working on one when its deadline passes. Default `true`.
    pub honours_deadline: bool,
    /// Its endpoints, by name.
    pub endpoints: BTreeMap<String, Endpoint>,
}

impl Default for Service {
    fn default() -> Self {
        Service {
            retry_signal: false,
            workers: None,
            queue: None,
            honours_deadline: true,
            endpoints: BTreeMap::new(),
        }
    }
}

/// One endpoint: what is known of it, and the calls it makes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Endpoint {
    /// Whether doing it twice is the same as once (GET, PUT, DELETE…).
    pub idempotent: bool,
    /// Its latency, as far as known.
    pub latency: Latency,
    /// The histogram the latency was read from, when the file gave one (empty otherwise).
    pub histogram: Vec<Bucket>,
    /// The share of its calls that fail, 0..=1.
    pub failure_rate: Option<f64>,
    /// Requests per second it serves.
    pub requests_per_sec: Option<f64>,
    /// The calls it makes, in file order.
    pub calls: Vec<Call>,
}

/// Latency percentiles of an endpoint; each is optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    /// The median.
    pub p50: Option<Duration>,
    /// The 90th percentile.
    pub p90: Option<Duration>,
    /// The 99th percentile.
    pub p99: Option<Duration>,
    /// The 99.9th percentile.
    pub p999: Option<Duration>,
}

/// One bucket of a latency histogram: `count` requests took at most `le` and more than the
/// bucket before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// The bucket's upper bound.
    pub le: Duration,
    /// Requests in it.
    pub count: u64,
}

/// One call from an endpoint to another service's endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The service called.
    pub service: String,
    /// Its endpoint.
    pub endpoint: String,
    /// The policy the call is made with.
    pub policy: EndpointPolicy,
    /// Where that policy was written.
    pub origin: PolicyOrigin,
    /// Whether the call sends an Idempotency-Key.
    pub idempotency_key: bool,
    /// The HTTP statuses its client retries.
    pub retry_on: Vec<u16>,
    /// The field path of this call in the graph file: `services."web".endpoints."GET /".calls[0]`.
    pub field: String,
}

/// Where a call's policy was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyOrigin {
    /// Inline in the graph file, at the call's `policy` field.
    Inline,
    /// In a policy file, under this endpoint name.
    File {
        /// The policy file (as resolved from the graph file's folder).
        path: PathBuf,
        /// The endpoint name in it.
        endpoint: String,
    },
}

impl CallGraph {
    /// Reads, parses and validates the graph at `path` (TOML for `.toml`, JSON for `.json`);
    /// policy files named by `policy_ref` are read relative to its folder.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, GraphError> {
        raw::load(path.as_ref())
    }

    /// Parses and validates a TOML graph; `policy_ref` paths are relative to the current
    /// directory.
    pub fn from_toml(text: &str) -> Result<Self, GraphError> {
        raw::parse(text, false, None)
    }

    /// Parses and validates a JSON graph; `policy_ref` paths are relative to the current
    /// directory.
    pub fn from_json(text: &str) -> Result<Self, GraphError> {
        raw::parse(text, true, None)
    }

    /// Every service, by name.
    pub fn services(&self) -> &BTreeMap<String, Service> {
        &self.services
    }

    /// One service.
    pub fn service(&self, name: &str) -> Option<&Service> {
        self.services.get(name)
    }

    /// The endpoint a call goes to (always there in a validated graph).
    pub fn callee(&self, call: &Call) -> Option<&Endpoint> {
        self.services
            .get(&call.service)
            .and_then(|s| s.endpoints.get(&call.endpoint))
    }

    /// The text the graph was read from, when it was read from text.
    pub fn source(&self) -> Option<&Source> {
        self.source.as_ref()
    }

    /// This graph with the policies of `file` in place of those its calls refer to by the
    /// same endpoint name (`policy_ref = "…#NAME"`): how a proposed version of a policy file
    /// would sit in the graph. `path` becomes those calls' policy file.
    pub fn with_policy_file(&self, file: &PolicyFile, path: &Path) -> CallGraph {
        let mut graph = self.clone();
        for service in graph.services.values_mut() {
            for endpoint in service.endpoints.values_mut() {
                for call in &mut endpoint.calls {
                    let PolicyOrigin::File { endpoint: name, .. } = &call.origin else {
                        continue;
                    };
                    if let Some(policy) = file.endpoint(name) {
                        call.policy = policy.clone();
                        call.origin = PolicyOrigin::File {
                            path: path.to_owned(),
                            endpoint: name.clone(),
                        };
                    }
                }
            }
        }
        graph
    }

    /// Every call with the service and endpoint that makes it.
    pub fn calls(&self) -> impl Iterator<Item = (&str, &str, &Call)> {
        self.services.iter().flat_map(|(service, s)| {
            s.endpoints.iter().flat_map(move |(name, e)| {
                e.calls
                    .iter()
                    .map(move |call| (service.as_str(), name.as_str(), call))
            })
        })
    }
}

/// Whether an endpoint named like `"GET /x"` is idempotent by its HTTP method: GET, HEAD,
/// OPTIONS, PUT and DELETE are (RFC 9110 §9.2.2); POST, PATCH and a name without a method
/// are not.
///
/// ```
/// use stormguard::graph::idempotent_by_name;
/// assert!(idempotent_by_name("PUT /users/1"));
/// assert!(!idempotent_by_name("POST /pay"));
/// ```
pub fn idempotent_by_name(name: &str) -> bool {
    let method = name.split_whitespace().next().unwrap_or("");
    ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]
        .iter()
        .any(|m| m.eq_ignore_ascii_case(method))
}

#[cfg(test)]
mod tests;
