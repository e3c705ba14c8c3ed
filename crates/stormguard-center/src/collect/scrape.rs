//! The scrape path: each listed instance's `/metrics` read over HTTP, and the increases
//! since its previous scrape.
//!
//! Each instance's counters are stamped with the instant its body was read (from the
//! collector's clock), not the round's: a target slow to answer has counted for longer, and
//! dividing its increase by the round's interval would overstate its rates. At most
//! [`MAX_CONCURRENT_SCRAPES`] scrapes run at once, whatever the number of targets.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use stormguard::advise::prometheus::exposition::parse;
use stormguard::clock::Clock;
use tokio::sync::Semaphore;

use super::counters::{Counters, reading};
use super::reading::Reading;
use super::targets::ScrapeTargets;

/// The largest `/metrics` body read; a larger one fails that instance's scrape.
pub const MAX_SCRAPE_BYTES: usize = 8 * 1024 * 1024;

/// The most scrapes in flight at once, over all services.
pub const MAX_CONCURRENT_SCRAPES: usize = 64;

/// The scrapes of one collector: the HTTP client and each instance's previous counters.
#[derive(Debug)]
pub(crate) struct Scraper {
    client: reqwest::Client,
    clock: Clock,
    permits: Semaphore,
    previous: Mutex<HashMap<(String, String), Previous>>,
}

/// An instance's previous scrape: its URL, its counters and when they were read.
#[derive(Debug)]
struct Previous {
    url: String,
    counters: Counters,
    at: Instant,
}

/// What the scrapes of one service gave.
pub(crate) struct Scraped {
    pub(crate) reading: Reading,
    /// The longest time since an instance's previous scrape (0 when all were baselines).
    pub(crate) window_seconds: f64,
    pub(crate) instances: usize,
    pub(crate) failures: Vec<String>,
    /// Endpoints past [`MAX_ENDPOINTS`](super::MAX_ENDPOINTS), summed over the instances.
    pub(crate) dropped_endpoints: usize,
}

impl Scraper {
    /// Scrapes given `timeout` each, stamped by `clock`.
    pub(crate) fn new(timeout: Duration, clock: Clock) -> Scraper {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Scraper {
            client,
            clock,
            permits: Semaphore::new(MAX_CONCURRENT_SCRAPES),
            previous: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets the previous scrapes of the services not in `services` (all their instances
    /// left), so that instances come and go without the memory growing.
    pub(crate) fn keep_only(&self, services: &[String]) {
        let mut previous = self.previous.lock().unwrap_or_else(PoisonError::into_inner);
        previous.retain(|(service, _), _| services.contains(service));
    }

    /// Scrapes every listed instance of `service`.
    pub(crate) async fn scrape(&self, targets: &ScrapeTargets, service: &str) -> Scraped {
        let listed = targets.of(service);
        let reads = futures_util::future::join_all(
            listed
                .iter()
                .map(|(_, url)| async move { self.fetch(url).await }),
        )
        .await;
        let mut previous = self.previous.lock().unwrap_or_else(PoisonError::into_inner);
        previous
            .retain(|(s, instance), _| s != service || listed.iter().any(|(i, _)| i == instance));
        let mut increases = Vec::new();
        let mut failures = Vec::new();
        let mut instances = 0;
        let mut dropped_endpoints = 0;
        let mut window_seconds = 0.0f64;
        for ((instance, url), read) in listed.into_iter().zip(reads) {
            let (counters, at) = match read {
                Ok(read) => read,
                Err(why) => {
                    failures.push(format!("{instance}: {why}"));
                    continue;
                }
            };
            instances += 1;
            dropped_endpoints += counters.dropped_endpoints();
            let key = (service.to_owned(), instance);
            if let Some(before) = previous.get(&key) {
                // A new URL is a new process: its first scrape is a baseline; so is a
                // restart's (`since` is then `None`).
                if before.url == url && at > before.at {
                    if let Some(increase) = counters.since(&before.counters) {
                        let seconds = at.duration_since(before.at).as_secs_f64();
                        window_seconds = window_seconds.max(seconds);
                        increases.push((increase, seconds));
                    }
                }
            }
            previous.insert(key, Previous { url, counters, at });
        }
        Scraped {
            reading: reading(&increases),
            window_seconds,
            instances,
            failures,
            dropped_endpoints,
        }
    }

    /// `url`'s counters and the instant its body was read.
    async fn fetch(&self, url: &str) -> Result<(Counters, Instant), String> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| "the collector stopped".to_owned())?;
        let mut response = self
            .client
            .get(url)
            .header("accept", "text/plain")
            .send()
            .await
            .map_err(|e| short(&e))?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| short(&e))? {
            if body.len() + chunk.len() > MAX_SCRAPE_BYTES {
                return Err(format!("{url}: more than {MAX_SCRAPE_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        let at = self.clock.now();
        let text = String::from_utf8(body).map_err(|_| format!("{url}: not UTF-8"))?;
        let samples = parse(&text).map_err(|e| format!("{url}: {e}"))?;
        Ok((Counters::read(&samples), at))
    }
}

/// A reqwest error without its chain of sources repeated.
fn short(error: &reqwest::Error) -> String {
    let what = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    match error.url() {
        Some(url) => format!("{url}: {what}"),
        None => what.to_owned(),
    }
}
