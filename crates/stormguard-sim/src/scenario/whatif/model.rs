//! A call graph compiled for the event loop: services, endpoints (nodes) and calls (edges)
//! as flat vectors indexed by number, each call with the production objects its policy
//! builds (retry policy, retry budget, circuit breaker).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use rand::Rng;
use rand::rngs::SmallRng;
use stormguard::breaker::CircuitBreaker;
use stormguard::budget::{RetryBudget, Unlimited};
use stormguard::clock::Clock;
use stormguard::deadline::Reserve;
use stormguard::graph::{CallGraph, Endpoint, Latency};
use stormguard::retry::RetryPolicy;

use crate::error::InvalidParam;
use crate::time::{Nanos, nanos};

/// How long an endpoint works on one request.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Work {
    /// Nothing known: no time.
    Zero,
    /// A histogram: a request takes the upper bound of a bucket drawn by its count.
    Buckets {
        /// Cumulative counts.
        cumulative: Box<[u64]>,
        /// Upper bounds.
        bounds: Box<[Nanos]>,
    },
    /// Percentiles: the quantile function through `(0, 0)`, each known `(q, pq)` and
    /// `(1, the last known)`, linear in between, tabulated at every 1/1000 (the known
    /// quantiles 0.5, 0.9, 0.99 and 0.999 fall on table points, so linear interpolation
    /// between table points is exact). Each entry is a table point and the step to the
    /// next, as the floating-point numbers the interpolation computes with (so a draw does
    /// no integer conversion of them). A fixed-size array, so that reading the entry of a
    /// draw needs no bounds check.
    Quantiles(Box<[(f64, f64); TABLE]>),
}

impl Work {
    fn of(endpoint: &Endpoint) -> Work {
        if !endpoint.histogram.is_empty() {
            let mut seen = 0u64;
            let cumulative = endpoint
                .histogram
                .iter()
                .map(|b| {
                    seen = seen.saturating_add(b.count);
                    seen
                })
                .collect();
            let bounds = endpoint.histogram.iter().map(|b| nanos(b.le)).collect();
            return Work::Buckets { cumulative, bounds };
        }
        let Latency {
            p50,
            p90,
            p99,
            p999,
        } = endpoint.latency;
        let mut knots = vec![(0.0, 0)];
        for (q, p) in [(0.5, p50), (0.9, p90), (0.99, p99), (0.999, p999)] {
            if let Some(p) = p {
                knots.push((q, nanos(p)));
            }
        }
        match knots.last().copied() {
            Some((_, last)) if knots.len() > 1 => {
                knots.push((1.0, last));
                let points: Vec<Nanos> = (0..=TABLE)
                    .map(|k| quantile(&knots, k).min(MAX_POINT))
                    .collect();
                let mut table = Box::new([(0.0, 0.0); TABLE]);
                for (entry, w) in table.iter_mut().zip(points.windows(2)) {
                    if let [a, b] = *w {
                        *entry = (a as f64, b as f64 - a as f64);
                    }
                }
                Work::Quantiles(table)
            }
            _ => Work::Zero,
        }
    }

    /// One request's work.
    #[inline(always)]
    pub(super) fn sample(&self, rng: &mut SmallRng) -> Nanos {
        match self {
            Work::Zero => 0,
            Work::Buckets { cumulative, bounds } => {
                let total = cumulative.last().copied().unwrap_or(0);
                if total == 0 {
                    return 0;
                }
                let u = rng.random_range(0..total);
                let i = cumulative.partition_point(|&c| c <= u);
                bounds.get(i).copied().unwrap_or(0)
            }
            Work::Quantiles(table) => {
                // Converted through `i64`: the same numbers as converting to unsigned
                // directly (`x` is in [0, TABLE); `v` is at least 0 and below 2^63, see
                // `MAX_POINT`), in fewer instructions.
                let x = crate::rng::unit_times(rng, TABLE as f64);
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let i = (x as i64 as usize).min(TABLE - 1);
                let (v0, step) = table[i];
                let t = x - i as f64;
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let v = (v0 + t * step).max(0.0) as i64 as Nanos;
                v
            }
        }
    }
}

/// Table points of a quantile function: every 1/`TABLE`.
const TABLE: usize = 1000;

/// The longest work a quantile table holds (2^62 ns, 146 years): every draw between two
/// points then converts to an integer through `i64` without saturating.
const MAX_POINT: Nanos = 1 << 62;

/// The piecewise-linear quantile function through `knots` at `k / TABLE`.
fn quantile(knots: &[(f64, Nanos)], k: usize) -> Nanos {
    let u = k as f64 / TABLE as f64;
    let i = knots.partition_point(|&(q, _)| q <= u).max(1);
    match (knots.get(i - 1), knots.get(i)) {
        (Some(&(q0, v0)), Some(&(q1, v1))) if q1 > q0 => {
            let t = (u - q0) / (q1 - q0);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let v = (v0 as f64 + t * (v1 as f64 - v0 as f64)).max(0.0).round() as Nanos;
            v
        }
        (Some(&(_, v)), _) => v,
        _ => 0,
    }
}

/// One endpoint of one service.
pub(super) struct Node {
    /// Its service's index.
    pub(super) service: usize,
    /// Its calls: indices into the edges, in file order.
    pub(super) edges: Range<usize>,
    /// Its own work per request.
    pub(super) work: Work,
    /// The share of requests it fails (503) after working.
    pub(super) failure_rate: f64,
}

/// One call, with the production objects its policy builds.
pub(super) struct Edge {
    /// The node called.
    pub(super) callee: usize,
    /// The called node's service.
    pub(super) callee_service: usize,
    /// The policy's per-try timeout in nanoseconds (read at every attempt).
    pub(super) per_try: Option<Nanos>,
    /// The retry policy (attempts, backoff, per-try timeout, minimum call time).
    pub(super) policy: RetryPolicy,
    /// Whether an in-doubt attempt (a timeout) may be retried: idempotent or keyed.
    pub(super) retry_safe: bool,
    /// The retry budget, shared by every request making this call.
    pub(super) budget: Arc<dyn RetryBudget>,
    /// The circuit breaker every attempt goes through.
    pub(super) breaker: Option<Arc<CircuitBreaker>>,
    /// The policy's overall timeout.
    pub(super) overall: Option<Nanos>,
    /// What this hop keeps of the time left before handing the deadline on (`None`:
    /// nothing).
    pub(super) reserve: Option<Reserve>,
    /// Whether the calling service sends and honours the don't-retry signal.
    pub(super) caller_signal: bool,
    /// Whether the client retries a 503.
    pub(super) retries_503: bool,
    /// Whether the policy retries at all (more than one attempt).
    pub(super) retries: bool,
}

/// One service.
pub(super) struct ServiceModel {
    pub(super) name: String,
    /// Workers (`u32::MAX`: no limit).
    pub(super) workers: u32,
    /// Queue places (`usize::MAX`: no limit).
    pub(super) queue: usize,
    pub(super) honours_deadline: bool,
}

/// The compiled graph.
pub(super) struct Model {
    pub(super) services: Vec<ServiceModel>,
    pub(super) nodes: Vec<Node>,
    pub(super) edges: Vec<Edge>,
    /// Whether anything reads the clock (ratio budgets, breakers).
    pub(super) reads_clock: bool,
}

impl Model {
    /// Compiles `graph`; budgets and breakers read `clock`, breakers jitter from `seed`.
    pub(super) fn compile(
        graph: &CallGraph,
        clock: &Clock,
        seed: u64,
    ) -> Result<Model, InvalidParam> {
        let mut index = BTreeMap::new();
        let mut services = Vec::new();
        for (si, (name, s)) in graph.services().iter().enumerate() {
            services.push(ServiceModel {
                name: name.clone(),
                workers: s.workers.unwrap_or(u32::MAX),
                queue: s
                    .queue
                    .map_or(usize::MAX, |q| usize::try_from(q).unwrap_or(usize::MAX)),
                honours_deadline: s.honours_deadline,
            });
            for endpoint in s.endpoints.keys() {
                let id = index.len();
                index.insert((name.as_str(), endpoint.as_str()), (id, si));
            }
        }
        let mut nodes = Vec::with_capacity(index.len());
        let mut edges = Vec::new();
        let mut reads_clock = false;
        for (name, s) in graph.services() {
            for (endpoint_name, endpoint) in &s.endpoints {
                let Some(&(_, service)) = index.get(&(name.as_str(), endpoint_name.as_str()))
                else {
                    continue;
                };
                let first = edges.len();
                for call in &endpoint.calls {
                    let Some(&(callee, callee_service)) =
                        index.get(&(call.service.as_str(), call.endpoint.as_str()))
                    else {
                        return Err(InvalidParam::new(
                            "graph",
                            format!("{}: calls an endpoint the graph lacks", call.field),
                        ));
                    };
                    let policy = &call.policy;
                    let budget: Arc<dyn RetryBudget> = match policy.budget() {
                        Some(spec) => {
                            reads_clock = true;
                            spec.build(clock.clone()).map_err(|e| {
                                InvalidParam::new("graph", format!("{}: {e}", call.field))
                            })?
                        }
                        None => Arc::new(Unlimited),
                    };
                    let breaker = match policy.breaker() {
                        Some(config) => {
                            reads_clock = true;
                            let breaker = CircuitBreaker::new(*config, clock.clone())
                                .map_err(|e| {
                                    InvalidParam::new("graph", format!("{}: {e}", call.field))
                                })?
                                .with_seed(crate::rng::stream_id(&[seed, edges.len() as u64]));
                            // Held open for the whole run (`breaker.isolated`).
                            if policy.breaker_isolated() {
                                breaker.isolate();
                            }
                            Some(Arc::new(breaker))
                        }
                        None => None,
                    };
                    edges.push(Edge {
                        callee,
                        callee_service,
                        per_try: policy.retry().per_try_timeout().map(nanos),
                        policy: *policy.retry(),
                        retry_safe: policy.retry().idempotent() || call.idempotency_key,
                        budget,
                        breaker,
                        overall: policy.overall_timeout().map(nanos),
                        reserve: Some(policy.propagation().reserve).filter(|r| *r != Reserve::NONE),
                        caller_signal: s.retry_signal,
                        retries_503: call.retry_on.contains(&503),
                        retries: policy.retry().max_attempts() > 1,
                    });
                }
                nodes.push(Node {
                    service,
                    edges: first..edges.len(),
                    work: Work::of(endpoint),
                    failure_rate: endpoint.failure_rate.unwrap_or(0.0),
                });
            }
        }
        Ok(Model {
            services,
            nodes,
            edges,
            reads_clock,
        })
    }

    /// The service index of `name`.
    pub(super) fn service_index(&self, name: &str) -> Option<usize> {
        self.services.iter().position(|s| s.name == name)
    }
}
