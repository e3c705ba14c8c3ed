//! The scrape path of the center's collector against real HTTP servers on 127.0.0.1: two
//! instances serve `/metrics` (one announces it with its real watch, one is listed by the
//! operator), the collector reads them at instants the test chooses (an injected clock: no
//! sleeps, no timers), and the rule fires on the increases and reverts when they clear;
//! the rounds are in the center's history; a page that is not the exposition format fails
//! that instance only, naming the line; a bad metrics URL refuses the watch; a target slow
//! to answer has its rates over the time until its page was read; and `run`, in paused
//! time, reads once per interval and stops when told.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use serde_json::json;
use stormguard::clock::ManualClock;
use stormguard::rules::{Series, Verdict};
use stormguard_center::{CollectConfig, Collector, RuleRunner};
use stormguard_tower::client::{CenterWatch, CenterWatchConfig};
use support::metrics_page::MetricsPage;
use support::{TestCenter, attempts, client_stack};

fn rule() -> serde_json::Value {
    json!({
        "name": "cdn-504",
        "service": "web",
        "endpoint": "default",
        "for": "2s",
        "exit_for": "2s",
        "when": { "series": "error_ratio", "code": 504, "above": 0.10, "exit_below": 0.02 },
        "actions": [{ "set": "attempts", "max_attempts": 1 }]
    })
}

/// The center, its collector and the clock that stamps its scrapes.
async fn setup() -> (TestCenter, Collector, ManualClock) {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    assert_eq!(editor.publish("web", 0, &attempts(3)).await.0, 201);
    let (status, _) = editor
        .send(
            "PUT",
            "/v1/services/web/rules/cdn-504",
            Some(rule().to_string().into_bytes()),
        )
        .await;
    assert_eq!(status, 204);
    let runner = Arc::new(RuleRunner::new(center.center.clone(), 6));
    let clock = ManualClock::new();
    let config = CollectConfig {
        clock: clock.clock(),
        ..CollectConfig::default()
    };
    let collector = Collector::new(center.center.clone(), runner, config);
    (center, collector, clock)
}

/// `clock` moved to `seconds` after its origin; that instant.
fn at(clock: &ManualClock, seconds: u64) -> Instant {
    let to = Duration::from_secs(seconds);
    clock.advance(to.saturating_sub(clock.elapsed()));
    clock.origin() + to
}

/// A real watch of `web` announcing `metrics`, open once it has applied version 1.
async fn watch(center: &TestCenter, instance: &str, metrics: &str) -> CenterWatch {
    let token = center.instance_token("web").await;
    let layer = client_stack(3);
    let config = CenterWatchConfig::new(&center.url(), "web", instance, &token)
        .with_poll_interval(Duration::from_secs(3600))
        .with_metrics_url(metrics);
    let watch = CenterWatch::start(layer.policies(), config).unwrap();
    watch.wait_for(|s| s.applied == Some(1)).await;
    watch
}

#[tokio::test]
async fn scraped_increases_fire_the_rule_and_its_revert() {
    let (center, collector, clock) = setup().await;
    let (one, two) = (MetricsPage::default(), MetricsPage::default());
    one.set("default", 100, 0);
    two.set("default", 50, 0);
    let one_url = one.serve().await;
    let two_url = two.serve().await;
    let watching = watch(&center, "web-1", &one_url).await;
    center
        .center
        .scrape_targets()
        .add_static("web", "web-2", &two_url)
        .unwrap();
    assert_eq!(center.center.scrape_targets().of("web").len(), 2);

    let at = |s: u64| at(&clock, s);
    // The first scrape is a baseline: no rates yet.
    let first = collector.round(at(0)).await;
    let round = first[0].round.clone().unwrap();
    assert_eq!((round.instances, round.failures.len()), (2, 0));
    assert_eq!(round.error_ratio("default"), None);

    // web-1: 20 calls, 10 of them 504 on all 3 attempts; web-2: 20 good calls.
    one.set("default", 110, 10);
    two.set("default", 70, 0);
    let second = collector.round(at(1)).await;
    let round = second[0].round.clone().unwrap();
    let seen = &round.observations;
    assert_eq!(
        seen.get(Some("default"), Series::ErrorRatio),
        Some(10.0 / 40.0)
    );
    // 30 attempts of 504 out of 60 ended attempts.
    assert_eq!(
        seen.get(Some("default"), Series::ErrorRatioCode(504)),
        Some(0.5)
    );
    assert_eq!(
        seen.get(Some("default"), Series::ErrorRatioClass(5)),
        Some(0.5)
    );
    assert_eq!(seen.get(None, Series::Memory), Some(4096.0));
    assert_eq!(round.attempts_per_request("default"), Some(60.0 / 40.0));
    assert_eq!(round.endpoints["default"].requests_per_second, 40.0);
    assert!(
        second[0].events.as_ref().unwrap().is_empty(),
        "held 0 s of 2 s"
    );

    one.set("default", 120, 20);
    two.set("default", 90, 0);
    let third = collector.round(at(3)).await;
    let events = third[0].events.as_ref().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].verdict, events[0].version),
        (Verdict::Fire, Some(2))
    );

    // The 504s stop: the condition clears, and after exit_for the rule reverts.
    one.set("default", 150, 20);
    two.set("default", 110, 0);
    assert!(
        collector.round(at(4)).await[0]
            .events
            .as_ref()
            .unwrap()
            .is_empty()
    );
    one.set("default", 180, 20);
    two.set("default", 130, 0);
    let reverted = collector.round(at(6)).await;
    let events = reverted[0].events.as_ref().unwrap();
    assert_eq!(
        (events[0].verdict, events[0].version),
        (Verdict::Revert, Some(3))
    );

    let history = center.center.metric_history().rounds("web");
    assert_eq!(history.len(), 5);
    assert_eq!(history[4].error_ratio("default"), Some(0.0));
    assert!(history.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));

    // The watch ends: its instance is no longer scraped.
    drop(watching);
    let targets = center.center.scrape_targets().clone();
    for _ in 0..1000 {
        if targets.of("web").len() == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(targets.of("web"), [("web-2".to_owned(), two_url)]);
}

#[tokio::test]
async fn a_slow_target_is_read_over_the_time_until_its_page_was_read() {
    let (center, collector, clock) = setup().await;
    let slow = MetricsPage::default();
    slow.set("default", 0, 0);
    let url = slow.serve().await;
    center
        .center
        .scrape_targets()
        .add_static("web", "slow", &url)
        .unwrap();
    collector.round(at(&clock, 0)).await;
    // The round starts at 1 s; the page is read a second later, 20 calls since the first.
    slow.set("default", 20, 0);
    slow.slow_once(&clock, Duration::from_secs(1));
    let rounds = collector.round(at(&clock, 1)).await;
    let round = rounds[0].round.clone().unwrap();
    assert_eq!(round.window_seconds, 2.0);
    assert_eq!(round.endpoints["default"].requests_per_second, 10.0);
}

#[tokio::test]
async fn a_page_that_is_not_the_exposition_format_fails_its_instance_only() {
    let (center, collector, _) = setup().await;
    let (good, bad) = (MetricsPage::default(), MetricsPage::default());
    good.set("default", 10, 0);
    bad.set_text("ok 1\n<html>oops</html>\n");
    let targets = center.center.scrape_targets();
    targets
        .add_static("web", "good", &good.serve().await)
        .unwrap();
    targets
        .add_static("web", "bad", &bad.serve().await)
        .unwrap();
    targets
        .add_static("web", "gone", "http://127.0.0.1:9/metrics")
        .unwrap();
    let rounds = collector.round(Instant::now()).await;
    let round = rounds[0].round.clone().unwrap();
    assert_eq!(round.instances, 1);
    assert_eq!(round.failures.len(), 2, "{:?}", round.failures);
    assert!(
        round.failures[0].starts_with("bad: ") && round.failures[0].contains("line 2"),
        "{:?}",
        round.failures
    );
    assert!(
        round.failures[1].starts_with("gone: "),
        "{:?}",
        round.failures
    );
}

#[tokio::test]
async fn a_watch_announcing_a_bad_metrics_url_is_refused() {
    let center = TestCenter::sqlite().await;
    let token = center.instance_token("web").await;
    let api = center.api(&token);
    for url in ["ftp%3A%2F%2Fh%2Fm", "http%3A%2F%2Fu%3Ap%40h%2Fm", "nope"] {
        let (status, body) = api
            .get(&format!("/v1/services/web/watch?instance=a&metrics={url}"))
            .await;
        assert_eq!(status, 400, "{url}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains("metrics URL"),
            "{body}"
        );
    }
    assert!(center.center.scrape_targets().services().is_empty());
}

#[tokio::test]
async fn a_prometheus_that_cannot_be_read_is_a_typed_error_and_changes_nothing() {
    use stormguard_center::collect::PromqlError;
    use stormguard_center::{PrometheusSource, Source};

    let (center, _, _) = setup().await;
    // A server that answers every path, /api/v1/query too, with a page.
    let router = Router::new().fallback(get(|| async { "<html>no</html>" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let garbage = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    for (url, unreachable) in [("http://127.0.0.1:9", true), (garbage.as_str(), false)] {
        let runner = Arc::new(RuleRunner::new(center.center.clone(), 6));
        let config = CollectConfig {
            source: Source::Prometheus(PrometheusSource::new(url)),
            ..CollectConfig::default()
        };
        let collector = Collector::new(center.center.clone(), runner, config);
        let rounds = collector.round(Instant::now()).await;
        assert_eq!(rounds.len(), 1, "the service with a rule");
        assert!(rounds[0].round.is_none());
        assert!(rounds[0].events.as_ref().unwrap().is_empty());
        match &rounds[0].error {
            Some(PromqlError::Unreachable { .. }) if unreachable => {}
            Some(PromqlError::Malformed { what, .. }) if !unreachable => {
                assert!(what.contains("not its JSON"), "{what}");
            }
            other => panic!("{url}: {other:?}"),
        }
    }
    assert!(center.center.metric_history().rounds("web").is_empty());
}

#[tokio::test]
async fn run_reads_every_interval_and_stops_when_told() {
    let center = TestCenter::sqlite().await;
    // A `/metrics` that tells the test when it is read, on the runtime's (paused) clock.
    let (read, mut reads) = tokio::sync::mpsc::unbounded_channel();
    let router = Router::new().route(
        "/metrics",
        get(move || {
            let _ = read.send(tokio::time::Instant::now());
            async { "process_resident_memory_bytes 4096\n" }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    center
        .center
        .scrape_targets()
        .add_static("web", "web-1", &url)
        .unwrap();
    let runner = Arc::new(RuleRunner::new(center.center.clone(), 6));
    let interval = Duration::from_secs(10);
    let config = CollectConfig {
        interval,
        timeout: Duration::from_secs(5),
        ..CollectConfig::default()
    };
    let collector = Collector::new(center.center.clone(), runner, config);
    // From here on the clock only moves when every task waits (paused time); the test
    // waits on the reads themselves, never on a timer of its own.
    tokio::time::pause();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(collector.run(async move {
        let _ = stopped.await;
    }));
    let mut at = Vec::new();
    for _ in 0..3 {
        at.push(reads.recv().await.unwrap());
    }
    for pair in at.windows(2) {
        assert!(
            pair[1] - pair[0] >= interval,
            "one read per interval at most: {:?}",
            pair[1] - pair[0]
        );
    }
    stop.send(()).unwrap();
    // It finishes the round in progress, if any, and returns.
    running.await.unwrap();
    let read_before_stop = at.len() + std::iter::from_fn(|| reads.try_recv().ok()).count();
    tokio::time::sleep(10 * interval).await;
    assert!(reads.try_recv().is_err(), "no read after the stop");
    assert!(
        center.center.metric_history().rounds("web").len() >= read_before_stop,
        "each read is a recorded round"
    );
}

#[tokio::test]
async fn every_query_of_a_promql_round_is_evaluated_at_one_instant() {
    use axum::extract::Query;
    use std::collections::HashMap;
    use stormguard_center::{PrometheusSource, Source};

    let (center, _, _) = setup().await;
    // A Prometheus stand-in that records each query and its `time`, answering an empty
    // vector.
    let seen: Arc<Mutex<Vec<HashMap<String, String>>>> = Arc::default();
    let record = seen.clone();
    let router = Router::new().route(
        "/api/v1/query",
        get(move |Query(params): Query<HashMap<String, String>>| {
            record.lock().unwrap().push(params);
            async { r#"{"status":"success","data":{"resultType":"vector","result":[]}}"# }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let runner = Arc::new(RuleRunner::new(center.center.clone(), 6));
    let config = CollectConfig {
        source: Source::Prometheus(PrometheusSource::new(&url)),
        ..CollectConfig::default()
    };
    let collector = Collector::new(center.center.clone(), runner, config);
    let rounds = collector.round(Instant::now()).await;
    let round = rounds[0].round.clone().unwrap();
    let seen = seen.lock().unwrap();
    assert!(seen.len() > 5, "{seen:?}");
    let times: Vec<&str> = seen.iter().map(|q| q["time"].as_str()).collect();
    assert!(times.iter().all(|t| *t == times[0]), "{times:?}");
    // The round is stamped with that instant, in milliseconds.
    let time: f64 = times[0].parse().unwrap();
    assert_eq!((time * 1000.0).round() as i64, round.at_ms);
    // CPU is a fraction of each instance's allowance.
    assert!(
        seen.iter()
            .any(|q| q["query"].contains("/ process_cpu_allowance_cores{")),
        "{seen:?}"
    );
}
