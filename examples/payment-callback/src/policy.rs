//! The dependencies' policies, from one policy file.
//!
//! Each dependency gets its own policy because each fails differently: the risk service
//! blips (retry twice, budgeted), the broker is highly available (retry once), and the
//! database has its own failover (no application retry). Keeping the three in one reviewed
//! file (`policy.toml`, embedded as the default) is what stops a second retry loop from
//! appearing somewhere in the code. There is deliberately no global timeout: the callback's
//! 4.5 s business deadline is set by the server, and every call below is bounded by what is
//! left of it.

use std::collections::BTreeMap;
use stormguard::policy::{BudgetSpec, EndpointPolicy, PolicyFile};

/// The embedded default policy file (`examples/payment-callback/policy.toml`).
pub const DEFAULT_POLICY: &str = include_str!("../policy.toml");

/// Endpoint name of the risk service in the policy file.
pub const RISK_CHECK: &str = "risk-check";
/// Endpoint name of the broker publish in the policy file.
pub const MESSAGE_PUBLISH: &str = "message-publish";
/// Endpoint name of the database in the policy file.
pub const DATABASE: &str = "database";

/// A policy file that cannot drive the service.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The file is not a valid policy file (syntax or a broken rule, named).
    #[error(transparent)]
    Config(#[from] stormguard::policy::PolicyError),
    /// A dependency has no policy.
    #[error("policy file: no [endpoints.\"{0}\"] section")]
    Missing(&'static str),
    /// An endpoint that no dependency uses (most likely a typo).
    #[error(
        "policy file: unknown endpoint \"{0}\" (expected risk-check, message-publish, database)"
    )]
    Unknown(String),
    /// A dependency's policy lacks something this service needs.
    #[error("policy file: endpoints.\"{endpoint}\": {rule}")]
    Unsuitable {
        /// The endpoint.
        endpoint: &'static str,
        /// What is missing.
        rule: &'static str,
    },
}

/// The validated policies of the three dependencies.
#[derive(Clone, Debug)]
pub struct Policies {
    /// The risk service.
    pub risk: EndpointPolicy,
    /// Publishing to the broker.
    pub publish: EndpointPolicy,
    /// The database.
    pub database: EndpointPolicy,
}

impl Policies {
    /// Parses and validates a TOML policy file.
    ///
    /// ```
    /// use stormguard_payment_callback::policy::{DEFAULT_POLICY, Policies};
    ///
    /// let p = Policies::from_toml(DEFAULT_POLICY).unwrap();
    /// assert_eq!(p.risk.retry().max_attempts(), 3); // two retries
    /// assert_eq!(p.publish.retry().max_attempts(), 2); // one retry
    /// assert_eq!(p.database.retry().max_attempts(), 1); // none
    /// ```
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let mut all: BTreeMap<String, EndpointPolicy> =
            PolicyFile::from_toml(text)?.into_endpoints();
        let mut take = |name: &'static str| all.remove(name).ok_or(PolicyError::Missing(name));
        let risk = take(RISK_CHECK)?;
        let publish = take(MESSAGE_PUBLISH)?;
        let database = take(DATABASE)?;
        if let Some(unknown) = all.into_keys().next() {
            return Err(PolicyError::Unknown(unknown));
        }
        if risk.budget().is_none() {
            return Err(PolicyError::Unsuitable {
                endpoint: RISK_CHECK,
                rule: "a retried dependency needs a budget",
            });
        }
        Ok(Policies {
            risk,
            publish,
            database,
        })
    }

    /// The default policies (the embedded file).
    pub fn default_policies() -> Result<Self, PolicyError> {
        Policies::from_toml(DEFAULT_POLICY)
    }

    /// The budget's size above its retry threshold, for the harness's bound on retries in an
    /// outage: a gRPC bucket allows retries while more than half its tokens are left.
    pub fn risk_budget_headroom(&self) -> Option<u64> {
        match *self.risk.budget()? {
            BudgetSpec::Grpc { max_tokens, .. } => Some(u64::from(max_tokens / 2)),
            BudgetSpec::SpendPerRetry { max_tokens, .. } => Some(u64::from(max_tokens)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_default_file_matches_the_design() {
        let p = Policies::default_policies().expect("valid");
        assert_eq!(p.risk.connect_timeout(), Some(Duration::from_secs(1)));
        assert_eq!(
            p.risk.retry().per_try_timeout(),
            Some(Duration::from_secs(3))
        );
        assert_eq!(p.risk.retry().backoff().base(), Duration::from_millis(300));
        assert!(p.risk.retry().idempotent());
        assert_eq!(
            p.publish.retry().backoff().base(),
            Duration::from_millis(100)
        );
        assert_eq!(p.database.retry().max_attempts(), 1);
        for e in [&p.risk, &p.publish, &p.database] {
            assert_eq!(e.overall_timeout(), None, "no global timeout");
        }
        assert_eq!(p.risk_budget_headroom(), Some(50));
    }

    #[test]
    fn missing_unknown_and_unsuitable_endpoints_are_named() {
        let risk = "[endpoints.\"risk-check\"]\nbudget = { kind = \"grpc\", max_tokens = 10, token_ratio = 0.1 }\n";
        let publish = "[endpoints.\"message-publish\"]\n";
        let db = "[endpoints.database]\n";
        assert_eq!(
            Policies::from_toml(&format!("{risk}{publish}")).map(|_| ()),
            Err(PolicyError::Missing(DATABASE))
        );
        assert_eq!(
            Policies::from_toml(&format!("{risk}{publish}{db}[endpoints.databse]\n")).map(|_| ()),
            Err(PolicyError::Unknown("databse".into()))
        );
        assert!(matches!(
            Policies::from_toml(&format!("[endpoints.\"risk-check\"]\n{publish}{db}")),
            Err(PolicyError::Unsuitable {
                endpoint: RISK_CHECK,
                ..
            })
        ));
        assert!(matches!(
            Policies::from_toml("[endpoints.database]\nretry = { max_attempts = 0 }\n"),
            Err(PolicyError::Config(_))
        ));
    }
}
