//! The last rounds of observations of each service, kept in memory for charts.
//!
//! The rules only need the newest round; a person looking at why a rule fired needs the
//! minutes before it. Each collection round of a service is kept here ([`Round`]: when, what
//! the rules read, and the traffic behind the ratios), the oldest dropped past
//! [`MetricHistory::capacity`], so memory stays bounded whatever runs for how long. Nothing
//! here is stored: a restarted center starts with an empty history.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use stormguard::rules::{Observations, Series};

/// How many rounds are kept per service by default: 30 minutes at one round a second.
pub const DEFAULT_HISTORY_ROUNDS: usize = 1800;

/// The most services whose history is kept; a round of a further service is not kept.
pub const MAX_HISTORY_SERVICES: usize = 1024;

/// One collection round of one service.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// When it was read, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// The seconds of traffic it covers (the time since the previous scrape, or the PromQL
    /// window).
    pub window_seconds: f64,
    /// What the rules read: error ratios and P99 per downstream endpoint, CPU and memory of
    /// the service.
    pub observations: Observations,
    /// The traffic behind the ratios, per downstream endpoint (every endpoint the round saw
    /// is a key, with or without traffic).
    pub endpoints: BTreeMap<String, EndpointTraffic>,
    /// Threads of the instance with the most (`process_threads`), where exposed.
    pub threads: Option<f64>,
    /// Instances read this round (scraped, or found in the PromQL answer).
    pub instances: usize,
    /// Instances that could not be read this round, each with why (`web-1: timed out`).
    pub failures: Vec<String>,
    /// Downstream endpoints not read this round because an instance named more than
    /// [`MAX_ENDPOINTS`](super::MAX_ENDPOINTS) (summed over the instances).
    pub dropped_endpoints: usize,
}

/// The traffic to one downstream endpoint in one round, summed over the service's instances.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EndpointTraffic {
    /// Logical requests (calls) that ended, per second.
    pub requests_per_second: f64,
    /// Attempts sent per logical request (1 = no retries); `None` without requests.
    pub attempts_per_request: Option<f64>,
}

impl Round {
    /// The error ratio of `endpoint` (failed calls / calls), when it had traffic.
    pub fn error_ratio(&self, endpoint: &str) -> Option<f64> {
        self.observations.get(Some(endpoint), Series::ErrorRatio)
    }

    /// The P99 attempt latency of `endpoint`, in seconds, when it had traffic.
    pub fn p99_seconds(&self, endpoint: &str) -> Option<f64> {
        self.observations.get(Some(endpoint), Series::P99)
    }

    /// Attempts per logical request to `endpoint`, when it had traffic.
    pub fn attempts_per_request(&self, endpoint: &str) -> Option<f64> {
        self.endpoints
            .get(endpoint)
            .and_then(|t| t.attempts_per_request)
    }
}

/// The recent rounds of every service, shared by the collector that writes them and
/// whatever reads them (the dashboard). Cheap to clone: clones share the rounds.
///
/// ```
/// use stormguard_center::{MetricHistory, Round};
/// use stormguard::rules::{Observations, Series};
///
/// let history = MetricHistory::new(2);
/// for at_ms in [1_000, 2_000, 3_000] {
///     let mut observations = Observations::new();
///     observations.set_endpoint("GET /img/*", Series::ErrorRatio, 0.5);
///     history.record("web", Round {
///         at_ms,
///         window_seconds: 1.0,
///         observations,
///         endpoints: Default::default(),
///         threads: None,
///         instances: 1,
///         failures: Vec::new(),
///         dropped_endpoints: 0,
///     });
/// }
/// let rounds = history.rounds("web");
/// assert_eq!(rounds.iter().map(|r| r.at_ms).collect::<Vec<_>>(), [2_000, 3_000]);
/// assert_eq!(rounds[1].error_ratio("GET /img/*"), Some(0.5));
/// assert_eq!(history.services(), ["web"]);
/// ```
#[derive(Clone, Debug)]
pub struct MetricHistory {
    capacity: usize,
    services: Arc<Mutex<BTreeMap<String, VecDeque<Round>>>>,
}

impl Default for MetricHistory {
    fn default() -> Self {
        MetricHistory::new(DEFAULT_HISTORY_ROUNDS)
    }
}

impl MetricHistory {
    /// A history keeping the last `capacity` rounds of each service (at least one).
    pub fn new(capacity: usize) -> MetricHistory {
        MetricHistory {
            capacity: capacity.max(1),
            services: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// How many rounds are kept per service.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Adds `service`'s newest round, dropping its oldest past the capacity.
    pub fn record(&self, service: &str, round: Round) {
        let mut services = self.services.lock().unwrap_or_else(PoisonError::into_inner);
        if !services.contains_key(service) && services.len() >= MAX_HISTORY_SERVICES {
            return;
        }
        let rounds = services.entry(service.to_owned()).or_default();
        if rounds.len() == self.capacity {
            rounds.pop_front();
        }
        rounds.push_back(round);
    }

    /// The kept rounds of `service`, oldest first (empty for a service never observed).
    pub fn rounds(&self, service: &str) -> Vec<Round> {
        let services = self.services.lock().unwrap_or_else(PoisonError::into_inner);
        services
            .get(service)
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The newest round of `service`.
    pub fn latest(&self, service: &str) -> Option<Round> {
        let services = self.services.lock().unwrap_or_else(PoisonError::into_inner);
        services.get(service).and_then(|r| r.back().cloned())
    }

    /// The services with at least one round, in name order.
    pub fn services(&self) -> Vec<String> {
        let services = self.services.lock().unwrap_or_else(PoisonError::into_inner);
        services.keys().cloned().collect()
    }
}
