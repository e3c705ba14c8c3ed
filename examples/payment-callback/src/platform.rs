//! The payment platform, simulated: it signs and sends callbacks, checks each answer, and
//! redelivers failures on WeChat Pay's schedule, compressed by a time-scale factor.
//!
//! An answer counts only if it is HTTP 200 with the body `success` within the platform's 5 s;
//! anything else — another status, another body, a reset, a connection closed before the
//! answer, a timeout — is a failed delivery, redelivered after the next interval of
//! [`WECHAT_SCHEDULE`] divided by the time scale (15 s → 15 ms at 1000). When the schedule runs
//! out the notification is lost, which the harness counts as a violation. The platform's own
//! 5 s answer timeout is real time, not scaled: the service's deadline is real too.
//!
//! Every delivery is a new connection with `Connection: close`, as a platform behind a load
//! balancer would send it; that also lets the fault proxy see where each answer ends.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stormguard::classify::RETRY_EXHAUSTED;

use crate::callback::PaymentCallback;
use crate::signature::{SIGNATURE_HEADER, Signer};

/// WeChat Pay's redelivery intervals after a failed notification: 15 s, 15 s, 30 s, 3 min,
/// 10 min, 20 min, 30 min, 30 min, 30 min, 60 min, 3 h, 3 h, 3 h, 6 h, 6 h (24 h 4 min in all).
pub const WECHAT_SCHEDULE: [Duration; 15] = [
    Duration::from_secs(15),
    Duration::from_secs(15),
    Duration::from_secs(30),
    Duration::from_secs(3 * 60),
    Duration::from_secs(10 * 60),
    Duration::from_secs(20 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(60 * 60),
    Duration::from_secs(3 * 3600),
    Duration::from_secs(3 * 3600),
    Duration::from_secs(3 * 3600),
    Duration::from_secs(6 * 3600),
    Duration::from_secs(6 * 3600),
];

/// How long the platform waits for an answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// How one delivery was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 200 `success`.
    Success,
    /// Any other HTTP answer.
    Http {
        /// The status.
        status: u16,
        /// Whether it carried `X-Retry-Exhausted: true`.
        retry_exhausted: bool,
    },
    /// No HTTP answer: reset, closed, refused or timed out.
    Transport(String),
}

/// One delivery (an HTTP request) of a notification.
#[derive(Clone, Debug)]
pub struct DeliveryRecord {
    /// The order.
    pub out_trade_no: String,
    /// When it was sent, after the platform started.
    pub sent: Duration,
    /// How long the answer took (to the error, for a transport failure).
    pub latency: Duration,
    /// The answer.
    pub answer: Answer,
}

/// What became of one notification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotificationReport {
    /// Whether it was finally answered `success`.
    pub delivered: bool,
    /// Deliveries sent, redeliveries included.
    pub deliveries: u32,
}

/// Totals over every delivery so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PlatformStats {
    /// Deliveries sent.
    pub deliveries: u64,
    /// Answered 200 `success`.
    pub successes: u64,
    /// Answered with something else.
    pub http_failures: u64,
    /// … of which carried `X-Retry-Exhausted: true`.
    pub retry_exhausted: u64,
    /// Not answered (reset, closed, refused, timed out).
    pub transport_failures: u64,
    /// The longest time to an HTTP answer.
    pub max_latency: Duration,
}

/// Building the platform's HTTP client failed.
#[derive(Debug, thiserror::Error)]
#[error("building the platform's HTTP client: {0}")]
pub struct PlatformError(#[from] reqwest::Error);

/// The simulated platform.
#[derive(Debug)]
pub struct Platform {
    http: reqwest::Client,
    url: String,
    signer: Signer,
    schedule: Vec<Duration>,
    origin: Instant,
    in_flight: AtomicU64,
    log: Mutex<Vec<DeliveryRecord>>,
}

/// Counts a delivery in flight until dropped.
struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Platform {
    /// A platform sending to `url`, signing with `signer`, redelivering on
    /// [`WECHAT_SCHEDULE`] divided by `time_scale` (at least 1).
    pub fn new(
        url: impl Into<String>,
        signer: Signer,
        time_scale: f64,
    ) -> Result<Self, PlatformError> {
        let scale = if time_scale.is_finite() && time_scale >= 1.0 {
            time_scale
        } else {
            1.0
        };
        let http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .timeout(ANSWER_TIMEOUT)
            .build()?;
        Ok(Platform {
            http,
            url: url.into(),
            signer,
            schedule: WECHAT_SCHEDULE.iter().map(|d| d.div_f64(scale)).collect(),
            origin: Instant::now(),
            in_flight: AtomicU64::new(0),
            log: Mutex::new(Vec::new()),
        })
    }

    /// The redelivery intervals in use.
    pub fn schedule(&self) -> &[Duration] {
        &self.schedule
    }

    /// Time since the platform started.
    pub fn elapsed(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Sends `cb` once and records the answer.
    pub async fn deliver(&self, cb: &PaymentCallback) -> Answer {
        let body = cb.to_json();
        let signature = self.signer.sign(&body);
        let sent = self.origin.elapsed();
        let started = Instant::now();
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let _in_flight = InFlight(&self.in_flight);
        let result = self
            .http
            .post(&self.url)
            .header(SIGNATURE_HEADER, signature)
            .header("content-type", "application/json")
            .header("connection", "close")
            .body(body)
            .send()
            .await;
        let answer = match result {
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_exhausted = response
                    .headers()
                    .get(RETRY_EXHAUSTED)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                match response.bytes().await {
                    Ok(body) if status == 200 && body.as_ref() == b"success" => Answer::Success,
                    Ok(_) => Answer::Http {
                        status,
                        retry_exhausted,
                    },
                    Err(e) => Answer::Transport(format!("reading the answer: {e}")),
                }
            }
            Err(e) => Answer::Transport(e.to_string()),
        };
        let record = DeliveryRecord {
            out_trade_no: cb.out_trade_no.clone(),
            sent,
            latency: started.elapsed(),
            answer: answer.clone(),
        };
        if let Ok(mut log) = self.log.lock() {
            log.push(record);
        }
        answer
    }

    /// Delivers `cb` until it is answered `success` or the schedule runs out.
    pub async fn notify(&self, cb: &PaymentCallback) -> NotificationReport {
        let mut deliveries = 1;
        if self.deliver(cb).await == Answer::Success {
            return NotificationReport {
                delivered: true,
                deliveries,
            };
        }
        for wait in &self.schedule {
            tokio::time::sleep(*wait).await;
            deliveries += 1;
            if self.deliver(cb).await == Answer::Success {
                return NotificationReport {
                    delivered: true,
                    deliveries,
                };
            }
        }
        NotificationReport {
            delivered: false,
            deliveries,
        }
    }

    /// Deliveries sent and not yet answered.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Every delivery so far.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Totals over every delivery so far.
    pub fn stats(&self) -> PlatformStats {
        let mut stats = PlatformStats::default();
        for d in self.deliveries() {
            stats.deliveries += 1;
            match d.answer {
                Answer::Success => stats.successes += 1,
                Answer::Http {
                    retry_exhausted, ..
                } => {
                    stats.http_failures += 1;
                    if retry_exhausted {
                        stats.retry_exhausted += 1;
                    }
                }
                Answer::Transport(_) => stats.transport_failures += 1,
            }
            if !matches!(d.answer, Answer::Transport(_)) {
                stats.max_latency = stats.max_latency.max(d.latency);
            }
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_wechats_compressed() {
        let signer = Signer::new("s").expect("non-empty");
        let p = Platform::new("http://127.0.0.1:9/", signer.clone(), 1000.0).expect("client");
        assert_eq!(p.schedule()[0], Duration::from_millis(15));
        assert_eq!(p.schedule()[3], Duration::from_millis(180));
        assert_eq!(p.schedule()[14], Duration::from_millis(21_600));
        let total: Duration = WECHAT_SCHEDULE.iter().sum();
        assert_eq!(total, Duration::from_secs(24 * 3600 + 4 * 60));
        // A nonsensical scale is no compression, not a panic.
        let p = Platform::new("http://127.0.0.1:9/", signer, f64::NAN).expect("client");
        assert_eq!(p.schedule()[0], Duration::from_secs(15));
    }
}
