//! The run: a center, the image service, the clients; the CDN fails and recovers on a
//! schedule; everything else happens by itself.

use std::sync::Arc;
use std::time::Duration;

use stormguard::policy::PolicyFile;
use stormguard::rules::RuleSet;
use stormguard_center::Version;

use super::center::{CenterAt, DemoCenter};
use super::fleet::{Fleet, FleetConfig};
use super::servers::ImageService;
use super::timeline::{Record, Timeline};

/// The policy the center publishes first: `assets/self-heal/policy.toml`.
pub(crate) const POLICY: &str = include_str!("../../assets/self-heal/policy.toml");
/// The rules the center runs: `assets/self-heal/rules.toml`.
pub(crate) const RULES: &str = include_str!("../../assets/self-heal/rules.toml");

/// How a run goes.
///
/// # Default
///
/// Three client instances sending 10 images a second each; the CDN fails 10 s in, for 30 s;
/// the run lasts 70 s (the revert needs the CDN healthy for the rule's `exit_for` after its
/// `min_hold`, and then the push).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Config {
    /// Client instances.
    pub(crate) clients: usize,
    /// Requests per second per instance.
    pub(crate) rate: f64,
    /// When the CDN starts answering 504, from the start.
    pub(crate) outage_at: Duration,
    /// How long it answers 504.
    pub(crate) outage_for: Duration,
    /// How long the users send requests.
    pub(crate) duration: Duration,
    /// The policy published first.
    pub(crate) policy: String,
    /// The rules (TOML).
    pub(crate) rules: String,
    /// Seeds the instances' jitter (instance *i* draws from `seed + i`).
    pub(crate) seed: u64,
    /// Where the center runs.
    pub(crate) center: CenterAt,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            clients: 3,
            rate: 10.0,
            outage_at: Duration::from_secs(10),
            outage_for: Duration::from_secs(30),
            duration: Duration::from_secs(70),
            policy: POLICY.to_owned(),
            rules: RULES.to_owned(),
            seed: 42,
            center: CenterAt::InProcess,
        }
    }
}

impl Config {
    /// Refuses a run that cannot show the story, naming the flag.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if !(1..=20).contains(&self.clients) {
            return Err(format!("--clients: 1 to 20, not {}", self.clients));
        }
        if !(self.rate.is_finite() && (0.1..=200.0).contains(&self.rate)) {
            return Err(format!("--rate: 0.1 to 200 per second, not {}", self.rate));
        }
        if self.outage_for.is_zero() {
            return Err("--outage-for: must be more than 0s".to_owned());
        }
        if self.outage_at + self.outage_for >= self.duration {
            return Err(format!(
                "--duration: must be longer than --outage-at + --outage-for ({:?})",
                self.outage_at + self.outage_for
            ));
        }
        PolicyFile::from_toml(&self.policy).map_err(|e| format!("--policy: {e}"))?;
        RuleSet::from_toml(&self.rules).map_err(|e| format!("--rules: {e}"))?;
        Ok(())
    }
}

/// What a run produced: the record and the center's versions (oldest first).
#[derive(Clone, Debug)]
pub(crate) struct Run {
    /// The configuration it ran with.
    pub(crate) config: Config,
    /// Everything recorded.
    pub(crate) record: Record,
    /// The service's versions at the end, oldest first.
    pub(crate) versions: Vec<Version>,
}

/// Everything started and following the center, the story not begun.
pub(crate) struct World {
    config: Config,
    timeline: Arc<Timeline>,
    center: DemoCenter,
    images: ImageService,
    fleet: Fleet,
}

impl World {
    /// Starts the center (publishing the first version, storing the rules), the image
    /// service and the clients, and waits until every client runs the first version.
    pub(crate) async fn start(config: &Config) -> Result<World, String> {
        config.validate()?;
        let timeline = Arc::new(Timeline::start_now());
        let rules = RuleSet::from_toml(&config.rules).map_err(|e| format!("--rules: {e}"))?;
        let center =
            DemoCenter::start(&config.center, config.clients, rules.max_changes_per_hour).await?;
        center
            .publish(&config.policy, "images: 3 retries, no fallback")
            .await?;
        for rule in &rules.rules {
            let json = serde_json::from_str(&rule.to_json())
                .map_err(|e| format!("rule {}: {e}", rule.name))?;
            center.put_rule(&rule.service, &rule.name, json).await?;
        }
        let images = ImageService::start(&timeline).await?;
        let fleet_config = FleetConfig {
            center: center.url.clone(),
            tokens: center.instances.clone(),
            backup: images.backup.url.clone(),
            seed: config.seed,
        };
        let policy =
            PolicyFile::from_toml(&config.policy).map_err(|e| format!("the policy: {e}"))?;
        let fleet = Fleet::start(&fleet_config, &policy, &timeline).await?;
        Ok(World {
            config: config.clone(),
            timeline,
            center,
            images,
            fleet,
        })
    }

    /// The center's URL (`http://127.0.0.1:PORT`; its dashboard is at `/ui`) and a viewer
    /// token to sign in with, for a person (or a browser test) to watch the run.
    pub(crate) fn dashboard(&self) -> (&str, &str) {
        (&self.center.url, &self.center.viewer_token)
    }

    /// Resolves once every client runs `version` (`false`: a client's watch ended first).
    #[cfg(test)]
    pub(crate) fn every_client_runs(
        &self,
        version: u64,
    ) -> impl std::future::Future<Output = bool> + Send + 'static {
        self.fleet.every_instance_runs(version)
    }

    /// Runs the story on tokio's clock (real or paused), from now: the users start, the
    /// center collects and runs its rules, the CDN fails and recovers on schedule. The
    /// center still serves afterwards (its API and dashboard), until the world is dropped.
    pub(crate) async fn play(&mut self) -> Result<Run, String> {
        let config = &self.config;
        self.timeline.restart();
        // The center's own collection loop, with its default interval: it scrapes the
        // instances the watches announced and runs the stored rules on what it reads.
        let rules = RuleSet::from_toml(&config.rules).map_err(|e| format!("--rules: {e}"))?;
        self.center.start_collecting(rules.max_changes_per_hour);

        let timeline = &self.timeline;
        self.fleet
            .start_users(&self.images.cdn.url, config.rate, timeline);
        sleep_until(timeline, config.outage_at).await;
        self.images.switch.set_failing(true);
        sleep_until(timeline, config.outage_at + config.outage_for).await;
        self.images.switch.set_failing(false);
        sleep_until(timeline, config.duration).await;
        self.fleet.stop();
        // The requests in flight end within the policy's overall timeout.
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.center.stop_collecting().await;

        let versions = self.center.versions().await?;
        Ok(Run {
            config: config.clone(),
            record: timeline.snapshot(),
            versions,
        })
    }
}

/// Runs the story once: [`World::start`], then [`World::play`], saying where to watch it.
pub(crate) async fn run(config: &Config) -> Result<Run, String> {
    let mut world = World::start(config).await?;
    let (url, token) = world.dashboard();
    eprintln!("stormguard: watch it on the center's dashboard, {url}/ui (viewer token {token})");
    world.play().await
}

async fn sleep_until(timeline: &Timeline, at: Duration) {
    let now = timeline.now();
    if at > now {
        tokio::time::sleep(at - now).await;
    }
}
