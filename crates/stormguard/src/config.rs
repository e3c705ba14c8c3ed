//! Per-endpoint policy files, checked before deploy.
//!
//! Retry and timeout settings spread across code are how a service ends up with three layers
//! each retrying three times. A policy file keeps them in one reviewed place, and
//! [`PolicyFile::validate`] refuses a bad one at load time — with the field and the broken
//! rule named — instead of letting it surface as a retry storm.
//!
//! ```toml
//! [endpoints."POST /pay"]
//! idempotency = "key"            # retry an in-doubt failure only with an Idempotency-Key
//! timeouts = { connect = "100ms", per_try = "300ms", overall = "1s" }
//! retry = { max_attempts = 3, min_call = "50ms" }
//! backoff = { kind = "exponential", base = "100ms", cap = "2s", jitter = "full" }
//! budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }
//! ```
//!
//! Durations are written as `"250ms"`, `"1s"`, `"1.5s"` (see [`crate::duration`]). JSON files
//! have the same shape. Unknown fields are errors, so a typo cannot silently fall back to a
//! default.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backoff::{Backoff, Growth, Jitter};
use crate::budget::{ConcurrencyBudget, RatioBudget, RetryBudget, TokenBucket};
use crate::clock::Clock;
use crate::retry::RetryPolicy;

/// A whole policy file: one policy per endpoint name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// Policies by endpoint (for HTTP, conventionally `"METHOD /path"`).
    #[serde(default)]
    pub endpoints: BTreeMap<String, EndpointConfig>,
}

/// The policy of one endpoint, as written in the file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// When an in-doubt failure may be retried.
    #[serde(default)]
    pub idempotency: IdempotencyConfig,
    /// Timeouts.
    #[serde(default)]
    pub timeouts: TimeoutsConfig,
    /// Attempts and minimum call time.
    #[serde(default)]
    pub retry: RetryConfig,
    /// Backoff between attempts.
    #[serde(default)]
    pub backoff: BackoffConfig,
    /// The retry budget; none means unlimited (not recommended).
    #[serde(default)]
    pub budget: Option<BudgetConfig>,
}

/// When an in-doubt failure (timeout or reset after sending) may be retried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdempotencyConfig {
    /// Only when the request carries an idempotency key (the default).
    #[default]
    Key,
    /// Always: the operation is idempotent.
    Idempotent,
}

/// Connect, per-try and overall timeouts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsConfig {
    /// Time to establish a connection.
    #[serde(default, with = "crate::duration::serde_duration_opt")]
    pub connect: Option<Duration>,
    /// Time one attempt may take.
    #[serde(default, with = "crate::duration::serde_duration_opt")]
    pub per_try: Option<Duration>,
    /// Time the whole call, retries included, may take.
    #[serde(default, with = "crate::duration::serde_duration_opt")]
    pub overall: Option<Duration>,
}

/// Attempts and the minimum useful call time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts in all, the first included. Default 3.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// A retry is not started unless the deadline leaves the wait plus this. Default 0.
    #[serde(default, with = "crate::duration::serde_duration")]
    pub min_call: Duration,
}

fn default_max_attempts() -> u32 {
    3
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: default_max_attempts(),
            min_call: Duration::ZERO,
        }
    }
}

/// The growth of a backoff in a policy file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackoffKind {
    /// The same delay every time.
    Fixed,
    /// base · n.
    Linear,
    /// base · multiplier^(n−1) (the default).
    #[default]
    Exponential,
    /// Envoy's (2^n − 1) · base.
    Envoy,
    /// min(cap, uniform[base, 3·previous)).
    Decorrelated,
}

/// The jitter of a backoff in a policy file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JitterKind {
    /// No jitter.
    None,
    /// uniform[0, t) (the default).
    #[default]
    Full,
    /// t/2 + uniform[0, t/2).
    Equal,
}

/// A backoff as written in a policy file.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackoffConfig {
    /// The growth. Default exponential.
    #[serde(default)]
    pub kind: BackoffKind,
    /// The first delay. Default 100 ms.
    #[serde(default = "default_base", with = "crate::duration::serde_duration")]
    pub base: Duration,
    /// The largest delay. Default 10 s.
    #[serde(default = "default_cap", with = "crate::duration::serde_duration")]
    pub cap: Duration,
    /// The exponential multiplier. Default 2.
    #[serde(default = "default_multiplier")]
    pub multiplier: f64,
    /// The jitter (ignored by `decorrelated`). Default full.
    #[serde(default)]
    pub jitter: JitterKind,
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

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            kind: BackoffKind::default(),
            base: default_base(),
            cap: default_cap(),
            multiplier: default_multiplier(),
            jitter: JitterKind::default(),
        }
    }
}

/// A retry budget as written in a policy file.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum BudgetConfig {
    /// gRPC A6 `retryThrottling`.
    Grpc {
        /// 1..=1000.
        max_tokens: u32,
        /// Tokens regained per success, 0.001..=1 (three decimals kept).
        token_ratio: f64,
    },
    /// The seeds' bucket: a retry spends one token.
    SpendPerRetry {
        /// 1..=1000.
        max_tokens: u32,
        /// Tokens regained per success, 0.001..=1.
        token_ratio: f64,
    },
    /// The AWS SDK standard quota.
    AwsStandard,
    /// Finagle/Linkerd: retries up to a fraction of recent requests.
    Ratio {
        /// Fraction of requests that may be retried, 0..=1.
        retry_ratio: f64,
        /// The window, 1 s..=60 s.
        #[serde(with = "crate::duration::serde_duration")]
        ttl: Duration,
        /// Retries per second always allowed.
        #[serde(default)]
        min_retries_per_sec: u32,
    },
    /// Envoy: active retries up to a share of active requests.
    Concurrency {
        /// Percent of active requests, 0..=100.
        budget_percent: f64,
        /// Retries always allowed in flight.
        #[serde(default = "default_min_retry_concurrency")]
        min_retry_concurrency: u32,
    },
}

fn default_min_retry_concurrency() -> u32 {
    3
}

/// A policy file that failed to load: where, and which rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The text is not valid TOML/JSON for this shape (unknown field, wrong type, a
    /// malformed duration, …); the message names the key and position.
    #[error("cannot parse policy file: {0}")]
    Syntax(String),
    /// A value breaks a rule.
    #[error("{field}: {rule}")]
    Invalid {
        /// The path of the field, e.g. `endpoints."POST /pay".retry.max_attempts`.
        field: String,
        /// The rule broken.
        rule: String,
    },
}

/// One endpoint's validated policy, ready to use.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointPolicy {
    /// The retry policy (attempts, backoff, per-try timeout, minimum call, idempotency).
    pub retry: RetryPolicy,
    /// The connect timeout.
    pub connect_timeout: Option<Duration>,
    /// The overall timeout; a call without a deadline gets one this long.
    pub overall_timeout: Option<Duration>,
    /// The budget to build once per downstream and share.
    pub budget: Option<BudgetConfig>,
}

impl PolicyFile {
    /// Parses a TOML policy file (not yet validated).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))
    }

    /// Parses a JSON policy file (not yet validated).
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        serde_json::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))
    }

    /// Checks every endpoint and returns the ready policies, or the first broken rule.
    pub fn validate(&self) -> Result<BTreeMap<String, EndpointPolicy>, ConfigError> {
        self.endpoints
            .iter()
            .map(|(name, endpoint)| {
                let at = FieldPath::endpoint(name);
                endpoint.validate(&at).map(|p| (name.clone(), p))
            })
            .collect()
    }
}

impl EndpointConfig {
    /// Checks this endpoint; `at` names it in errors.
    fn validate(&self, at: &FieldPath) -> Result<EndpointPolicy, ConfigError> {
        let timeouts = &self.timeouts;
        for (name, value) in [
            ("connect", timeouts.connect),
            ("per_try", timeouts.per_try),
            ("overall", timeouts.overall),
        ] {
            if value == Some(Duration::ZERO) {
                return Err(at
                    .field("timeouts")
                    .field(name)
                    .invalid("must be above zero"));
            }
        }
        if let (Some(per_try), Some(overall)) = (timeouts.per_try, timeouts.overall) {
            if per_try > overall {
                return Err(at.field("timeouts").field("per_try").invalid(format!(
                    "{per_try:?} is longer than the overall timeout {overall:?}"
                )));
            }
        }
        if self.retry.max_attempts == 0 {
            return Err(at
                .field("retry")
                .field("max_attempts")
                .invalid("must be at least 1 (it counts the first attempt)"));
        }
        let backoff = self.backoff.validate(&at.field("backoff"))?;
        if let Some(budget) = &self.budget {
            budget.validate(&at.field("budget"))?;
        }
        let mut retry = RetryPolicy::new(self.retry.max_attempts)
            .with_backoff(backoff)
            .with_min_call(self.retry.min_call)
            .with_idempotent(self.idempotency == IdempotencyConfig::Idempotent);
        if let Some(per_try) = timeouts.per_try {
            retry = retry.with_per_try_timeout(per_try);
        }
        let retry = retry
            .validate()
            .map_err(|e| at.field("retry").invalid(e.to_string()))?;
        Ok(EndpointPolicy {
            retry,
            connect_timeout: timeouts.connect,
            overall_timeout: timeouts.overall,
            budget: self.budget,
        })
    }
}

impl BackoffConfig {
    fn validate(&self, at: &FieldPath) -> Result<Backoff, ConfigError> {
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
        backoff
            .with_cap(self.cap)
            .validate()
            .map_err(|e| at.invalid(e.to_string()))
    }
}

impl BudgetConfig {
    fn validate(&self, at: &FieldPath) -> Result<(), ConfigError> {
        match *self {
            BudgetConfig::Grpc {
                max_tokens,
                token_ratio,
            }
            | BudgetConfig::SpendPerRetry {
                max_tokens,
                token_ratio,
            } => {
                if !(1..=1000).contains(&max_tokens) {
                    return Err(at
                        .field("max_tokens")
                        .invalid(format!("must be in 1..=1000, got {max_tokens}")));
                }
                check_fraction(at.field("token_ratio"), token_ratio, 0.001)
            }
            BudgetConfig::AwsStandard => Ok(()),
            BudgetConfig::Ratio {
                retry_ratio, ttl, ..
            } => {
                check_fraction(at.field("retry_ratio"), retry_ratio, 0.0)?;
                if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
                    return Err(at
                        .field("ttl")
                        .invalid(format!("must be between 1s and 60s, got {ttl:?}")));
                }
                Ok(())
            }
            BudgetConfig::Concurrency { budget_percent, .. } => {
                if !(budget_percent.is_finite() && (0.0..=100.0).contains(&budget_percent)) {
                    return Err(at.field("budget_percent").invalid(format!(
                        "must be a finite number in 0..=100, got {budget_percent}"
                    )));
                }
                Ok(())
            }
        }
    }

    /// Builds the budget (validated first). Build it once per downstream and share it.
    pub fn build(&self, clock: Clock) -> Result<Arc<dyn RetryBudget>, ConfigError> {
        self.validate(&FieldPath::root("budget"))?;
        let invalid = |e: crate::budget::InvalidBudget| FieldPath::root("budget").invalid(e);
        Ok(match *self {
            BudgetConfig::Grpc {
                max_tokens,
                token_ratio,
            } => Arc::new(TokenBucket::grpc(max_tokens, token_ratio).map_err(invalid)?),
            BudgetConfig::SpendPerRetry {
                max_tokens,
                token_ratio,
            } => Arc::new(TokenBucket::spend_per_retry(max_tokens, token_ratio).map_err(invalid)?),
            BudgetConfig::AwsStandard => Arc::new(TokenBucket::aws_standard()),
            BudgetConfig::Ratio {
                retry_ratio,
                ttl,
                min_retries_per_sec,
            } => Arc::new(
                RatioBudget::new(retry_ratio, ttl, min_retries_per_sec, clock).map_err(invalid)?,
            ),
            BudgetConfig::Concurrency {
                budget_percent,
                min_retry_concurrency,
            } => Arc::new(
                ConcurrencyBudget::new(budget_percent, min_retry_concurrency).map_err(invalid)?,
            ),
        })
    }
}

fn check_fraction(at: FieldPath, value: f64, min: f64) -> Result<(), ConfigError> {
    if value.is_finite() && (min..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(at.invalid(format!("must be a finite number in {min}..=1, got {value}")))
    }
}

/// A dotted path to a field, for error messages.
#[derive(Clone, Debug)]
struct FieldPath(String);

impl FieldPath {
    fn root(name: &str) -> Self {
        FieldPath(name.to_owned())
    }

    fn endpoint(name: &str) -> Self {
        FieldPath(format!("endpoints.{name:?}"))
    }

    fn field(&self, name: &str) -> FieldPath {
        FieldPath(format!("{}.{name}", self.0))
    }

    fn invalid(&self, rule: impl fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            field: self.0.clone(),
            rule: rule.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GOOD: &str = r#"
        [endpoints."POST /pay"]
        idempotency = "key"
        timeouts = { connect = "100ms", per_try = "300ms", overall = "1s" }
        retry = { max_attempts = 3, min_call = "50ms" }
        backoff = { kind = "exponential", base = "100ms", cap = "2s", jitter = "full" }
        budget = { kind = "grpc", max_tokens = 10, token_ratio = 0.1 }

        [endpoints."GET /users"]
        idempotency = "idempotent"
        budget = { kind = "ratio", retry_ratio = 0.2, ttl = "10s", min_retries_per_sec = 10 }
    "#;

    fn invalid(text: &str) -> (String, String) {
        match PolicyFile::from_toml(text).and_then(|f| f.validate()) {
            Err(ConfigError::Invalid { field, rule }) => (field, rule),
            other => panic!("expected a rule error, got {other:?}"),
        }
    }

    fn syntax(text: &str) -> String {
        match PolicyFile::from_toml(text) {
            Err(ConfigError::Syntax(message)) => message,
            other => panic!("expected a syntax error, got {other:?}"),
        }
    }

    #[test]
    fn a_good_file_becomes_ready_policies() {
        let policies = PolicyFile::from_toml(GOOD)
            .and_then(|f| f.validate())
            .expect("valid");
        let pay = &policies["POST /pay"];
        assert_eq!(pay.retry.max_attempts(), 3);
        assert_eq!(
            pay.retry.per_try_timeout(),
            Some(Duration::from_millis(300))
        );
        assert_eq!(pay.retry.min_call(), Duration::from_millis(50));
        assert!(!pay.retry.idempotent());
        assert_eq!(pay.retry.backoff().cap(), Duration::from_secs(2));
        assert_eq!(pay.overall_timeout, Some(Duration::from_secs(1)));
        let users = &policies["GET /users"];
        assert!(users.retry.idempotent());
        assert!(users.budget.is_some());
    }

    #[test]
    fn json_has_the_same_shape() {
        let from_toml = PolicyFile::from_toml(GOOD).expect("valid");
        let json = serde_json::to_string(&from_toml).expect("serialises");
        assert_eq!(PolicyFile::from_json(&json), Ok(from_toml));
    }

    #[test]
    fn each_broken_rule_names_its_field() {
        let cases = [
            (
                "retry = { max_attempts = 0 }",
                "retry.max_attempts",
                "at least 1",
            ),
            (
                r#"backoff = { base = "2s", cap = "1s" }"#,
                "backoff.cap",
                "below the base",
            ),
            (
                "backoff = { multiplier = nan }",
                "backoff.multiplier",
                "finite",
            ),
            (
                r#"budget = { kind = "grpc", max_tokens = 0, token_ratio = 0.1 }"#,
                "budget.max_tokens",
                "1..=1000",
            ),
            (
                r#"budget = { kind = "grpc", max_tokens = 1001, token_ratio = 0.1 }"#,
                "budget.max_tokens",
                "1..=1000",
            ),
            (
                r#"budget = { kind = "grpc", max_tokens = 10, token_ratio = 1.5 }"#,
                "budget.token_ratio",
                "0.001..=1",
            ),
            (
                r#"budget = { kind = "spend_per_retry", max_tokens = 10, token_ratio = nan }"#,
                "budget.token_ratio",
                "finite",
            ),
            (
                r#"budget = { kind = "ratio", retry_ratio = -0.1, ttl = "10s" }"#,
                "budget.retry_ratio",
                "0..=1",
            ),
            (
                r#"budget = { kind = "ratio", retry_ratio = 0.2, ttl = "500ms" }"#,
                "budget.ttl",
                "between 1s and 60s",
            ),
            (
                r#"budget = { kind = "concurrency", budget_percent = 120.0 }"#,
                "budget.budget_percent",
                "0..=100",
            ),
            (
                r#"timeouts = { per_try = "2s", overall = "1s" }"#,
                "timeouts.per_try",
                "longer than the overall",
            ),
            (
                r#"timeouts = { overall = "0s" }"#,
                "timeouts.overall",
                "above zero",
            ),
        ];
        for (body, field, rule) in cases {
            let (got_field, got_rule) = invalid(&format!("[endpoints.x]\n{body}\n"));
            assert_eq!(got_field, format!("endpoints.\"x\".{field}"), "{body}");
            assert!(got_rule.contains(rule), "{body}: {got_rule}");
        }
    }

    #[test]
    fn malformed_values_are_syntax_errors_that_name_the_key() {
        let message = syntax("[endpoints.x]\nretry = { min_call = \"-5ms\" }\n");
        assert!(message.contains("min_call"), "{message}");
        let message = syntax("[endpoints.x]\nbackoff = { base = \"10 parsecs\" }\n");
        assert!(message.contains("base"), "{message}");
        let message = syntax("[endpoints.x]\nretry = { max_attempt = 3 }\n");
        assert!(message.contains("max_attempt"), "{message}");
        let message = syntax("[endpoints.x]\nbudget = { kind = \"leaky\" }\n");
        assert!(message.contains("leaky"), "{message}");
    }

    #[test]
    fn budgets_build_from_config() {
        let budget = BudgetConfig::Grpc {
            max_tokens: 10,
            token_ratio: 0.1,
        }
        .build(Clock::system())
        .expect("valid");
        for _ in 0..5 {
            budget.record_failure();
        }
        assert!(budget.withdraw(crate::budget::Withdrawal::Retry).is_err());
        assert!(
            BudgetConfig::Concurrency {
                budget_percent: f64::NAN,
                min_retry_concurrency: 3
            }
            .build(Clock::system())
            .is_err()
        );
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
            let _ = PolicyFile::from_toml(&text).map(|f| f.validate());
            let _ = PolicyFile::from_json(&text).map(|f| f.validate());
        }

        #[test]
        fn arbitrary_values_are_accepted_or_named(
            max_attempts in any::<u32>(),
            max_tokens in any::<u32>(),
            token_ratio in prop_oneof![any::<f64>(), 0.0f64..2.0],
            base_ms in any::<u32>(),
            cap_ms in any::<u32>(),
            multiplier in prop_oneof![any::<f64>(), 0.5f64..4.0],
        ) {
            let file = PolicyFile {
                endpoints: BTreeMap::from([(
                    "e".to_owned(),
                    EndpointConfig {
                        retry: RetryConfig { max_attempts, min_call: Duration::ZERO },
                        backoff: BackoffConfig {
                            base: Duration::from_millis(u64::from(base_ms)),
                            cap: Duration::from_millis(u64::from(cap_ms)),
                            multiplier,
                            ..BackoffConfig::default()
                        },
                        budget: Some(BudgetConfig::Grpc { max_tokens, token_ratio }),
                        ..EndpointConfig::default()
                    },
                )]),
            };
            match file.validate() {
                Ok(policies) => {
                    let budget = policies["e"].budget.expect("configured");
                    prop_assert!(budget.build(Clock::system()).is_ok());
                }
                Err(ConfigError::Invalid { field, .. }) => {
                    prop_assert!(field.starts_with("endpoints.\"e\"."), "{field}");
                }
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }
}
