//! Spans, metrics and JSON log lines of a run, collected in process under paused time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use stormguard::backoff::{Backoff, Jitter};
use stormguard::budget::TokenBucket;
use stormguard::retry::RetryPolicy;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::metric_names as names;
use stormguard_tower::observe::SPAN_NAME;
use stormguard_tower::retry::RetryLayer;
use stormguard_tower::wire::is_exhausted;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// A span's id, name and fields.
type Captured = (Id, &'static str, BTreeMap<String, String>);

/// Every span, in creation order.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Captured>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let name = attrs.metadata().name();
        self.0.lock().unwrap().push((id.clone(), name, fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some((_, _, fields)) = spans.iter_mut().rev().find(|(i, _, _)| i == id) {
            values.record(&mut Fields(fields));
        }
    }
}

impl Spans {
    fn attempts(&self) -> Vec<BTreeMap<String, String>> {
        let spans = self.0.lock().unwrap();
        spans
            .iter()
            .filter(|(_, name, _)| *name == SPAN_NAME)
            .map(|(_, _, fields)| fields.clone())
            .collect()
    }
}

/// A buffer the JSON formatter writes lines into.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn json(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

/// Collects spans, JSON lines and metrics for the rest of the (single-threaded) test.
struct Collected {
    spans: Spans,
    lines: Lines,
    metrics: Snapshotter,
    _tracing: tracing::subscriber::DefaultGuard,
    _recorder: &'static DebuggingRecorder,
    _metrics: metrics::LocalRecorderGuard<'static>,
}

fn collect() -> Collected {
    let spans = Spans::default();
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::registry().with(spans.clone()).with(
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(move || writer.clone()),
    );
    let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
    Collected {
        spans,
        lines,
        metrics: recorder.snapshotter(),
        _tracing: tracing::subscriber::set_default(subscriber),
        _recorder: recorder,
        _metrics: metrics::set_default_local_recorder(recorder),
    }
}

/// `(name, labels) → value` for every metric recorded.
fn metrics(snapshotter: &Snapshotter) -> BTreeMap<(String, Vec<String>), DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            ((key.name().to_owned(), labels), value)
        })
        .collect()
}

fn counter(m: &BTreeMap<(String, Vec<String>), DebugValue>, name: &str, labels: &[&str]) -> u64 {
    // Every client metric is labelled with its endpoint first.
    let key = (
        name.to_owned(),
        std::iter::once("endpoint=default".to_owned())
            .chain(labels.iter().map(|l| (*l).to_owned()))
            .collect(),
    );
    match m.get(&key) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{key:?}: {other:?}"),
    }
}

fn histogram(m: &BTreeMap<(String, Vec<String>), DebugValue>, name: &str) -> Vec<f64> {
    match m.get(&(name.to_owned(), vec!["endpoint=default".to_owned()])) {
        Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.0).collect(),
        other => panic!("{name}: {other:?}"),
    }
}

type Answer = Result<Response<Full<Bytes>>, Infallible>;

/// An in-process downstream: each attempt takes 10 ms, and answers `statuses[n]`.
fn downstream(
    statuses: &'static [StatusCode],
) -> impl tower::Service<
    Request<ReplayBody<Full<Bytes>>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Future<Output = Answer> + Send,
> + Clone {
    let calls = Arc::new(AtomicU32::new(0));
    service_fn(move |_req: Request<ReplayBody<Full<Bytes>>>| {
        let n = calls.fetch_add(1, Ordering::Relaxed) as usize;
        let status = statuses[n.min(statuses.len() - 1)];
        async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mut response = Response::new(Full::default());
            *response.status_mut() = status;
            Ok(response)
        }
    })
}

fn request() -> Request<Full<Bytes>> {
    Request::get("http://inventory/items/7")
        .header("x-request-id", "req-7")
        .body(Full::default())
        .unwrap()
}

fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::new(attempts)
        .with_backoff(Backoff::fixed(Duration::from_millis(20)).with_jitter(Jitter::None))
}

#[tokio::test(start_paused = true)]
async fn two_retries_show_as_three_attempts() {
    let collected = collect();
    const STATUSES: &[StatusCode] = &[
        StatusCode::SERVICE_UNAVAILABLE,
        StatusCode::SERVICE_UNAVAILABLE,
        StatusCode::OK,
    ];
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(policy(3)).expect("valid policy"))
        .service(downstream(STATUSES));
    let response = client.oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    // Spans: one per attempt, with the OpenTelemetry resend count on retries only.
    let spans = collected.spans.attempts();
    assert_eq!(spans.len(), 3);
    for (i, span) in spans.iter().enumerate() {
        let status = if i < 2 { "503" } else { "200" };
        let outcome = if i < 2 { "retryable" } else { "success" };
        assert_eq!(span["retry.attempt"], (i + 1).to_string());
        assert_eq!(span["http.request.method"], "GET");
        assert_eq!(span["request_id"], "req-7");
        assert_eq!(span["http.response.status_code"], status);
        assert_eq!(span["retry.outcome"], outcome);
        assert_eq!(span["elapsed_ms"], "10");
        if i == 0 {
            assert!(!span.contains_key("http.request.resend_count"));
            assert!(!span.contains_key("retry.reason"));
        } else {
            assert_eq!(span["http.request.resend_count"], i.to_string());
            assert_eq!(span["retry.reason"], "failed");
            assert_eq!(span["retry.delay_ms"], "20");
        }
    }

    // JSON lines: one per attempt.
    let lines = collected.lines.json();
    assert_eq!(lines.len(), 3, "{lines:?}");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["target"], "stormguard::retry");
        assert_eq!(line["message"], "attempt finished");
        assert_eq!(line["request_id"], "req-7");
        assert_eq!(line["retry_count"], i);
        assert_eq!(line["elapsed_ms"], 10);
        assert_eq!(line["status_code"], if i < 2 { 503 } else { 200 });
        assert!(line.get("error_type").is_none());
        assert_eq!(line["span"]["name"], SPAN_NAME);
    }

    // Metrics.
    let m = metrics(&collected.metrics);
    assert_eq!(counter(&m, names::ATTEMPTS, &[]), 3);
    assert_eq!(counter(&m, names::RETRIES, &["reason=failed"]), 2);
    assert_eq!(counter(&m, names::REQUESTS, &["outcome=succeeded"]), 1);
    assert_eq!(histogram(&m, names::ATTEMPT_DURATION), vec![0.01; 3]);
    assert_eq!(histogram(&m, names::RETRY_DELAY), vec![0.02; 2]);
    assert!(!m.contains_key(&(names::BUDGET_REFUSALS.to_owned(), vec![])));
}

#[tokio::test(start_paused = true)]
async fn a_budget_refusal_is_counted() {
    let collected = collect();
    const STATUSES: &[StatusCode] = &[StatusCode::SERVICE_UNAVAILABLE];
    // Two tokens: the first failure leaves one, not more than half, so no retry.
    let layer = RetryLayer::builder(policy(3))
        .with_budget(Arc::new(TokenBucket::grpc(2, 0.1).unwrap()))
        .build()
        .expect("valid policy");
    let client = ServiceBuilder::new()
        .layer(layer)
        .service(downstream(STATUSES));
    let response = client.oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(is_exhausted(response.headers()));
    let m = metrics(&collected.metrics);
    assert_eq!(counter(&m, names::ATTEMPTS, &[]), 1);
    assert_eq!(counter(&m, names::BUDGET_REFUSALS, &[]), 1);
    assert_eq!(
        counter(&m, names::REQUESTS, &["outcome=budget_exhausted"]),
        1
    );
    assert_eq!(collected.lines.json().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn timeouts_are_logged_with_their_error_type() {
    let collected = collect();
    const STATUSES: &[StatusCode] = &[StatusCode::OK];
    // Each attempt takes 10 ms; the per-try timeout is 5 ms.
    let layer = RetryLayer::new(policy(3).with_per_try_timeout(Duration::from_millis(5)))
        .expect("valid policy");
    let client = ServiceBuilder::new()
        .layer(layer)
        .service(downstream(STATUSES));
    let err = client.oneshot(request()).await.unwrap_err();
    assert!(err.is_timeout());
    assert_eq!(err.attempts(), 3);
    let lines = collected.lines.json();
    assert_eq!(lines.len(), 3);
    for line in &lines {
        assert_eq!(line["error_type"], "timeout");
        assert_eq!(line["outcome"], "in_doubt");
        assert_eq!(line["elapsed_ms"], 5);
        assert!(line.get("status_code").is_none());
    }
    let spans = collected.spans.attempts();
    assert!(spans.iter().all(|s| s["error.type"] == "timeout"));
    let m = metrics(&collected.metrics);
    assert_eq!(counter(&m, names::RETRIES, &["reason=timed_out"]), 2);
    assert_eq!(
        counter(&m, names::REQUESTS, &["outcome=attempts_exhausted"]),
        1
    );
}
