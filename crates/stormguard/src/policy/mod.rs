//! Per-endpoint policies: one type that says how to call one endpoint, and the files that
//! hold them.
//!
//! Retry and timeout settings spread across code are how a service ends up with three layers
//! each retrying three times. An [`EndpointPolicy`] keeps everything about calling one
//! endpoint in one reviewed value — attempts and backoff, or hedging; per-try, connect and
//! overall timeouts; the retry budget; the circuit breaker; the adaptive throttle; how much of
//! the deadline this hop keeps and in which headers it hands the rest on; when to fall back —
//! and the client stack of `stormguard-tower` is built from exactly that value. A
//! [`PolicyFile`] names one policy per endpoint.
//!
//! A policy is checked when it is made: [`EndpointPolicy::validate`] for one built in code,
//! and parsing for a file ([`PolicyFile::from_toml`], [`PolicyFile::from_json`]), which
//! refuses a bad file with the field and the broken rule named instead of letting it surface
//! as a retry storm. There is no unvalidated policy file to hold.
//!
//! ```toml
//! [endpoints."POST /pay"]
//! idempotency = "key"            # retry an in-doubt failure only with an Idempotency-Key
//! timeouts = { connect = "100ms", per_try = "300ms", overall = "1s" }
//! retry = { max_attempts = 3, min_call = "50ms" }
//! backoff = { kind = "exponential", base = "100ms", cap = "2s", jitter = "full" }
//! budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
//! breaker = { count = 20, failure_ratio = 0.5, minimum_throughput = 10, open = "5s" }
//! deadline = { reserve = 0.1, headers = ["grpc-timeout"] }
//!
//! [endpoints."GET /search"]
//! idempotency = "idempotent"
//! hedge = { max_attempts = 2, percentile = 0.95, fallback = "50ms" }
//! budget = { kind = "ratio", retry_ratio = 0.2, ttl = "10s" }
//! ```
//!
//! `breaker = { …, isolated = true }` holds the breaker open: nothing reaches the downstream
//! and the fallback answers where one is set, until a policy without it is applied (an
//! operator's switch, or a rule of the policy center for a downstream known to be down).
//!
//! Durations are written as `"250ms"`, `"1s"`, `"1.5s"` (see [`crate::duration`]). JSON files
//! have the same shape. Unknown fields are errors, so a typo cannot silently fall back to a
//! default.
//!
//! [`PolicyFile::load`] reads a file by its extension; every error names the file, line,
//! column and field, and quotes a bad value once, cut short. Every number has an upper bound
//! ([`limits`] says which and why), fields are checked against each other (`min_call` below
//! `overall`), and what is legal but probably not meant is reported by
//! [`PolicyFile::warnings`] (attempts the per-try timeouts leave no room for).
//!
//! # Time windows
//!
//! A policy can change on a daily schedule: the seeds' payment callback needs a looser
//! timeout from 03:00 to 04:00 Shanghai time, while its bank runs maintenance.
//!
//! ```toml
//! [[endpoints."POST /pay".windows]]
//! start = "03:00"
//! end = "04:00"
//! time_zone = "Asia/Shanghai"
//! overrides = { timeouts = { per_try = "2s", overall = "5s" } }
//! ```
//!
//! The policy in force during a window is the endpoint's with the overrides merged in, and is
//! validated by every rule above when the file is read. [`EndpointPolicy::in_force_at`] says
//! which policy is in force at an instant and until when; the live client stack of
//! `stormguard-tower` switches at each edge by itself, without a reload. How edges fall on
//! the days clocks change (a skipped or a repeated hour) is told at [`Schedule`]: an edge is
//! the first instant the zone's clock reads its time or later.

mod breaker;
mod budget;
pub mod diff;
mod error;
mod file;
pub mod limits;
mod overrides;
mod rules;
pub(crate) mod text;
mod window;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backoff::Backoff;
use crate::breaker::BreakerConfig;
use crate::deadline::{DeadlineHeader, DeadlineHeaders, Reserve};
use crate::retry::RetryPolicy;
use crate::throttle::ThrottleConfig;

pub use budget::BudgetSpec;
pub(crate) use error::FieldPath;
pub use error::{Location, PolicyError, PolicyWarning};
pub use window::{InForce, PolicyWindow, Schedule};

/// How to call one endpoint: the whole client stack's configuration, validated.
///
/// # Default
///
/// [`EndpointPolicy::new`] keeps the retry policy it is given and adds nothing else: no
/// hedging, no connect or overall timeout, no budget (not recommended), no breaker, no
/// throttle, no hop reserve with the deadline handed on in `grpc-timeout`, and
/// [`Fallback::OnGiveUp`].
///
/// ```
/// use std::time::Duration;
/// use stormguard::breaker::BreakerConfig;
/// use stormguard::health::HealthConfig;
/// use stormguard::policy::{BudgetSpec, EndpointPolicy};
/// use stormguard::retry::RetryPolicy;
///
/// let policy = EndpointPolicy::new(
///     RetryPolicy::new(3).with_per_try_timeout(Duration::from_millis(300)),
/// )
/// .with_overall_timeout(Duration::from_secs(1))
/// .with_budget(BudgetSpec::Grpc { max_tokens: 10, token_ratio: 0.1 })
/// .with_breaker(BreakerConfig::new(HealthConfig::count(20)).with_minimum_throughput(10));
/// policy.validate()?;
/// assert_eq!(policy.retry().max_attempts(), 3);
/// # Ok::<(), stormguard::policy::PolicyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "file::RawEndpoint", into = "file::RawEndpoint")]
pub struct EndpointPolicy {
    retry: RetryPolicy,
    hedge: Option<HedgeSpec>,
    connect_timeout: Option<Duration>,
    overall_timeout: Option<Duration>,
    budget: Option<BudgetSpec>,
    breaker: Option<BreakerConfig>,
    breaker_isolated: bool,
    throttle: Option<ThrottleConfig>,
    propagation: Propagation,
    fallback: Fallback,
    windows: Vec<PolicyWindow>,
}

/// Hedging instead of retrying: how many copies of a slow request, sent how far apart.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HedgeSpec {
    /// Attempts in all, the original included: 2..=5 (gRPC A6 caps hedging at 5).
    pub max_attempts: u32,
    /// When the next copy is sent.
    pub delay: HedgeDelaySpec,
}

/// When a hedge is sent, as a policy writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HedgeDelaySpec {
    /// After this fixed delay (A6 `hedgingDelay`).
    Fixed(Duration),
    /// After the endpoint's live latency percentile `percentile` (in `(0, 1)`), read from its
    /// health window; `fallback` until the window has data.
    Percentile {
        /// Which percentile, for example 0.95.
        percentile: f64,
        /// The delay while the window is empty.
        fallback: Duration,
    },
}

/// How this hop hands the deadline on: the reserve it keeps for its own work, and the headers
/// that carry the rest downstream.
///
/// # Default
///
/// No reserve; `grpc-timeout` only.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Propagation {
    /// What this hop keeps of the time left (a fraction, a fixed amount, or both).
    pub reserve: Reserve,
    /// The headers written on every attempt.
    pub headers: PropagationHeaders,
}

/// The deadline headers a hop writes: [`DeadlineHeaders`], whose default here is
/// `grpc-timeout` alone (the one format every gRPC and Connect peer reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PropagationHeaders(pub DeadlineHeaders);

impl Default for PropagationHeaders {
    fn default() -> Self {
        PropagationHeaders(DeadlineHeaders::only(DeadlineHeader::GrpcTimeout))
    }
}

/// When the client stack answers from its fallback (a cached answer, an alternate upstream)
/// instead of the downstream's answer, if a fallback is installed on the stack.
///
/// # Default
///
/// [`Fallback::OnGiveUp`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// Never: the caller always gets the downstream's answer or the stack's error.
    Never,
    /// When the stack gives up: attempts exhausted, budget or breaker refused, deadline too
    /// close, or a failure it may not retry.
    #[default]
    OnGiveUp,
    /// Always, without calling the downstream (a rule switched the endpoint over).
    Always,
}

impl EndpointPolicy {
    /// A policy that retries by `retry` and adds nothing else (see [`EndpointPolicy#default`]).
    pub const fn new(retry: RetryPolicy) -> Self {
        EndpointPolicy {
            retry,
            hedge: None,
            connect_timeout: None,
            overall_timeout: None,
            budget: None,
            breaker: None,
            breaker_isolated: false,
            throttle: None,
            propagation: Propagation {
                reserve: Reserve::NONE,
                headers: PropagationHeaders(DeadlineHeaders::only(DeadlineHeader::GrpcTimeout)),
            },
            fallback: Fallback::OnGiveUp,
            windows: Vec::new(),
        }
    }

    /// Replaces the retry policy (attempts, backoff, per-try timeout, minimum call time,
    /// idempotency).
    pub const fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Hedges instead of retrying. The retry policy then must allow one attempt only; its
    /// per-try timeout, minimum call time and idempotency still apply to every copy.
    pub const fn with_hedge(mut self, hedge: HedgeSpec) -> Self {
        self.hedge = Some(hedge);
        self
    }

    /// Bounds establishing a connection (`timeouts.connect` in a file). Enforced by whoever
    /// opens the connections, not by this crate: `stormguard proxy` bounds each upstream
    /// connect of the endpoint's route by it (its pool's own connect timeout when the policy
    /// sets none), and the client stack of `stormguard-tower`, which opens no connection,
    /// hands it to its transport in each attempt's request extensions
    /// (`stormguard_tower::client::ConnectTimeout`). With the library, your connector enforces
    /// it (hyper-util's `HttpConnector::set_connect_timeout`, reqwest's `connect_timeout`,
    /// tonic's `Endpoint::connect_timeout`): set it there to the same value.
    pub const fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Bounds the whole call, retries included: the call's deadline is the earlier of the
    /// caller's and this.
    pub const fn with_overall_timeout(mut self, timeout: Duration) -> Self {
        self.overall_timeout = Some(timeout);
        self
    }

    /// The retry budget, built once per downstream and shared by its callers.
    pub const fn with_budget(mut self, budget: BudgetSpec) -> Self {
        self.budget = Some(budget);
        self
    }

    /// A circuit breaker every attempt goes through.
    pub const fn with_breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// Holds the breaker open (`breaker.isolated = true` in a file): every call is refused
    /// without reaching the downstream, and answered by the fallback where one is set, until
    /// a policy without it is applied — then the breaker closes with an empty window. For an
    /// operator or a rule that knows the downstream is down. Needs a breaker
    /// ([`with_breaker`](Self::with_breaker)); [`validate`](Self::validate) refuses it
    /// without one.
    ///
    /// ```
    /// use stormguard::breaker::BreakerConfig;
    /// use stormguard::health::HealthConfig;
    /// use stormguard::policy::EndpointPolicy;
    /// use stormguard::retry::RetryPolicy;
    ///
    /// let held = EndpointPolicy::new(RetryPolicy::new(1))
    ///     .with_breaker(BreakerConfig::new(HealthConfig::count(20)).with_minimum_throughput(10))
    ///     .with_breaker_isolated(true);
    /// held.validate()?;
    /// assert!(held.breaker_isolated());
    /// assert!(EndpointPolicy::new(RetryPolicy::new(1)).with_breaker_isolated(true).validate().is_err());
    /// # Ok::<(), stormguard::policy::PolicyError>(())
    /// ```
    pub const fn with_breaker_isolated(mut self, isolated: bool) -> Self {
        self.breaker_isolated = isolated;
        self
    }

    /// An adaptive throttle every call goes through.
    pub const fn with_throttle(mut self, throttle: ThrottleConfig) -> Self {
        self.throttle = Some(throttle);
        self
    }

    /// The hop reserve and the deadline headers written on every attempt.
    pub const fn with_propagation(mut self, propagation: Propagation) -> Self {
        self.propagation = propagation;
        self
    }

    /// When the stack answers from its fallback.
    pub const fn with_fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// Checks every field and the rules between them; the error names the first broken one.
    pub fn validate(&self) -> Result<(), PolicyError> {
        rules::check(self, &FieldPath::root(""))
    }

    /// What is legal but probably not meant: attempts that can never run because the
    /// per-try timeouts of the attempts before them fill the overall timeout.
    pub fn warnings(&self) -> Vec<PolicyWarning> {
        self.warnings_at(&FieldPath::root(""))
    }

    fn warnings_at(&self, at: &FieldPath) -> Vec<PolicyWarning> {
        let mut warnings = self.own_warnings(at);
        for (index, window) in self.windows.iter().enumerate() {
            let window_at = at.field("windows").index(index).field("overrides");
            warnings.extend(window.policy.own_warnings(&window_at));
        }
        warnings
    }

    fn own_warnings(&self, at: &FieldPath) -> Vec<PolicyWarning> {
        let retry = &self.retry;
        let (Some(per_try), Some(overall)) = (retry.per_try_timeout(), self.overall_timeout) else {
            return Vec::new();
        };
        // Attempt k starts after the k - 1 before it, at the latest when each took its whole
        // per-try timeout, and runs only with at least `min_call` left.
        let never = (2..=retry.max_attempts()).find(|&k| {
            per_try
                .saturating_mul(k - 1)
                .saturating_add(retry.min_call())
                >= overall
        });
        match never {
            None => Vec::new(),
            Some(first) => vec![PolicyWarning {
                field: at.field("retry").field("max_attempts").to_string(),
                message: format!(
                    "attempts {first}..={} never run when the attempts before them time out: \
                     {} x per_try {per_try:?} does not fit in overall {overall:?}",
                    retry.max_attempts(),
                    retry.max_attempts()
                ),
            }],
        }
    }

    /// The retry policy.
    pub const fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// The hedging, when the endpoint hedges instead of retrying.
    pub const fn hedge(&self) -> Option<&HedgeSpec> {
        self.hedge.as_ref()
    }

    /// The connect timeout; who enforces it is told at
    /// [`with_connect_timeout`](Self::with_connect_timeout).
    pub const fn connect_timeout(&self) -> Option<Duration> {
        self.connect_timeout
    }

    /// The overall timeout.
    pub const fn overall_timeout(&self) -> Option<Duration> {
        self.overall_timeout
    }

    /// The retry budget.
    pub const fn budget(&self) -> Option<&BudgetSpec> {
        self.budget.as_ref()
    }

    /// The circuit breaker.
    pub const fn breaker(&self) -> Option<&BreakerConfig> {
        self.breaker.as_ref()
    }

    /// Whether the breaker is held open ([`with_breaker_isolated`](Self::with_breaker_isolated)).
    pub const fn breaker_isolated(&self) -> bool {
        self.breaker_isolated
    }

    /// The adaptive throttle.
    pub const fn throttle(&self) -> Option<&ThrottleConfig> {
        self.throttle.as_ref()
    }

    /// The hop reserve and deadline headers.
    pub const fn propagation(&self) -> &Propagation {
        &self.propagation
    }

    /// When the stack answers from its fallback.
    pub const fn fallback(&self) -> Fallback {
        self.fallback
    }

    /// The backoff between retries.
    pub const fn backoff(&self) -> &Backoff {
        self.retry.backoff()
    }
}

/// A whole policy file: one validated policy per endpoint name.
///
/// ```
/// use stormguard::policy::PolicyFile;
///
/// let file = PolicyFile::from_toml(r#"
///     [endpoints."GET /users/*"]
///     idempotency = "idempotent"
///     retry = { max_attempts = 2 }
/// "#)?;
/// assert_eq!(file.endpoint("GET /users/*").unwrap().retry().max_attempts(), 2);
/// let err = PolicyFile::from_toml("[endpoints.x]\nretry = { max_attempts = 0 }").unwrap_err();
/// assert!(err.to_string().contains(r#"endpoints."x".retry.max_attempts"#));
/// # Ok::<(), stormguard::policy::PolicyError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyFile {
    endpoints: BTreeMap<String, EndpointPolicy>,
}

impl PolicyFile {
    /// A file of these policies (validate each first).
    pub fn new(endpoints: BTreeMap<String, EndpointPolicy>) -> Self {
        PolicyFile { endpoints }
    }

    /// Reads, parses and validates the policy file at `path`: TOML when its name ends in
    /// `.toml`, JSON when it ends in `.json`. An error names the file, the line and column,
    /// and the field (`endpoints."POST /pay".retry.max_attempts`).
    ///
    /// An empty file (or one of whitespace only) holds no endpoints, in both formats. A file
    /// over [`limits::MAX_FILE_BYTES`] is refused unread.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        text::load(path.as_ref())
    }

    /// Parses and validates a TOML policy file; an error names the line and column and the
    /// field.
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        text::parse(text, text::Format::Toml, None)
    }

    /// Parses and validates a JSON policy file; an error names the line and column and the
    /// field.
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        text::parse(text, text::Format::Json, None)
    }

    /// What is legal but probably not meant, endpoint by endpoint (see
    /// [`EndpointPolicy::warnings`]).
    pub fn warnings(&self) -> Vec<PolicyWarning> {
        self.endpoints
            .iter()
            .flat_map(|(name, policy)| policy.warnings_at(&FieldPath::endpoint(name)))
            .collect()
    }

    /// The file as TOML, in the shape [`PolicyFile::from_toml`] reads back.
    pub fn to_toml(&self) -> String {
        // Every value here has a TOML form (no maps with non-string keys, no bare None).
        toml::to_string(&file::RawFile::from(self)).unwrap_or_default()
    }

    /// The file as JSON, in the shape [`PolicyFile::from_json`] reads back.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&file::RawFile::from(self)).unwrap_or_default()
    }

    /// One endpoint's policy.
    pub fn endpoint(&self, name: &str) -> Option<&EndpointPolicy> {
        self.endpoints.get(name)
    }

    /// Every endpoint's policy, by name.
    pub fn endpoints(&self) -> &BTreeMap<String, EndpointPolicy> {
        &self.endpoints
    }

    /// The policies, by value.
    pub fn into_endpoints(self) -> BTreeMap<String, EndpointPolicy> {
        self.endpoints
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bad_input;
#[cfg(test)]
mod tests_props;
#[cfg(test)]
mod tests_windows;
