//! The run: a center, the image service, the clients; the CDN fails and recovers on a
//! schedule; everything else happens by itself.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use stormguard::policy::PolicyFile;
use stormguard::rules::RuleSet;
use stormguard_center::{
    Center, CenterConfig, CollectConfig, Collector, Role, RuleRunner, Store, Version,
};

use super::fleet::{Fleet, FleetConfig, SERVICE};
use super::servers::{ImageService, serve};
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
    /// The rules.
    pub(crate) rules: String,
    /// Seeds the instances' jitter (instance *i* draws from `seed + i`).
    pub(crate) seed: u64,
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

/// The demo's center and its tokens.
struct DemoCenter {
    url: String,
    editor: String,
    viewer: String,
    instances: Vec<String>,
    http: reqwest::Client,
    center: Center,
    _serving: super::servers::Serving,
    _dir: tempfile::TempDir,
}

impl DemoCenter {
    async fn start(clients: usize) -> Result<DemoCenter, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
        let url = format!("sqlite://{}", dir.path().join("center.db").display());
        let store = Store::open(&url)
            .await
            .map_err(|e| format!("the center's store: {e}"))?;
        let center = Center::new(store, CenterConfig::default())
            .await
            .map_err(|e| format!("the center: {e}"))?;
        let token = |name: String, role, service: Option<&'static str>| {
            let center = center.clone();
            async move {
                center
                    .create_token(&name, role, service)
                    .await
                    .map_err(|e| format!("a token: {e}"))
            }
        };
        let editor = token("ops".to_owned(), Role::Editor, None).await?;
        let viewer = token("demo".to_owned(), Role::Viewer, None).await?;
        let mut instances = Vec::new();
        for i in 1..=clients {
            instances.push(token(format!("{SERVICE}-{i}"), Role::Instance, Some(SERVICE)).await?);
        }
        let serving = serve(center.router()).await?;
        Ok(DemoCenter {
            url: serving.url.clone(),
            editor,
            viewer,
            instances,
            http: reqwest::Client::new(),
            center,
            _serving: serving,
            _dir: dir,
        })
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<serde_json::Value>,
    ) -> Result<String, String> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("the center at {}: {e}", self.url))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| format!("the center's answer to {path}: {e}"))?;
        if status.is_success() {
            Ok(text)
        } else {
            Err(format!("the center refused {path}: {status} {text}"))
        }
    }

    /// Publishes the first version and stores the rules.
    async fn prepare(&self, config: &Config) -> Result<(), String> {
        let body = json!({"base": 0, "policy": config.policy, "message": "images: 3 retries, no fallback"});
        self.send(
            reqwest::Method::POST,
            &format!("/v1/services/{SERVICE}/versions"),
            &self.editor,
            Some(body),
        )
        .await?;
        let rules = RuleSet::from_toml(&config.rules).map_err(|e| format!("the rules: {e}"))?;
        for rule in &rules.rules {
            let rule_json: serde_json::Value = serde_json::from_str(&rule.to_json())
                .map_err(|e| format!("rule {}: {e}", rule.name))?;
            self.send(
                reqwest::Method::PUT,
                &format!("/v1/services/{}/rules/{}", rule.service, rule.name),
                &self.editor,
                Some(rule_json),
            )
            .await?;
        }
        Ok(())
    }

    /// The service's versions, oldest first.
    async fn versions(&self) -> Result<Vec<Version>, String> {
        let text = self
            .send(
                reqwest::Method::GET,
                &format!("/v1/services/{SERVICE}/versions?limit=1000"),
                &self.viewer,
                None,
            )
            .await?;
        let mut versions: Vec<Version> =
            serde_json::from_str(&text).map_err(|e| format!("the center's versions: {e}"))?;
        versions.sort_by_key(|v| v.version);
        Ok(versions)
    }
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
        let center = DemoCenter::start(config.clients).await?;
        center.prepare(config).await?;
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

    /// Runs the story on tokio's clock (real or paused), from now: the users start, the
    /// center collects and runs its rules, the CDN fails and recovers on schedule.
    pub(crate) async fn play(mut self) -> Result<Run, String> {
        let config = &self.config;
        self.timeline.restart();
        // The center's own collection loop, with its default interval: it scrapes the
        // instances the watches announced and runs the stored rules on what it reads.
        let rules = RuleSet::from_toml(&config.rules).map_err(|e| format!("the rules: {e}"))?;
        let runner = Arc::new(RuleRunner::new(
            self.center.center.clone(),
            rules.max_changes_per_hour,
        ));
        let collector =
            Collector::new(self.center.center.clone(), runner, CollectConfig::default());
        let (stop_collecting, stopped) = tokio::sync::oneshot::channel::<()>();
        let collecting = tokio::spawn(collector.run(async move {
            let _ = stopped.await;
        }));

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
        let _ = stop_collecting.send(());
        let _ = collecting.await;

        let versions = self.center.versions().await?;
        Ok(Run {
            config: config.clone(),
            record: timeline.snapshot(),
            versions,
        })
    }
}

/// Runs the story once: [`World::start`], then [`World::play`].
pub(crate) async fn run(config: &Config) -> Result<Run, String> {
    World::start(config).await?.play().await
}

async fn sleep_until(timeline: &Timeline, at: Duration) {
    let now = timeline.now();
    if at > now {
        tokio::time::sleep(at - now).await;
    }
}
