//! An instance's `/metrics` page, written by the test and served on 127.0.0.1: what the
//! collector scrapes, without a client stack behind it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use stormguard::clock::ManualClock;

/// One instance's `/metrics`, written by the test.
#[derive(Clone, Default)]
pub struct MetricsPage {
    page: Arc<Mutex<String>>,
    /// Moved forward by this much while the page is served (once): a slow target.
    slow: Arc<Mutex<Option<(ManualClock, Duration)>>>,
}

impl MetricsPage {
    /// Serves the page on 127.0.0.1; returns its URL.
    pub async fn serve(&self) -> String {
        let (page, slow) = (self.page.clone(), self.slow.clone());
        let router = Router::new().route(
            "/metrics",
            get(move || {
                if let Some((clock, by)) = slow.lock().unwrap().take() {
                    clock.advance(by);
                }
                let page = page.clone();
                async move { page.lock().unwrap().clone() }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{addr}/metrics")
    }

    /// The next read of the page moves `clock` forward by `by` before it answers.
    pub fn slow_once(&self, clock: &ManualClock, by: Duration) {
        *self.slow.lock().unwrap() = Some((clock.clone(), by));
    }

    /// Serves `text` as it is (a page that is not the exposition format, say).
    pub fn set_text(&self, text: &str) {
        *self.page.lock().unwrap() = text.to_owned();
    }

    /// The counters of `endpoint` after `ok` calls answered 200 at the first attempt (under
    /// 100 ms) and `failed` calls that got 504 on each of their 3 attempts (under 500 ms),
    /// as the client stack writes them, and the process's memory.
    pub fn set(&self, endpoint: &str, ok: u64, failed: u64) {
        let attempts = ok + 3 * failed;
        self.set_text(&format!(
            "# TYPE stormguard_requests_total counter\n\
             stormguard_requests_total{{endpoint=\"{endpoint}\",outcome=\"succeeded\"}} {ok}\n\
             stormguard_requests_total{{endpoint=\"{endpoint}\",outcome=\"attempts_exhausted\"}} {failed}\n\
             stormguard_attempts_total{{endpoint=\"{endpoint}\"}} {attempts}\n\
             stormguard_responses_total{{endpoint=\"{endpoint}\",code=\"200\"}} {ok}\n\
             stormguard_responses_total{{endpoint=\"{endpoint}\",code=\"504\"}} {f3}\n\
             stormguard_attempt_duration_seconds_bucket{{endpoint=\"{endpoint}\",le=\"0.1\"}} {ok}\n\
             stormguard_attempt_duration_seconds_bucket{{endpoint=\"{endpoint}\",le=\"0.5\"}} {attempts}\n\
             stormguard_attempt_duration_seconds_bucket{{endpoint=\"{endpoint}\",le=\"+Inf\"}} {attempts}\n\
             process_resident_memory_bytes 4096\n",
            f3 = 3 * failed
        ));
    }
}
