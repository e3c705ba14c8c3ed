//! The scrape path: each listed instance's `/metrics` read over HTTP, and the increases
//! since its previous scrape.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::counters::{Counters, reading};
use super::exposition::parse;
use super::reading::Reading;
use super::targets::ScrapeTargets;

/// The largest `/metrics` body read; a larger one fails that instance's scrape.
pub const MAX_SCRAPE_BYTES: usize = 8 * 1024 * 1024;

/// The scrapes of one collector: the HTTP client and each instance's previous counters.
#[derive(Debug)]
pub(crate) struct Scraper {
    client: reqwest::Client,
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
}

impl Scraper {
    pub(crate) fn new(timeout: Duration) -> Scraper {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Scraper {
            client,
            previous: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets the previous scrapes of the services not in `services` (all their instances
    /// left), so that instances come and go without the memory growing.
    pub(crate) fn keep_only(&self, services: &[String]) {
        let mut previous = self.previous.lock().unwrap_or_else(PoisonError::into_inner);
        previous.retain(|(service, _), _| services.contains(service));
    }

    /// Scrapes every listed instance of `service` at `now`.
    pub(crate) async fn scrape(
        &self,
        targets: &ScrapeTargets,
        service: &str,
        now: Instant,
    ) -> Scraped {
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
        let mut window_seconds = 0.0f64;
        for ((instance, url), read) in listed.into_iter().zip(reads) {
            let counters = match read {
                Ok(counters) => counters,
                Err(why) => {
                    failures.push(format!("{instance}: {why}"));
                    continue;
                }
            };
            instances += 1;
            let key = (service.to_owned(), instance);
            if let Some(before) = previous.get(&key) {
                // A new URL is a new process: its first scrape is a baseline.
                if before.url == url && now > before.at {
                    let seconds = now.duration_since(before.at).as_secs_f64();
                    window_seconds = window_seconds.max(seconds);
                    increases.push((counters.since(&before.counters), seconds));
                }
            }
            previous.insert(
                key,
                Previous {
                    url,
                    counters,
                    at: now,
                },
            );
        }
        Scraped {
            reading: reading(&increases),
            window_seconds,
            instances,
            failures,
        }
    }

    async fn fetch(&self, url: &str) -> Result<Counters, String> {
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
        let text = String::from_utf8(body).map_err(|_| format!("{url}: not UTF-8"))?;
        let samples = parse(&text).map_err(|e| format!("{url}: {e}"))?;
        Ok(Counters::read(&samples))
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
