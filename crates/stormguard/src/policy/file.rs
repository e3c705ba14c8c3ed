//! The shape of a policy as a file writes it, turned into an [`EndpointPolicy`] through the
//! rules of `rules.rs`.
//!
//! These types exist only to read and write files: an [`EndpointPolicy`] deserialises through
//! [`RawEndpoint`] (and so is validated before it exists) and serialises back into it, so a
//! policy written out reads back equal.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::breaker::RawBreaker;
use super::limits::MAX_NAME_BYTES;
use super::overrides::{RawWindow, object};
use super::{
    BudgetSpec, EndpointPolicy, Fallback, FieldPath, HedgeDelaySpec, HedgeSpec, PolicyError,
    PolicyFile, Propagation, PropagationHeaders,
};
use crate::backoff::{Backoff, Growth, Jitter};
use crate::deadline::{DeadlineHeader, DeadlineHeaders, Reserve};
use crate::retry::RetryPolicy;
use crate::throttle::ThrottleConfig;

#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    #[serde(default)]
    endpoints: BTreeMap<String, RawEndpoint>,
}

impl RawFile {
    /// Adds `other`'s endpoints; `false` (and `self` partly merged) when a name is in both.
    pub(super) fn merge(&mut self, other: RawFile) -> bool {
        for (name, endpoint) in other.endpoints {
            if self.endpoints.insert(name, endpoint).is_some() {
                return false;
            }
        }
        true
    }

    /// The validated file; an error comes with the name of the endpoint it is in.
    pub(super) fn into_file(self) -> Result<PolicyFile, (String, PolicyError)> {
        let endpoints = self
            .endpoints
            .into_iter()
            .map(|(name, raw)| {
                let at = FieldPath::endpoint(&name);
                let policy = check_name(&name, &at).and_then(|()| raw.into_policy(&at));
                match policy {
                    Ok(policy) => Ok((name, policy)),
                    Err(e) => Err((name, e)),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(PolicyFile { endpoints })
    }
}

fn check_name(name: &str, at: &FieldPath) -> Result<(), PolicyError> {
    if name.trim().is_empty() {
        return Err(
            at.invalid("an endpoint's name is a route (\"POST /pay\") or \"default\", not blank")
        );
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(at.invalid(format!(
            "an endpoint's name is at most {MAX_NAME_BYTES} bytes, got {}",
            name.len()
        )));
    }
    Ok(())
}

impl From<&PolicyFile> for RawFile {
    fn from(file: &PolicyFile) -> Self {
        RawFile {
            endpoints: file
                .endpoints
                .iter()
                .map(|(name, policy)| (name.clone(), RawEndpoint::from(policy.clone())))
                .collect(),
        }
    }
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEndpoint {
    #[serde(default)]
    idempotency: Idempotency,
    #[serde(default)]
    timeouts: RawTimeouts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry: Option<RawRetry>,
    #[serde(default)]
    backoff: RawBackoff,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hedge: Option<RawHedge>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    budget: Option<BudgetSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    breaker: Option<RawBreaker>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    throttle: Option<RawThrottle>,
    #[serde(default)]
    deadline: RawDeadline,
    #[serde(default)]
    fallback: Fallback,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    windows: Vec<RawWindow>,
}

/// When an in-doubt failure (timeout or reset after sending) may be retried.
#[derive(Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Idempotency {
    /// Only when the request carries an idempotency key (the default).
    #[default]
    Key,
    /// Always: the operation is idempotent.
    Idempotent,
}

#[derive(Clone, Copy, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    #[serde(
        default,
        with = "crate::duration::serde_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    connect: Option<Duration>,
    #[serde(
        default,
        with = "crate::duration::serde_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    per_try: Option<Duration>,
    #[serde(
        default,
        with = "crate::duration::serde_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    overall: Option<Duration>,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    #[serde(default = "default_max_attempts")]
    max_attempts: u32,
    #[serde(default, with = "crate::duration::serde_duration")]
    min_call: Duration,
}

fn default_max_attempts() -> u32 {
    3
}

#[derive(Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum BackoffKind {
    Fixed,
    Linear,
    #[default]
    Exponential,
    Envoy,
    Decorrelated,
}

#[derive(Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum JitterKind {
    None,
    #[default]
    Full,
    Equal,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackoff {
    #[serde(default)]
    kind: BackoffKind,
    #[serde(default = "default_base", with = "crate::duration::serde_duration")]
    base: Duration,
    #[serde(default = "default_cap", with = "crate::duration::serde_duration")]
    cap: Duration,
    #[serde(default = "default_multiplier")]
    multiplier: f64,
    #[serde(default)]
    jitter: JitterKind,
}

fn default_base() -> Duration {
    Duration::from_millis(100)
}
fn default_cap() -> Duration {
    Duration::from_secs(10)
}
fn default_multiplier() -> f64 {
    2.0
}

impl Default for RawBackoff {
    fn default() -> Self {
        RawBackoff {
            kind: BackoffKind::default(),
            base: default_base(),
            cap: default_cap(),
            multiplier: default_multiplier(),
            jitter: JitterKind::default(),
        }
    }
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHedge {
    max_attempts: u32,
    #[serde(
        default,
        with = "crate::duration::serde_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    delay: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    percentile: Option<f64>,
    #[serde(
        default,
        with = "crate::duration::serde_duration_opt",
        skip_serializing_if = "Option::is_none"
    )]
    fallback: Option<Duration>,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawThrottle {
    #[serde(default = "default_k")]
    k: f64,
    #[serde(
        default = "default_throttle_window",
        with = "crate::duration::serde_duration"
    )]
    window: Duration,
    #[serde(default = "default_throttle_buckets")]
    buckets: u32,
}

fn default_k() -> f64 {
    ThrottleConfig::sre_default().k()
}
fn default_throttle_window() -> Duration {
    ThrottleConfig::sre_default().window()
}
fn default_throttle_buckets() -> u32 {
    ThrottleConfig::sre_default().buckets()
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeadline {
    #[serde(default)]
    reserve: f64,
    #[serde(default, with = "crate::duration::serde_duration")]
    reserve_fixed: Duration,
    #[serde(default = "default_headers")]
    headers: Vec<String>,
}

fn default_headers() -> Vec<String> {
    vec![DeadlineHeader::GrpcTimeout.name().to_owned()]
}

impl Default for RawDeadline {
    fn default() -> Self {
        RawDeadline {
            reserve: 0.0,
            reserve_fixed: Duration::ZERO,
            headers: default_headers(),
        }
    }
}

impl TryFrom<RawEndpoint> for EndpointPolicy {
    type Error = PolicyError;

    fn try_from(raw: RawEndpoint) -> Result<Self, PolicyError> {
        raw.into_policy(&FieldPath::root(""))
    }
}

impl RawEndpoint {
    /// Its windows, as the file writes them.
    pub(super) fn windows_mut(&mut self) -> &mut Vec<RawWindow> {
        &mut self.windows
    }

    /// The policy this raw endpoint describes, checked; `at` names it in errors.
    pub(super) fn into_policy(mut self, at: &FieldPath) -> Result<EndpointPolicy, PolicyError> {
        let raw_windows = std::mem::take(&mut self.windows);
        let mut windows = Vec::with_capacity(raw_windows.len());
        if !raw_windows.is_empty() {
            let base = object(&self);
            for (index, raw) in raw_windows.into_iter().enumerate() {
                windows.push(raw.into_window(&base, &at.field("windows").index(index))?);
            }
        }
        let retry_at = at.field("retry");
        if let (Some(retry), Some(_)) = (&self.retry, &self.hedge) {
            if retry.max_attempts > 1 {
                return Err(retry_at.field("max_attempts").invalid(
                    "an endpoint either retries or hedges: with `hedge`, leave `retry` out or set max_attempts = 1",
                ));
            }
        }
        let retry_raw = self.retry.unwrap_or(RawRetry {
            max_attempts: if self.hedge.is_some() {
                1
            } else {
                default_max_attempts()
            },
            min_call: Duration::ZERO,
        });
        let backoff = self.backoff.into_backoff(&at.field("backoff"))?;
        let mut retry = RetryPolicy::new(retry_raw.max_attempts)
            .with_backoff(backoff)
            .with_min_call(retry_raw.min_call)
            .with_idempotent(self.idempotency == Idempotency::Idempotent);
        if let Some(per_try) = self.timeouts.per_try {
            retry = retry.with_per_try_timeout(per_try);
        }
        let hedge = match self.hedge {
            None => None,
            Some(raw) => Some(raw.into_spec(&at.field("hedge"))?),
        };
        let breaker_isolated = self.breaker.is_some_and(|raw| raw.isolated);
        let breaker = match self.breaker {
            None => None,
            Some(raw) => Some(raw.into_config(&at.field("breaker"))?),
        };
        let deadline_at = at.field("deadline");
        let reserve = Reserve::fraction(self.deadline.reserve)
            .map_err(|e| deadline_at.field("reserve").invalid(e))?
            .with_fixed(self.deadline.reserve_fixed);
        let mut headers = Vec::with_capacity(self.deadline.headers.len());
        for name in &self.deadline.headers {
            let header = DeadlineHeaders::ALL
                .iter()
                .find(|h| h.name().eq_ignore_ascii_case(name))
                .ok_or_else(|| {
                    deadline_at.field("headers").invalid(format!(
                        "{name:?} is not a deadline header (grpc-timeout, connect-timeout-ms, x-envoy-expected-rq-timeout-ms, x-request-deadline)"
                    ))
                })?;
            headers.push(header);
        }
        let headers =
            DeadlineHeaders::new(&headers).map_err(|e| deadline_at.field("headers").invalid(e))?;
        let policy = EndpointPolicy {
            retry,
            hedge,
            connect_timeout: self.timeouts.connect,
            overall_timeout: self.timeouts.overall,
            budget: self.budget,
            breaker,
            breaker_isolated,
            throttle: self
                .throttle
                .map(|t| ThrottleConfig::new(t.k).with_window(t.window, t.buckets)),
            propagation: Propagation {
                reserve,
                headers: PropagationHeaders(headers),
            },
            fallback: self.fallback,
            windows,
        };
        super::rules::check(&policy, at)?;
        Ok(policy)
    }
}

impl RawBackoff {
    fn into_backoff(self, at: &FieldPath) -> Result<Backoff, PolicyError> {
        if self.cap < self.base {
            return Err(at
                .field("cap")
                .invalid(format!("{:?} is below the base {:?}", self.cap, self.base)));
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return Err(at.field("multiplier").invalid(format!(
                "must be a finite number >= 1, got {}",
                self.multiplier
            )));
        }
        let jitter = match self.jitter {
            JitterKind::None => Jitter::None,
            JitterKind::Full => Jitter::Full,
            JitterKind::Equal => Jitter::Equal,
        };
        let backoff = match self.kind {
            BackoffKind::Fixed => Backoff::fixed(self.base).with_jitter(jitter),
            BackoffKind::Linear => Backoff::linear(self.base).with_jitter(jitter),
            BackoffKind::Exponential => Backoff::fixed(self.base)
                .with_growth(Growth::Exponential {
                    multiplier: self.multiplier,
                })
                .with_jitter(jitter),
            BackoffKind::Envoy => Backoff::envoy(self.base, self.cap).with_jitter(jitter),
            BackoffKind::Decorrelated => Backoff::decorrelated(self.base, self.cap),
        };
        let backoff = backoff.with_cap(self.cap);
        backoff.validate().map_err(|e| at.invalid(e))?;
        Ok(backoff)
    }
}

impl From<Backoff> for RawBackoff {
    fn from(backoff: Backoff) -> Self {
        let (kind, multiplier) = match (backoff.jitter(), backoff.growth()) {
            (Jitter::Decorrelated, _) => (BackoffKind::Decorrelated, default_multiplier()),
            (_, Growth::Fixed) => (BackoffKind::Fixed, default_multiplier()),
            (_, Growth::Linear) => (BackoffKind::Linear, default_multiplier()),
            (_, Growth::Exponential { multiplier }) => (BackoffKind::Exponential, multiplier),
            (_, Growth::Envoy) => (BackoffKind::Envoy, default_multiplier()),
        };
        let jitter = match backoff.jitter() {
            Jitter::None => JitterKind::None,
            Jitter::Equal => JitterKind::Equal,
            Jitter::Full | Jitter::Decorrelated => JitterKind::Full,
        };
        RawBackoff {
            kind,
            base: backoff.base(),
            cap: backoff.cap(),
            multiplier,
            jitter,
        }
    }
}

impl RawHedge {
    fn into_spec(self, at: &FieldPath) -> Result<HedgeSpec, PolicyError> {
        let delay = match (self.delay, self.percentile, self.fallback) {
            (Some(delay), None, None) => HedgeDelaySpec::Fixed(delay),
            (None, Some(percentile), fallback) => HedgeDelaySpec::Percentile {
                percentile,
                fallback: fallback.ok_or_else(|| {
                    at.field("fallback").invalid(
                        "a percentile delay needs a fallback delay for while the window is empty",
                    )
                })?,
            },
            (None, None, _) => {
                return Err(at
                    .field("delay")
                    .invalid("set either `delay` or `percentile` (with `fallback`)"));
            }
            (Some(_), _, _) => {
                return Err(at
                    .field("delay")
                    .invalid("set either `delay` or `percentile` (with `fallback`), not both"));
            }
        };
        Ok(HedgeSpec {
            max_attempts: self.max_attempts,
            delay,
        })
    }
}

impl From<HedgeSpec> for RawHedge {
    fn from(spec: HedgeSpec) -> Self {
        match spec.delay {
            HedgeDelaySpec::Fixed(delay) => RawHedge {
                max_attempts: spec.max_attempts,
                delay: Some(delay),
                percentile: None,
                fallback: None,
            },
            HedgeDelaySpec::Percentile {
                percentile,
                fallback,
            } => RawHedge {
                max_attempts: spec.max_attempts,
                delay: None,
                percentile: Some(percentile),
                fallback: Some(fallback),
            },
        }
    }
}

impl From<EndpointPolicy> for RawEndpoint {
    fn from(mut policy: EndpointPolicy) -> Self {
        let windows = std::mem::take(&mut policy.windows);
        let retry = policy.retry;
        let mut raw = RawEndpoint {
            idempotency: if retry.idempotent() {
                Idempotency::Idempotent
            } else {
                Idempotency::Key
            },
            timeouts: RawTimeouts {
                connect: policy.connect_timeout,
                per_try: retry.per_try_timeout(),
                overall: policy.overall_timeout,
            },
            retry: Some(RawRetry {
                max_attempts: retry.max_attempts(),
                min_call: retry.min_call(),
            }),
            backoff: RawBackoff::from(*retry.backoff()),
            hedge: policy.hedge.map(RawHedge::from),
            budget: policy.budget,
            breaker: policy.breaker.map(|config| {
                let mut raw = RawBreaker::from(config);
                raw.isolated = policy.breaker_isolated;
                raw
            }),
            throttle: policy.throttle.map(|t| RawThrottle {
                k: t.k(),
                window: t.window(),
                buckets: t.buckets(),
            }),
            deadline: RawDeadline {
                reserve: policy.propagation.reserve.fraction_kept(),
                reserve_fixed: policy.propagation.reserve.fixed_kept(),
                headers: policy
                    .propagation
                    .headers
                    .0
                    .iter()
                    .map(|h| h.name().to_owned())
                    .collect(),
            },
            fallback: policy.fallback,
            windows: Vec::new(),
        };
        if !windows.is_empty() {
            let base = object(&raw);
            raw.windows = windows
                .into_iter()
                .map(|window| RawWindow::from_window(window, &base))
                .collect();
        }
        raw
    }
}
