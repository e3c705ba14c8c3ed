//! The watch's loop: connect, apply what arrives, acknowledge, poll, reconnect.

use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use stormguard::classify::parse_retry_after;
use stormguard::policy::PolicyFile;
use stormguard::retry::{RandomSource, SeededRandom};
use tokio::sync::watch;

use super::sse::SseParser;
use super::{CenterState, CenterWatchConfig};
use crate::client::live::Policies;

/// The longest a center's (or a proxy's in front of it) `Retry-After` holds a watcher back.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The wait before the next watch: the jittered `backoff` on top of the shed answer's
/// `retry_after` (zero when not shed), so instances shed together do not all come back
/// together; the `Retry-After` capped, so a proxy in front cannot stop an instance following
/// its policy for a day.
fn after_shed(backoff: Duration, retry_after: Duration) -> Duration {
    backoff.saturating_add(retry_after.min(MAX_RETRY_AFTER))
}
use crate::observe::Observer;

/// The largest event (one version's snapshot) accepted: policy files are far smaller.
const MAX_EVENT: usize = 4 * 1024 * 1024;

/// A version as the center sends it (the `Snapshot` of `stormguard-center`), and as the
/// last-good file keeps it.
#[derive(Debug, Serialize, Deserialize)]
struct Snapshot {
    version: u64,
    hash: String,
    policy: String,
}

impl Snapshot {
    /// The policies, if `policy` is the text `hash` names (the SHA-256, in hex): a snapshot
    /// cut or changed on the way, or a last-good file edited by hand, is refused whole.
    fn policies(&self) -> Result<PolicyFile, String> {
        use sha2::Digest as _;
        use std::fmt::Write as _;
        let digest = sha2::Sha256::digest(self.policy.as_bytes());
        let actual = digest.iter().fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        });
        if !actual.eq_ignore_ascii_case(&self.hash) {
            return Err(format!(
                "content hash mismatch: the snapshot names {:?}, its policy hashes to {actual}",
                cut(&self.hash)
            ));
        }
        PolicyFile::from_toml(&self.policy).map_err(|e| e.to_string())
    }
}

/// At most 80 characters of `text`, for quoting a value from the network in an error.
fn cut(text: &str) -> String {
    text.chars().take(80).collect()
}

/// How one connection to the center (its stream, or the NATS bucket) ended.
#[derive(Debug)]
enum Ended {
    /// It opened and delivered until it closed.
    Delivered,
    /// It could not open.
    Failed(String),
    /// The center shed it (429, or 503: a reconnect storm is being admitted a few at a
    /// time). No poll follows at once, and the next try waits at least `retry_after`.
    Shed {
        error: String,
        retry_after: Duration,
    },
}

pub(super) struct Session<O> {
    policies: Policies<O>,
    config: CenterWatchConfig,
    client: reqwest::Client,
    state: watch::Sender<CenterState>,
}

impl<O: Observer> Session<O> {
    pub(super) fn new(
        policies: Policies<O>,
        config: CenterWatchConfig,
        client: reqwest::Client,
        state: watch::Sender<CenterState>,
    ) -> Self {
        Session {
            policies,
            config,
            client,
            state,
        }
    }

    pub(super) async fn run(self) {
        self.start_from_last_good();
        let random = match self.config.seed {
            Some(seed) => SeededRandom::new(seed),
            None => SeededRandom::from_entropy(),
        };
        let mut rng = random.rng();
        let mut failures = 0u32;
        let mut previous = None;
        loop {
            let ended = self.connect().await;
            self.state.send_modify(|s| s.connected = false);
            let mut at_least = Duration::ZERO;
            // A connection that delivered starts the count again.
            failures = match &ended {
                Ended::Delivered => 1,
                Ended::Failed(error) => {
                    self.note(error);
                    failures.saturating_add(1)
                }
                Ended::Shed { error, retry_after } => {
                    self.note(error);
                    at_least = *retry_after;
                    failures.saturating_add(1)
                }
            };
            // A center shedding load is not asked again at once: the poll waits for the
            // next try, after the delay.
            if !matches!(ended, Ended::Shed { .. }) {
                if let Err(error) = self.poll().await {
                    self.note(&error);
                }
            }
            let delay = after_shed(
                self.config.backoff.delay(failures, previous, &mut rng),
                at_least,
            );
            previous = Some(delay);
            tokio::time::sleep(delay).await;
        }
    }

    fn note(&self, error: &str) {
        self.state
            .send_modify(|s| s.last_error = Some(error.to_owned()));
    }

    fn applied(&self) -> Option<u64> {
        self.state.borrow().applied
    }

    fn start_from_last_good(&self) {
        let Some(path) = &self.config.last_good else {
            return;
        };
        if !path.exists() {
            return;
        }
        let loaded = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_json::from_str::<Snapshot>(&text).map_err(|e| e.to_string()))
            .and_then(|snapshot| {
                let file = snapshot.policies()?;
                self.policies.swap(&file).map_err(|e| e.to_string())?;
                Ok(snapshot.version)
            });
        match loaded {
            Ok(version) => self.state.send_modify(|s| s.applied = Some(version)),
            Err(error) => self.note(&format!("last-good file {}: {error}", path.display())),
        }
    }

    fn url(&self, route: &str) -> String {
        let labels: Vec<String> = self
            .config
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mut url = format!(
            "{}/v1/services/{}/{route}?instance={}&labels={}",
            self.config.url,
            encode(&self.config.service),
            encode(&self.config.instance),
            encode(&labels.join(","))
        );
        if let Some(metrics) = &self.config.metrics_url {
            url.push_str("&metrics=");
            url.push_str(&encode(metrics));
        }
        url
    }

    /// Follows the center's stream, or its NATS bucket when configured.
    async fn connect(&self) -> Ended {
        #[cfg(feature = "center-nats")]
        if let Some((url, bucket)) = &self.config.nats {
            return match self.bucket(url, bucket).await {
                Ok(()) => Ended::Delivered,
                Err(error) => Ended::Failed(error),
            };
        }
        self.stream().await
    }

    /// Watches the service's key in the NATS bucket until the watch ends.
    #[cfg(feature = "center-nats")]
    async fn bucket(&self, url: &str, bucket: &str) -> Result<(), String> {
        use futures_util::StreamExt as _;
        let client = async_nats::connect(url)
            .await
            .map_err(|e| format!("nats {url}: {e}"))?;
        let store = async_nats::jetstream::new(client)
            .get_key_value(bucket)
            .await
            .map_err(|e| format!("nats bucket {bucket}: {e}"))?;
        let mut entries = store
            .watch_with_history(&self.config.service)
            .await
            .map_err(|e| format!("nats watch: {e}"))?;
        self.state.send_modify(|s| {
            s.connected = true;
            s.connections += 1;
        });
        let mut poll = tokio::time::interval_at(
            tokio::time::Instant::now() + self.config.poll_interval,
            self.config.poll_interval,
        );
        loop {
            tokio::select! {
                entry = entries.next() => match entry {
                    None => return Ok(()),
                    Some(Err(error)) => return Err(format!("nats watch: {error}")),
                    Some(Ok(entry)) => {
                        if entry.operation != async_nats::jetstream::kv::Operation::Put {
                            continue;
                        }
                        match serde_json::from_slice::<Snapshot>(&entry.value) {
                            // Stable versions only grow: an older one arriving late is stale.
                            Ok(snapshot) if self.applied().is_some_and(|v| v >= snapshot.version) => {}
                            Ok(snapshot) => self.apply(snapshot).await,
                            Err(error) => self.note(&format!("a version in the bucket is not JSON: {error}")),
                        }
                    }
                },
                _ = poll.tick() => {
                    if let Err(error) = self.poll().await {
                        self.note(&error);
                    }
                }
            }
        }
    }

    /// One stream, until it ends.
    async fn stream(&self) -> Ended {
        let mut request = self
            .client
            .get(self.url("watch"))
            .bearer_auth(&self.config.token)
            .header("accept", "text/event-stream");
        if let Some(version) = self.applied() {
            request = request.header("last-event-id", version.to_string());
        }
        let mut response = match request.send().await {
            Ok(response) => response,
            Err(error) => return Ended::Failed(format!("watch: {error}")),
        };
        let status = response.status();
        if status == 429 || status == 503 {
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| parse_retry_after(v.as_bytes(), SystemTime::now()).ok())
                .unwrap_or(Duration::ZERO);
            return Ended::Shed {
                error: format!("watch: the center answered {status}"),
                retry_after,
            };
        }
        if !status.is_success() {
            return Ended::Failed(format!("watch: the center answered {status}"));
        }
        self.state.send_modify(|s| {
            s.connected = true;
            s.connections += 1;
        });
        let mut parser = SseParser::new(MAX_EVENT);
        let mut poll = tokio::time::interval_at(
            tokio::time::Instant::now() + self.config.poll_interval,
            self.config.poll_interval,
        );
        loop {
            tokio::select! {
                chunk = response.chunk() => {
                    let Ok(Some(chunk)) = chunk else { return Ended::Delivered };
                    let events = match parser.push(&chunk) {
                        Ok(events) => events,
                        Err(error) => return Ended::Failed(format!("watch: {error}")),
                    };
                    for event in events {
                        if event.event.as_deref() == Some("policy") {
                            self.apply_text(&event.data).await;
                        }
                    }
                }
                _ = poll.tick() => {
                    if let Err(error) = self.poll().await {
                        self.note(&error);
                    }
                }
            }
        }
    }

    /// The conditional poll: fetches the version the instance should run unless it is the
    /// one in use.
    async fn poll(&self) -> Result<(), String> {
        let mut request = self
            .client
            .get(self.url("policy"))
            .bearer_auth(&self.config.token);
        if let Some(version) = self.applied() {
            request = request.header("if-none-match", format!("\"{version}\""));
        }
        let response = request.send().await.map_err(|e| format!("poll: {e}"))?;
        match response.status().as_u16() {
            304 | 404 => Ok(()),
            200 => {
                let body = response.text().await.map_err(|e| format!("poll: {e}"))?;
                self.apply_text(&body).await;
                Ok(())
            }
            status => Err(format!("poll: the center answered {status}")),
        }
    }

    async fn apply_text(&self, text: &str) {
        match serde_json::from_str::<Snapshot>(text) {
            Ok(snapshot) => self.apply(snapshot).await,
            Err(error) => self.note(&format!("a version the center sent is not JSON: {error}")),
        }
    }

    async fn apply(&self, snapshot: Snapshot) {
        if self.applied() == Some(snapshot.version) {
            return;
        }
        let swapped = snapshot
            .policies()
            .and_then(|file| self.policies.swap(&file).map_err(|e| e.to_string()));
        match swapped {
            Ok(()) => {
                self.state
                    .send_modify(|s| s.applied = Some(snapshot.version));
                if let Some(path) = &self.config.last_good {
                    if let Err(error) = write_last_good(path, &snapshot) {
                        self.note(&format!("last-good file {}: {error}", path.display()));
                    }
                }
                self.acknowledge(snapshot.version, None).await;
            }
            Err(reason) => {
                self.state.send_modify(|s| {
                    s.refused += 1;
                    s.last_error = Some(format!("version {}: {reason}", snapshot.version));
                });
                self.acknowledge(snapshot.version, Some(reason)).await;
            }
        }
    }

    async fn acknowledge(&self, version: u64, refused: Option<String>) {
        let body = serde_json::json!({
            "instance": self.config.instance,
            "version": version,
            "applied": refused.is_none(),
            "reason": refused,
        });
        let sent = self
            .client
            .post(format!(
                "{}/v1/services/{}/acks",
                self.config.url,
                encode(&self.config.service)
            ))
            .bearer_auth(&self.config.token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => {}
            Ok(response) => self.note(&format!("ack: the center answered {}", response.status())),
            Err(error) => self.note(&format!("ack: {error}")),
        }
    }
}

/// Writes the file whole or not at all: a new file renamed over the old one.
fn write_last_good(path: &Path, snapshot: &Snapshot) -> std::io::Result<()> {
    let text = serde_json::to_string(snapshot).map_err(std::io::Error::other)?;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    std::fs::write(&temporary, text)?;
    std::fs::rename(&temporary, path)
}

/// Percent-encodes a query value (everything but the unreserved characters).
fn encode(value: &str) -> String {
    use std::fmt::Write as _;
    value.bytes().fold(String::new(), |mut out, b| {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
        out
    })
}

#[cfg(test)]
mod shed_tests {
    use super::*;

    #[test]
    fn a_shed_watcher_waits_the_retry_after_plus_its_jitter_and_at_most_a_minute_of_it() {
        let jitter = Duration::from_millis(37);
        assert_eq!(after_shed(jitter, Duration::ZERO), jitter);
        assert_eq!(
            after_shed(jitter, Duration::from_secs(1)),
            Duration::from_millis(1_037)
        );
        assert_eq!(
            after_shed(jitter, Duration::from_secs(86_400)),
            MAX_RETRY_AFTER + jitter
        );
    }
}
