//! Where each instance's `/metrics` is: announced by the instance when it watches, or
//! listed by the operator.
//!
//! An instance that watches its service may add `metrics=<url>` to its watch query
//! (`CenterWatchConfig::with_metrics_url` in `stormguard-tower`): while its stream is open
//! the center scrapes that URL, and when the stream ends the instance leaves the list, so
//! a stopped instance is not scraped for ever and a new one is scraped from its first
//! watch, with nothing to configure on the center. Instances that do not watch (another
//! language's client, a sidecar) are listed by the operator ([`ScrapeTargets::add_static`],
//! `stormguard center --scrape SERVICE=URL`); those stay until the center stops.
//!
//! The list is this replica's: behind a load balancer each replica scrapes the instances
//! watching it.
//!
//! The operator's list wins: an announcement under the name of an instance the operator
//! listed changes nothing (the watch itself goes on), and its end does not remove it.
//!
//! Announced URLs are input from the instances, so the list is bounded
//! ([`MAX_TARGETS_PER_SERVICE`], [`MAX_TARGETS`]; an announcement beyond them refuses the
//! watch, naming the limit). The center then sends GET requests to those URLs: any caller
//! holding an instance token of a service can make the center fetch a URL of its choosing
//! (no redirects followed, at most [`MAX_SCRAPE_BYTES`](super::MAX_SCRAPE_BYTES) read, the
//! body never shown back beyond a parse error's line number). Where the center can reach
//! what instances should not, issue instance tokens only to trusted instances, or list the
//! targets with `--scrape` and do not announce.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::api::check_name;
use crate::error::ApiError;

/// The longest metrics URL an instance may announce, in bytes.
pub const MAX_METRICS_URL: usize = 512;

/// The most instances listed for one service.
pub const MAX_TARGETS_PER_SERVICE: usize = 256;

/// The most instances listed over all services.
pub const MAX_TARGETS: usize = 4096;

/// The generation of the operator's targets.
const STATIC: u64 = 0;

/// The metrics URLs of every service's instances. Cheap to clone: clones share the list.
///
/// ```
/// use stormguard_center::ScrapeTargets;
///
/// let targets = ScrapeTargets::default();
/// targets.add_static("web", "web-1", "http://127.0.0.1:9100/metrics")?;
/// let watching = targets.announce("web", "web-2", "http://127.0.0.1:9101/metrics")?;
/// assert_eq!(targets.of("web").len(), 2);
/// drop(watching); // the watch ended
/// assert_eq!(targets.of("web"), [("web-1".to_owned(), "http://127.0.0.1:9100/metrics".to_owned())]);
/// # Ok::<(), stormguard_center::ApiError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct ScrapeTargets {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: AtomicU64,
    services: Mutex<BTreeMap<String, BTreeMap<String, Target>>>,
}

#[derive(Clone, Debug)]
struct Target {
    url: String,
    /// Which announcement put it there (0: the operator's); a watch that ended removes its
    /// own only, not a newer watch's of the same instance.
    generation: u64,
}

/// An announced target: the instance stays listed while this lives (its watch stream).
#[derive(Debug)]
pub struct Announced {
    inner: Arc<Inner>,
    service: String,
    instance: String,
    generation: u64,
}

impl Drop for Announced {
    fn drop(&mut self) {
        let mut services = self
            .inner
            .services
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(instances) = services.get_mut(&self.service) {
            if instances
                .get(&self.instance)
                .is_some_and(|t| t.generation == self.generation)
            {
                instances.remove(&self.instance);
            }
            if instances.is_empty() {
                services.remove(&self.service);
            }
        }
    }
}

impl ScrapeTargets {
    /// Lists `instance` of `service` at `url` until the center stops, in place of any
    /// announcement of the same instance. An error names what is wrong with the names or
    /// the URL, or the limit reached.
    pub fn add_static(&self, service: &str, instance: &str, url: &str) -> Result<(), ApiError> {
        check_name("service", service)?;
        check_name("instance", instance)?;
        check_url(url)?;
        self.insert(service, instance, url, STATIC)
    }

    /// Lists `instance` of `service` at `url` while the returned guard lives, unless the
    /// operator listed that instance (then nothing changes). An error names what is wrong
    /// with the URL, or the limit reached.
    pub fn announce(
        &self,
        service: &str,
        instance: &str,
        url: &str,
    ) -> Result<Announced, ApiError> {
        check_url(url)?;
        let generation = self.inner.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.insert(service, instance, url, generation)?;
        Ok(Announced {
            inner: self.inner.clone(),
            service: service.to_owned(),
            instance: instance.to_owned(),
            generation,
        })
    }

    fn insert(
        &self,
        service: &str,
        instance: &str,
        url: &str,
        generation: u64,
    ) -> Result<(), ApiError> {
        let mut services = self
            .inner
            .services
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let listed = services.get(service).and_then(|i| i.get(instance));
        if listed.is_some_and(|t| t.generation == STATIC && generation != STATIC) {
            return Ok(());
        }
        if listed.is_none() {
            let total: usize = services.values().map(BTreeMap::len).sum();
            let of_service = services.get(service).map_or(0, BTreeMap::len);
            if of_service >= MAX_TARGETS_PER_SERVICE {
                return Err(ApiError::Conflict(format!(
                    "service {service:?} already has {MAX_TARGETS_PER_SERVICE} metrics URLs listed, the most the center scrapes"
                )));
            }
            if total >= MAX_TARGETS {
                return Err(ApiError::Conflict(format!(
                    "{MAX_TARGETS} metrics URLs are listed, the most the center scrapes"
                )));
            }
        }
        services.entry(service.to_owned()).or_default().insert(
            instance.to_owned(),
            Target {
                url: url.to_owned(),
                generation,
            },
        );
        Ok(())
    }

    /// The services with at least one instance listed, in name order.
    pub fn services(&self) -> Vec<String> {
        let services = self
            .inner
            .services
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        services.keys().cloned().collect()
    }

    /// `service`'s instances and their URLs, in instance order.
    pub fn of(&self, service: &str) -> Vec<(String, String)> {
        let services = self
            .inner
            .services
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        services
            .get(service)
            .map(|instances| {
                instances
                    .iter()
                    .map(|(name, t)| (name.clone(), t.url.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// An `http` or `https` URL with a host, no credentials, at most [`MAX_METRICS_URL`] bytes.
fn check_url(url: &str) -> Result<(), ApiError> {
    let bad = |why: &str| ApiError::BadRequest(format!("metrics URL {:?}: {why}", cut(url)));
    if url.len() > MAX_METRICS_URL {
        return Err(bad(&format!("longer than {MAX_METRICS_URL} bytes")));
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("not http or https"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad("credentials in the URL"));
    }
    Ok(())
}

fn cut(text: &str) -> String {
    text.chars().take(60).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_watch_of_the_same_instance_outlives_the_older_ones_end() {
        let targets = ScrapeTargets::default();
        let old = targets
            .announce("web", "a", "http://127.0.0.1:1/metrics")
            .unwrap();
        let new = targets
            .announce("web", "a", "http://127.0.0.1:2/metrics")
            .unwrap();
        drop(old);
        assert_eq!(targets.of("web")[0].1, "http://127.0.0.1:2/metrics");
        drop(new);
        assert!(targets.services().is_empty());
    }

    #[test]
    fn bad_urls_are_refused_naming_why() {
        let targets = ScrapeTargets::default();
        for (url, why) in [
            ("ftp://h/metrics", "not http or https"),
            ("http://u:p@h/metrics", "credentials"),
            ("metrics", "relative URL"),
        ] {
            let error = targets.add_static("web", "a", url).unwrap_err().to_string();
            assert!(error.contains(why), "{url}: {error}");
        }
        let long = format!("http://h/{}", "x".repeat(MAX_METRICS_URL));
        assert!(targets.add_static("web", "a", &long).is_err());
        for (service, instance, what) in [("we b", "a", "service"), ("web", "", "instance")] {
            let error = targets
                .add_static(service, instance, "http://h/metrics")
                .unwrap_err()
                .to_string();
            assert!(error.contains(what), "{error}");
        }
        assert!(targets.services().is_empty());
    }

    #[test]
    fn the_operators_target_outlives_an_announcement_of_the_same_name() {
        let targets = ScrapeTargets::default();
        let operator = "http://127.0.0.1:1/metrics";
        targets.add_static("web", "a", operator).unwrap();
        let watch = targets
            .announce("web", "a", "http://127.0.0.1:2/metrics")
            .unwrap();
        assert_eq!(targets.of("web")[0].1, operator);
        drop(watch);
        assert_eq!(targets.of("web"), [("a".to_owned(), operator.to_owned())]);
    }

    #[test]
    fn announcements_past_the_limits_are_refused_naming_the_limit() {
        let targets = ScrapeTargets::default();
        let url = "http://127.0.0.1:1/metrics";
        let watches: Vec<Announced> = (0..MAX_TARGETS_PER_SERVICE)
            .map(|i| targets.announce("web", &format!("i{i}"), url).unwrap())
            .collect();
        let error = targets.announce("web", "one-more", url).unwrap_err();
        assert!(
            error
                .to_string()
                .contains(&MAX_TARGETS_PER_SERVICE.to_string()),
            "{error}"
        );
        // The same instance announcing again replaces its entry: not one more.
        let again = targets.announce("web", "i0", url).unwrap();
        let mut others = Vec::new();
        for s in 1..MAX_TARGETS / MAX_TARGETS_PER_SERVICE {
            for i in 0..MAX_TARGETS_PER_SERVICE {
                others.push(
                    targets
                        .announce(&format!("s{s}"), &format!("i{i}"), url)
                        .unwrap(),
                );
            }
        }
        let error = targets.announce("last", "a", url).unwrap_err();
        assert!(
            error.to_string().contains(&MAX_TARGETS.to_string()),
            "{error}"
        );
        drop((watches, again, others));
        assert!(targets.services().is_empty());
    }
}
