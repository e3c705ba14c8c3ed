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
    /// `(1, the last known)`, linear in between, evaluated from its segments.
    Quantiles(Segments),
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
                Work::Quantiles(Segments::through(&knots))
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
            Work::Quantiles(segments) => segments.sample(rng),
        }
    }
}

/// A piecewise-linear quantile function of at most [`SEGMENTS`] segments, evaluated
/// directly by a draw: its segment is found by comparisons whose outcomes are added (no
/// branch to mispredict on a random number), then one multiplication and two additions.
///
/// Why not a table of the function at every 1/1000 (this type's previous form, 16 KiB an
/// endpoint): a draw reads a random entry, and the tables of a ten-endpoint graph do not
/// fit in the first-level cache, so nearly every draw waited for the second level (that one
/// load took 14 % of the what-if bench's time samples). The segments take 120 bytes, and
/// give the function itself, not its table points rounded to nanoseconds (a draw differs
/// from the table's by at most about a nanosecond).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Segments {
    /// Where each segment starts (the first at 0); infinity where there is no such segment
    /// (no draw reaches it).
    starts: [f64; SEGMENTS],
    /// Per segment: its value where it starts, and its slope.
    lines: [(f64, f64); SEGMENTS],
}

const _: () = assert!(std::mem::size_of::<Segments>() <= 128);

/// Segments of a quantile function: the known quantiles (0.5, 0.9, 0.99 and 0.999) and the
/// two ends make at most six knots.
const SEGMENTS: usize = 5;

impl Segments {
    /// The segments between consecutive `knots` (`(q, value)`, `q` rising from 0 to 1; past
    /// [`SEGMENTS`] + 1 knots, the rest are ignored).
    fn through(knots: &[(f64, Nanos)]) -> Segments {
        let mut segments = Segments {
            starts: [f64::INFINITY; SEGMENTS],
            lines: [(0.0, 0.0); SEGMENTS],
        };
        for (j, pair) in knots.windows(2).take(SEGMENTS).enumerate() {
            let [(q0, v0), (q1, v1)] = *pair else {
                continue;
            };
            #[allow(clippy::cast_precision_loss)]
            let (v0, v1) = (v0 as f64, v1 as f64);
            let slope = if q1 > q0 { (v1 - v0) / (q1 - q0) } else { 0.0 };
            if let (Some(start), Some(line)) =
                (segments.starts.get_mut(j), segments.lines.get_mut(j))
            {
                *start = q0;
                *line = (v0, slope);
            }
        }
        segments
    }

    /// The function at `u` (in `[0, 1)`), in whole nanoseconds: rounded down, at least 0.
    #[inline(always)]
    fn at(&self, u: f64) -> Nanos {
        let [_, later @ ..] = &self.starts;
        let j: usize = later.iter().map(|&s| usize::from(u >= s)).sum();
        let q0 = self.starts[j];
        let (v0, slope) = self.lines[j];
        // Through `i64`: the same number as converting to unsigned directly (it is at least
        // 0), in fewer instructions; past 2^63 ns (292 years) it saturates (the table held
        // its points below 2^62).
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let v = (v0 + (u - q0) * slope).max(0.0) as i64 as Nanos;
        v
    }

    /// One draw.
    #[inline(always)]
    fn sample(&self, rng: &mut SmallRng) -> Nanos {
        self.at(crate::rng::unit(rng))
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    const MS: Nanos = 1_000_000;

    fn shop() -> Segments {
        Segments::through(&[
            (0.0, 0),
            (0.5, 5 * MS),
            (0.99, 40 * MS),
            (0.999, 80 * MS),
            (1.0, 80 * MS),
        ])
    }

    #[test]
    fn the_known_quantiles_are_hit_and_the_segments_are_straight() {
        let s = shop();
        assert_eq!(s.at(0.0), 0);
        assert_eq!(s.at(0.25), 2_500_000);
        assert_eq!(s.at(0.5), 5 * MS);
        assert_eq!(s.at(0.745), 22_500_000);
        assert_eq!(s.at(0.99), 40 * MS);
        assert_eq!(s.at(0.999), 80 * MS);
        assert_eq!(s.at(0.9999), 80 * MS);
    }

    #[test]
    fn draws_have_the_known_percentiles() {
        let s = shop();
        let mut rng = SmallRng::seed_from_u64(5);
        let draws: Vec<Nanos> = (0..200_000).map(|_| s.sample(&mut rng)).collect();
        // The share of draws at or below each known quantile's value is that quantile
        // (within about four standard errors of 200,000 draws).
        let share = |v: Nanos| draws.iter().filter(|&&d| d <= v).count() as f64 / 2e5;
        assert!((share(5 * MS) - 0.5).abs() < 0.005, "{}", share(5 * MS));
        assert!((share(40 * MS) - 0.99).abs() < 0.001, "{}", share(40 * MS));
        assert!(
            (share(80 * MS - 1) - 0.999).abs() < 0.0003,
            "{}",
            share(80 * MS - 1)
        );
    }

    #[test]
    fn one_known_quantile_makes_two_segments() {
        let s = Segments::through(&[(0.0, 0), (0.99, 10 * MS), (1.0, 10 * MS)]);
        assert_eq!(s.at(0.495), 5 * MS);
        assert_eq!(s.at(0.995), 10 * MS);
    }

    /// The quantile function through `knots` at `u`, as the old table computed its points
    /// (without their rounding to nanoseconds).
    fn reference(knots: &[(f64, Nanos)], u: f64) -> f64 {
        let i = knots
            .partition_point(|&(q, _)| q <= u)
            .clamp(1, knots.len() - 1);
        let ((q0, v0), (q1, v1)) = (knots[i - 1], knots[i]);
        let t = (u - q0) / (q1 - q0);
        v0 as f64 + t * (v1 as f64 - v0 as f64)
    }

    proptest! {
        /// Any non-empty set of known quantiles, rising values anywhere in the range of
        /// nanoseconds: every draw is the quantile function rounded down (within a
        /// nanosecond, or the rounding of a 64-bit float far above 2^53), each known quantile
        /// is hit exactly where it is exact, and the function never falls.
        #[test]
        fn is_the_quantile_function_through_the_known_ones(
            known in proptest::sample::subsequence(vec![0.5, 0.9, 0.99, 0.999], 1..=4),
            mut values in proptest::collection::vec(0..Nanos::MAX / 2, 4),
            small in any::<bool>(),
            mut us in proptest::collection::vec(0.0..1.0f64, 64),
        ) {
            if small {
                // Below 2^40 ns: every value is exact as a float.
                values.iter_mut().for_each(|v| *v >>= 23);
            }
            values.sort_unstable();
            let mut knots = vec![(0.0, 0)];
            knots.extend(known.iter().copied().zip(values.iter().copied()));
            let last = knots.last().map_or(0, |&(_, v)| v);
            knots.push((1.0, last));
            let s = Segments::through(&knots);
            if small {
                for &(q, v) in knots.iter().take(knots.len() - 1) {
                    prop_assert_eq!(s.at(q), v, "at the known {}", q);
                }
            }
            us.sort_by(f64::total_cmp);
            let mut before = 0;
            for u in us {
                let v = s.at(u);
                let exact = reference(&knots, u);
                let slack = 1.0 + exact * 1e-12;
                prop_assert!((v as f64 - exact.floor()).abs() <= slack, "{} at {}: {}", v, u, exact);
                prop_assert!(v >= before, "{} at {} after {}", v, u, before);
                before = v;
            }
        }
    }
}
