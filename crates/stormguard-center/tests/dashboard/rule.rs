//! A rule fires through the center's real collection path and the dashboard shows it: the
//! instance's `/metrics` (a page the test writes, served on 127.0.0.1, its URL announced by
//! the instance's real watch) is scraped by the `Collector` at instants the test chooses;
//! the CDN's 504s fire the rule, which publishes v2; the instance applies and ACKs it; the
//! Rules tab shows the firing with the values the collector read, and the overview charts
//! the downstream.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use stormguard::rules::{Observations, Series, Verdict};
use stormguard_center::{CollectConfig, Collector, EndpointTraffic, Round, RuleRunner};

use super::browser::{Browser, PAGE_WAIT};
use super::{EP, center_with_web, web_instance_with};
use crate::support::metrics_page::MetricsPage;

/// Two minutes of healthy rounds before the test's own, one every 5 s, so that the charts
/// show the incident against a baseline (the collector stamps its rounds with the wall
/// clock, and this test's rounds come milliseconds apart).
fn healthy_history(center: &stormguard_center::Center) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for i in 0..24i64 {
        let mut observations = Observations::new();
        let wobble = (i % 3) as f64;
        observations
            .set_endpoint(EP, Series::ErrorRatio, 0.002 * wobble)
            .set_endpoint(EP, Series::P99, 0.08 + 0.01 * wobble);
        let traffic = EndpointTraffic {
            requests_per_second: 100.0,
            attempts_per_request: Some(1.0 + 0.01 * wobble),
        };
        center.metric_history().record(
            "web",
            Round {
                at_ms: now - 125_000 + i * 5_000,
                window_seconds: 5.0,
                observations,
                endpoints: [(EP.to_owned(), traffic)].into(),
                threads: None,
                instances: 1,
                failures: Vec::new(),
                dropped_endpoints: 0,
            },
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_fires_from_collected_metrics_and_shows_with_its_values() {
    let Some(browser) = Browser::start("a_rule_fires_from_collected_metrics").await else {
        return;
    };
    let center = center_with_web().await;
    let metrics = MetricsPage::default();
    metrics.set(EP, 1000, 0);
    let url = metrics.serve().await;
    let (layer, watch) = web_instance_with(&center, "web-1", Some(&url)).await;
    let rule = json!({
        "name": "cdn-504",
        "service": "web",
        "endpoint": EP,
        "for": "5s",
        "exit_for": "10s",
        "when": { "series": "error_ratio", "code": 504, "above": 0.10, "exit_below": 0.02 },
        "actions": [
            { "set": "attempts", "max_attempts": 1 },
            { "set": "fallback", "fallback": "always" }
        ]
    });
    let (status, _) = center
        .api(&center.editor)
        .send(
            "PUT",
            "/v1/services/web/rules/cdn-504",
            Some(rule.to_string().into_bytes()),
        )
        .await;
    assert_eq!(status, 204);

    browser.sign_in(&center.url(), &center.viewer).await;
    browser
        .goto(&format!("{}/ui/services/web/rules", center.url()))
        .await;
    let card = browser.text("section.rule[data-rule='cdn-504']").await;
    assert!(
        card.contains("error_ratio{code=504} > 10%") && card.contains("It has not fired"),
        "{card}"
    );
    assert_eq!(browser.count("section.rule .badge.state.good").await, 1);

    // The collector reads the instance at instants the test chooses: a baseline, then the
    // CDN answering 504 to 40 % of calls (each tried 3 times), held past the rule's 5 s.
    healthy_history(&center.center);
    let runner = Arc::new(RuleRunner::new(center.center.clone(), 6));
    let collector = Collector::new(center.center.clone(), runner, CollectConfig::default());
    let t0 = Instant::now();
    let mut fired = None;
    let (mut ok, mut failed) = (1000, 0);
    for second in [0, 1, 3, 6] {
        if second > 0 {
            ok += 60;
            failed += 40;
            metrics.set(EP, ok, failed);
        }
        let rounds = collector.round(t0 + Duration::from_secs(second)).await;
        let web = rounds.iter().find(|c| c.service == "web").unwrap();
        assert_eq!(web.round.as_ref().unwrap().failures, Vec::<String>::new());
        for event in web.events.as_ref().unwrap() {
            fired = Some((second, event.verdict, event.version));
        }
    }
    assert_eq!(fired, Some((6, Verdict::Fire, Some(2))));
    tokio::time::timeout(PAGE_WAIT, watch.wait_for(|s| s.applied == Some(2)))
        .await
        .unwrap();
    assert_eq!(
        layer
            .policies()
            .current()
            .endpoint(EP)
            .unwrap()
            .retry()
            .max_attempts(),
        1
    );
    // The switch to the backup: no more 504s, one attempt per call.
    ok += 100;
    metrics.set(EP, ok, failed);
    collector.round(t0 + Duration::from_secs(7)).await;

    browser.refresh().await;
    let firing = browser.text("tr.firing[data-action='rule-fire']").await;
    assert!(
        firing.contains("fired")
            && firing.contains("v2")
            && firing.contains("error_ratio{code=504} = "),
        "{firing}"
    );
    assert!(firing.contains("retry.max_attempts: 3 → 1"), "{firing}");
    assert_eq!(browser.count("section.rule .badge.state.bad").await, 1);
    browser.screenshot("rule-fired").await;

    // The history names the rule as the author of v2.
    browser
        .goto(&format!("{}/ui/services/web/history", center.url()))
        .await;
    let v2 = browser.text("table.history tr#v2").await;
    assert!(v2.contains("rule") && v2.contains("cdn-504"), "{v2}");

    // The overview: the instance on v2, and the downstream's charts with the incident.
    browser
        .goto(&format!("{}/ui/services/web", center.url()))
        .await;
    browser
        .wait_for("tr[data-instance='web-1'][data-acked='2'][data-state='ack']")
        .await;
    let charts = browser
        .text(&format!(".downstream[data-endpoint='{EP}']"))
        .await;
    for title in ["Error ratio", "P99 attempt latency", "Attempts per request"] {
        assert!(charts.contains(title), "{charts}");
    }
    assert_eq!(
        browser
            .count(&format!(
                ".downstream[data-endpoint='{EP}'] svg.chart path.line"
            ))
            .await,
        3
    );
    browser.screenshot("rule-fired-overview").await;
    browser.close().await;
}
