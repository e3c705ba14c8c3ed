//! The lint rules themselves: pure functions from policies (and their place in a graph) to
//! raw findings.

use std::path::PathBuf;
use std::time::Duration;

use super::{LintConfig, Raw, Rule, Severity, raw};
use crate::backoff::Jitter;
use crate::graph::{Call, CallGraph, PolicyOrigin};
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
    for path in graph.paths() {
        amplification(graph, &path, config, emit);
    }
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

/// SG001 and SG002 over one path (the calls from an entry point down to a leaf).
fn amplification(
    graph: &CallGraph,
    path: &[&Call],
    config: &LintConfig,
    emit: &mut dyn FnMut(Raw),
) {
    let Some(last) = path.last() else { return };
    let caller_signal = |index: usize| -> bool {
        // The service making call `index` is the one called by call `index - 1`, or the
        // entry service for the first call; find it by name.
        let service = if index == 0 {
            graph
                .calls()
                .find(|(_, _, c)| std::ptr::eq(*c, path[0]))
                .map(|(s, _, _)| s)
        } else {
            Some(path[index - 1].service.as_str())
        };
        service
            .and_then(|s| graph.service(s))
            .is_some_and(|s| s.retry_signal)
    };
    let retrying: Vec<usize> = (0..path.len())
        .filter(|&i| attempts(&path[i].policy) > 1)
        .collect();
    let raw_factor: f64 = path
        .iter()
        .map(|c| f64::from(attempts(&c.policy)))
        .product();
    // With the don't-retry signal, a layer above a retrying layer that sends the signal does
    // not retry what comes back exhausted; with a budget, a layer retries at most its share.
    let effective: f64 = (0..path.len())
        .map(|i| {
            let policy = &path[i].policy;
            let below_signals =
                retrying.iter().any(|&j| j > i && caller_signal(j)) && caller_signal(i);
            if below_signals {
                1.0
            } else if let Some(budget) = policy.budget() {
                (1.0 + budget_share(budget)).min(f64::from(attempts(policy)))
            } else {
                f64::from(attempts(policy))
            }
        })
        .product();
    let route = path
        .iter()
        .map(|c| c.service.as_str())
        .collect::<Vec<_>>()
        .join(" -> ");
    if raw_factor > config.max_amplification {
        let severity = if effective > config.max_amplification {
            Severity::Error
        } else {
            Severity::Note
        };
        emit(Raw {
            severity,
            ..raw(
                Rule::Amplification,
                last.field.clone(),
                format!(
                    "path to {route}: a failing {:?} sees {raw_factor:.0}x its traffic without budgets, {effective:.2}x with the budgets and the don't-retry signal (threshold {}x)",
                    last.service, config.max_amplification
                ),
            )
        });
    }
    if retrying.len() > 1 && !retrying.iter().all(|&i| caller_signal(i)) {
        let second = path[retrying[1]];
        emit(raw(
            Rule::LayeredRetries,
            second.field.clone(),
            format!(
                "{} layers of the path to {route} retry and not all send and honour the don't-retry signal (retry_signal = true): their retries multiply",
                retrying.len()
            ),
        ));
    }
}
