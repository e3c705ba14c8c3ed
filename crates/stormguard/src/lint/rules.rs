//! The lint rules themselves: pure functions from policies (and their place in a graph) to
//! raw findings.

use std::path::PathBuf;
use std::time::Duration;

use super::{LintConfig, Raw, Rule, Severity, raw};
use crate::backoff::Jitter;
use std::collections::BTreeMap;

use crate::graph::{Call, CallGraph, EndpointId, PolicyOrigin};
use crate::policy::{BudgetSpec, EndpointPolicy};

/// Attempts a policy makes in all: its hedged copies, or its retry attempts.
pub(crate) fn attempts(policy: &EndpointPolicy) -> u32 {
    policy
        .hedge()
        .map_or(policy.retry().max_attempts(), |h| h.max_attempts)
}

/// The time one attempt may take, and the field that sets it: the per-try timeout, else the
/// overall one.
pub(crate) fn attempt_timeout(policy: &EndpointPolicy) -> Option<(Duration, &'static str)> {
    policy
        .retry()
        .per_try_timeout()
        .map(|t| (t, "timeouts.per_try"))
        .or_else(|| policy.overall_timeout().map(|t| (t, "timeouts.overall")))
}

/// The share of requests a budget lets be retried in the long run while the downstream
/// fails: the ratio budgets' ratio, the token buckets' refund per success, Envoy's percent,
/// AWS standard's 1 refund per 5-token retry.
pub(crate) fn budget_share(budget: &BudgetSpec) -> f64 {
    match *budget {
        BudgetSpec::Grpc { token_ratio, .. } | BudgetSpec::SpendPerRetry { token_ratio, .. } => {
            token_ratio
        }
        BudgetSpec::AwsStandard => 0.2,
        BudgetSpec::Ratio { retry_ratio, .. } => retry_ratio,
        BudgetSpec::Concurrency { budget_percent, .. } => budget_percent / 100.0,
    }
}

/// The rules one policy breaks on its own; `at` is the policy's field path, `idempotent`
/// whether the endpoint it calls is.
pub(super) fn intrinsic(
    policy: &EndpointPolicy,
    at: &str,
    idempotent: bool,
    emit: &mut dyn FnMut(Rule, String, String),
) {
    let n = attempts(policy);
    if n <= 1 {
        return;
    }
    let what = if policy.hedge().is_some() {
        "hedges"
    } else {
        "retries"
    };
    if policy.retry().idempotent() && !idempotent {
        emit(
            Rule::RetryNonIdempotent,
            format!("{at}.idempotency"),
            format!(
                "{what} in-doubt failures ({n} attempts) of a non-idempotent endpoint: use idempotency = \"key\" and send an Idempotency-Key"
            ),
        );
    }
    if policy.budget().is_none() {
        emit(
            Rule::RetryWithoutBudget,
            format!("{at}.retry.max_attempts"),
            format!(
                "{what} up to {n} attempts without a retry budget: during an outage every request becomes {n}"
            ),
        );
    }
    if policy.hedge().is_none() && policy.backoff().jitter() == Jitter::None {
        emit(
            Rule::RetryWithoutJitter,
            format!("{at}.backoff.jitter"),
            "retries with a backoff without jitter: clients that failed together retry together"
                .to_owned(),
        );
    }
    for warning in policy.warnings() {
        emit(
            Rule::RetriesImpossible,
            format!("{at}.{}", warning.field),
            warning.message,
        );
    }
}

/// Where a call's policy is written: its file (`None` for the graph itself) and field path.
fn policy_at(call: &Call) -> (Option<PathBuf>, String) {
    match &call.origin {
        PolicyOrigin::Inline => (None, format!("{}.policy", call.field)),
        PolicyOrigin::File { path, endpoint } => {
            (Some(path.clone()), format!("endpoints.{endpoint:?}"))
        }
    }
}

fn in_file(file: Option<PathBuf>, rule: Rule, field: String, message: String) -> Raw {
    Raw {
        file,
        ..raw(rule, field, message)
    }
}

/// Every rule over a graph.
pub(super) fn graph(graph: &CallGraph, config: &LintConfig, emit: &mut dyn FnMut(Raw)) {
    for (_, _, call) in graph.calls() {
        let Some(callee) = graph.callee(call) else {
            continue;
        };
        let (file, at) = policy_at(call);
        intrinsic(
            &call.policy,
            &at,
            callee.idempotent,
            &mut |rule, field, message| {
                emit(in_file(file.clone(), rule, field, message));
            },
        );
        let retrying = attempts(&call.policy) > 1;
        if retrying {
            if let Some(status) = call
                .retry_on
                .iter()
                .find(|s| (400..500).contains(*s) && **s != 408 && **s != 429)
            {
                emit(raw(
                    Rule::RetryOn4xx,
                    format!("{}.retry_on", call.field),
                    format!("retries status {status}: a client error is the same on every attempt"),
                ));
            }
        }
        timeouts(call, callee.latency.p99, config, &file, &at, emit);
        inner_retries(graph, call, &file, &at, emit);
    }
    paths(graph, config, emit);
}

fn timeouts(
    call: &Call,
    p99: Option<Duration>,
    config: &LintConfig,
    file: &Option<PathBuf>,
    at: &str,
    emit: &mut dyn FnMut(Raw),
) {
    let (Some(p99), Some((timeout, field))) = (p99, attempt_timeout(&call.policy)) else {
        return;
    };
    let target = format!("{:?} {:?}", call.service, call.endpoint);
    if timeout < p99 {
        emit(in_file(
            file.clone(),
            Rule::TimeoutBelowP99,
            format!("{at}.{field}"),
            format!(
                "attempt timeout {timeout:?} is below the P99 {p99:?} of {target}: more than 1% of calls time out by construction"
            ),
        ));
    } else if timeout.as_secs_f64() > config.p99_factor * p99.as_secs_f64() {
        emit(in_file(
            file.clone(),
            Rule::TimeoutAboveP99,
            format!("{at}.{field}"),
            format!(
                "attempt timeout {timeout:?} is above {} x the P99 {p99:?} of {target}: a slow call holds its caller {:.1}x longer than a healthy one needs before retrying",
                config.p99_factor,
                timeout.as_secs_f64() / p99.as_secs_f64()
            ),
        ));
    }
}

/// SG003: the attempts of the callee's own calls that fit into one attempt of `call`.
fn inner_retries(
    graph: &CallGraph,
    call: &Call,
    file: &Option<PathBuf>,
    at: &str,
    emit: &mut dyn FnMut(Raw),
) {
    let (Some(callee), Some((outer, field))) = (graph.callee(call), attempt_timeout(&call.policy))
    else {
        return;
    };
    for inner in &callee.calls {
        let policy = &inner.policy;
        let n = attempts(policy);
        let Some((per_attempt, _)) = attempt_timeout(policy) else {
            continue;
        };
        if n <= 1 || policy.hedge().is_some() {
            continue;
        }
        // Attempt k ends at the latest after k attempt timeouts and the k - 1 backoff
        // ceilings between them.
        let mut end = per_attempt;
        let mut fit = 1;
        for k in 2..=n {
            end = end
                .saturating_add(policy.backoff().ceiling(k - 1))
                .saturating_add(per_attempt);
            if end > outer {
                break;
            }
            fit = k;
        }
        if fit < n {
            emit(in_file(
                file.clone(),
                Rule::InnerRetriesDead,
                format!("{at}.{field}"),
                format!(
                    "{outer:?} leaves room for {fit} of the {n} attempts {:?} makes to {:?} {:?} (each up to {per_attempt:?}): the rest are dead code",
                    call.service, inner.service, inner.endpoint
                ),
            ));
        }
    }
}

/// What is known at an endpoint of every path that reaches it from an entry point.
#[derive(Clone, Copy)]
struct Reach<'a> {
    /// The largest ∏ attempts of a path reaching it, and the call that path arrives by
    /// (with the endpoint that made it), to name the path.
    raw: f64,
    via: Option<(usize, &'a Call)>,
    /// The largest effective factor of a path reaching it, by whether a later call on the
    /// path retries from a service with the don't-retry signal (`None`: no such path).
    effective: [Option<f64>; 2],
    /// Paths reaching it by (retrying calls so far, 0, 1 or 2 and more) × (whether one of
    /// them retries without the don't-retry signal).
    retrying: [[bool; 2]; 3],
}

/// SG001 and SG002 over every path, without enumerating paths: one pass over the endpoints
/// in topological order carries, per endpoint, the worst figures of the paths that reach it
/// (the graph's walk is linear in its calls; a 30-layer diamond has 2^30 paths).
///
/// SG001 flags each call into an endpoint that calls nothing when the worst ∏ attempts of a
/// path ending with it is above the threshold; the severity is an error when the worst
/// effective factor of such a path (with budgets and the don't-retry signal) is too. A layer
/// counts 1x when its service sends the signal and a later layer of the path retries from a
/// service that does; else its budget's share (at most its attempts); else its attempts.
/// SG002 flags a retrying call that is the second retrying call of some path on which not
/// every retrying call comes from a service with the signal.
fn paths(graph: &CallGraph, config: &LintConfig, emit: &mut dyn FnMut(Raw)) {
    let order = graph.topological_order();
    let index: BTreeMap<EndpointId<'_>, usize> =
        order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let signal = |id: EndpointId<'_>| graph.service(id.0).is_some_and(|s| s.retry_signal);
    let target = |call: &Call| {
        index
            .get(&(call.service.as_str(), call.endpoint.as_str()))
            .copied()
    };
    // Whether a path from each endpoint down retries somewhere without the signal.
    let mut unsignalled_below = vec![false; order.len()];
    for (i, &id) in order.iter().enumerate().rev() {
        let below = graph.calls_of(id).iter().any(|call| {
            (attempts(&call.policy) > 1 && !signal(id))
                || target(call).is_some_and(|j| unsignalled_below.get(j).copied().unwrap_or(false))
        });
        if let Some(slot) = unsignalled_below.get_mut(i) {
            *slot = below;
        }
    }
    let mut reach: Vec<Option<Reach<'_>>> = vec![None; order.len()];
    let has_callers: std::collections::BTreeSet<usize> =
        graph.calls().filter_map(|(_, _, c)| target(c)).collect();
    for (i, slot) in reach.iter_mut().enumerate() {
        if !has_callers.contains(&i) {
            *slot = Some(Reach {
                raw: 1.0,
                via: None,
                effective: [Some(1.0), Some(1.0)],
                retrying: [[true, false], [false; 2], [false; 2]],
            });
        }
    }
    for (i, &id) in order.iter().enumerate() {
        let Some(here) = reach.get(i).copied().flatten() else {
            continue;
        };
        let sends_signal = signal(id);
        for call in graph.calls_of(id) {
            let Some(j) = target(call) else { continue };
            let n = attempts(&call.policy);
            let retries = n > 1;
            let factor = |later_signal: bool| {
                if later_signal && sends_signal {
                    1.0
                } else if let Some(budget) = call.policy.budget() {
                    (1.0 + budget_share(budget)).min(f64::from(n))
                } else {
                    f64::from(n)
                }
            };
            let this_signals = retries && sends_signal;
            let raw_here = here.raw * f64::from(n);
            let effective = [false, true].map(|later| {
                here.effective[usize::from(this_signals || later)].map(|e| e * factor(later))
            });
            if graph
                .calls_of((call.service.as_str(), call.endpoint.as_str()))
                .is_empty()
            {
                leaf_amplification(
                    &order,
                    &reach,
                    call,
                    raw_here,
                    effective[0],
                    i,
                    config,
                    emit,
                );
            }
            if retries
                && (here.retrying[1][1]
                    || (here.retrying[1][0]
                        && (!sends_signal || unsignalled_below.get(j).copied().unwrap_or(false))))
            {
                emit(raw(
                    Rule::LayeredRetries,
                    call.field.clone(),
                    format!(
                        "a path through {:?} -> {:?} has two or more layers that retry, and not all send and honour the don't-retry signal (retry_signal = true): their retries multiply",
                        id.0, call.service
                    ),
                ));
            }
            let Some(next) = reach.get_mut(j) else {
                continue;
            };
            let entry = next.get_or_insert(Reach {
                raw: 0.0,
                via: None,
                effective: [None, None],
                retrying: [[false; 2]; 3],
            });
            if raw_here > entry.raw {
                entry.raw = raw_here;
                entry.via = Some((i, call));
            }
            for (slot, value) in entry.effective.iter_mut().zip(effective) {
                if let Some(v) = value {
                    *slot = Some(slot.map_or(v, |old| old.max(v)));
                }
            }
            for k in 0..3 {
                for u in 0..2 {
                    if here.retrying[k][u] {
                        let k2 = (k + usize::from(retries)).min(2);
                        let u2 = u == 1 || (retries && !sends_signal);
                        entry.retrying[k2][usize::from(u2)] = true;
                    }
                }
            }
        }
    }
}

/// The most hops a finding's message names; longer paths show their ends.
const ROUTE_SHOWN: usize = 8;

/// SG001 for `call` into an endpoint that calls nothing, made from endpoint `from`.
#[allow(clippy::too_many_arguments)]
fn leaf_amplification(
    order: &[EndpointId<'_>],
    reach: &[Option<Reach<'_>>],
    call: &Call,
    raw_factor: f64,
    effective: Option<f64>,
    from: usize,
    config: &LintConfig,
    emit: &mut dyn FnMut(Raw),
) {
    if raw_factor <= config.max_amplification {
        return;
    }
    let effective = effective.unwrap_or(raw_factor);
    // The worst path, walked back from `from` by the calls it arrived by.
    let mut hops = vec![call.service.as_str()];
    let mut at = Some(from);
    while let Some(i) = at {
        let via = reach.get(i).copied().flatten().and_then(|r| r.via);
        match via {
            Some((prev, c)) => {
                hops.push(c.service.as_str());
                at = Some(prev);
            }
            None => {
                if let Some(id) = order.get(i) {
                    hops.push(id.0);
                }
                at = None;
            }
        }
    }
    hops.reverse();
    // The entry service starts the route; the rest are the services called.
    let route = if hops.len() > ROUTE_SHOWN {
        let head = hops[..3].join(" -> ");
        let tail = hops[hops.len() - 3..].join(" -> ");
        format!("{head} -> ... ({} more) -> {tail}", hops.len() - 6)
    } else {
        hops.join(" -> ")
    };
    let severity = if effective > config.max_amplification {
        Severity::Error
    } else {
        Severity::Note
    };
    emit(Raw {
        severity,
        ..raw(
            Rule::Amplification,
            call.field.clone(),
            format!(
                "path {route}: a failing {:?} sees {}x its traffic without budgets, {}x with the budgets and the don't-retry signal (threshold {}x)",
                call.service,
                factor(raw_factor, 0),
                factor(effective, 2),
                config.max_amplification
            ),
        )
    });
}

/// A factor as a message writes it: `27`, `1.10`; huge ones in scientific notation.
fn factor(x: f64, decimals: usize) -> String {
    if x >= 1e12 {
        format!("{x:.3e}")
    } else {
        format!("{x:.decimals$}")
    }
}
