//! The dashboard in a real browser: Debian's chromium, headless, driven through chromedriver,
//! against a real center on SQLite on 127.0.0.1 with a real instance (the one-stack client
//! fed by `CenterWatch`) watching it and acknowledging what it applies.
//!
//! Sign in, read a service, publish a change and watch the instance ACK it, roll back from
//! the history, and see a rule fire. Each test saves a screenshot under
//! `target/browser-screenshots/`. Waits are bounded polls for what the page must show (the
//! overview refreshes itself every two seconds), never fixed sleeps.
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod browser;
mod forms;
mod rule;

use std::time::Duration;

use browser::{Browser, PAGE_WAIT};
use stormguard::backoff::{Backoff, Jitter};
use stormguard_tower::client::{CenterWatch, CenterWatchConfig, ClientLayer};
use support::TestCenter;

const EP: &str = "GET /img/*";

fn policy(attempts: u32) -> String {
    format!(
        "[endpoints.\"GET /img/*\"]\nidempotency = \"idempotent\"\nretry = {{ max_attempts = {attempts} }}\ntimeouts = {{ per_try = \"300ms\", overall = \"1s\" }}\n\n[endpoints.\"POST /orders\"]\nretry = {{ max_attempts = 2 }}\n"
    )
}

/// A center with `web` published at v1 (3 attempts to the image CDN).
async fn center_with_web() -> TestCenter {
    let center = TestCenter::sqlite().await;
    let (status, _) = center
        .api(&center.editor)
        .publish("web", 0, &policy(3))
        .await;
    assert_eq!(status, 201);
    center
}

/// A `web` instance: a client stack whose policies the center feeds, ACKing each version.
async fn web_instance(center: &TestCenter, id: &str) -> (ClientLayer, CenterWatch) {
    web_instance_with(center, id, None).await
}

/// A `web` instance that also announces the URL of its `/metrics` to the center.
async fn web_instance_with(
    center: &TestCenter,
    id: &str,
    metrics: Option<&str>,
) -> (ClientLayer, CenterWatch) {
    let layer = ClientLayer::from_policy_file(
        &stormguard::policy::PolicyFile::from_toml(&policy(3)).unwrap(),
    )
    .unwrap();
    let config = CenterWatchConfig::new(
        &center.url(),
        "web",
        id,
        &center.instance_token("web").await,
    )
    .with_backoff(
        Backoff::exponential(Duration::from_millis(1))
            .with_cap(Duration::from_millis(10))
            .with_jitter(Jitter::Full),
    )
    .with_seed(1);
    let config = match metrics {
        Some(url) => config.with_metrics_url(url),
        None => config,
    };
    let watch = CenterWatch::start(layer.policies(), config).unwrap();
    tokio::time::timeout(PAGE_WAIT, watch.wait_for(|s| s.applied == Some(1)))
        .await
        .expect("the instance applied v1");
    (layer, watch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_and_read_a_service() {
    let Some(browser) = Browser::start("sign_in_and_read_a_service").await else {
        return;
    };
    let center = center_with_web().await;
    let (_layer, _watch) = web_instance(&center, "web-1").await;

    // A token the center does not know is refused on the form, saying so.
    browser.goto(&format!("{}/ui/login", center.url())).await;
    browser.fill("#token", "sg_0000").await;
    browser
        .click("form[action='/ui/login'] button[type=submit]")
        .await;
    let refusal = browser.text(".notice.bad").await;
    assert!(refusal.contains("does not know this token"), "{refusal}");
    browser.screenshot("sign-in-refused").await;

    browser.sign_in(&center.url(), &center.viewer).await;
    assert_eq!(browser.text("#who").await, "bob");
    let row = browser.text("table.services tbody tr").await;
    assert!(
        row.contains("web") && row.contains("v1") && row.contains("1 of 1"),
        "{row}"
    );
    browser.screenshot("services").await;

    browser
        .click("table.services a[href='/ui/services/web']")
        .await;
    browser
        .wait_for("tr[data-instance='web-1'][data-acked='1'][data-state='ack']")
        .await;
    let endpoint = browser
        .text("table.endpoints tr[data-endpoint='GET /img/*']")
        .await;
    assert!(
        endpoint.contains('3') && endpoint.contains("300ms") && endpoint.contains("on_give_up"),
        "{endpoint}"
    );
    assert!(browser.text(".cards").await.contains("v1"));
    browser.screenshot("service-overview").await;

    // A viewer sees the history without rollback buttons, and the policies without a form.
    browser
        .click("nav.tabs a[href='/ui/services/web/history']")
        .await;
    browser.wait_for("table.history tr#v1").await;
    assert_eq!(browser.count("button.rollback").await, 0);
    browser
        .click("nav.tabs a[href='/ui/services/web/publish']")
        .await;
    browser.wait_for("pre.policy").await;
    assert_eq!(browser.count("form.publish").await, 0);

    // Sign out: the dashboard asks for a token again.
    browser
        .click("header form[action='/ui/logout'] button")
        .await;
    browser.wait_for("form[action='/ui/login']").await;
    browser
        .goto(&format!("{}/ui/services/web", center.url()))
        .await;
    browser.wait_for("form[action='/ui/login']").await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_a_change_and_watch_it_acked() {
    let Some(browser) = Browser::start("publish_a_change_and_watch_it_acked").await else {
        return;
    };
    let center = center_with_web().await;
    let (layer, watch) = web_instance(&center, "web-1").await;
    browser.sign_in(&center.url(), &center.editor).await;

    browser
        .goto(&format!("{}/ui/services/web/publish", center.url()))
        .await;
    let shown = browser
        .wait_for("#policy")
        .await
        .prop("value")
        .await
        .unwrap()
        .unwrap();
    assert!(shown.contains("max_attempts = 3"), "{shown}");
    browser.fill("#policy", &policy(2)).await;
    browser
        .fill("#message", "fewer retries to the image CDN")
        .await;
    browser.screenshot("publish-form").await;
    browser.click("form.publish button[type=submit]").await;

    // The overview says v2 is out, then shows the instance acknowledging it (the live part
    // refreshes itself: no reload here).
    let notice = browser.text(".notice.good").await;
    assert!(notice.contains("Version 2 published"), "{notice}");
    browser
        .wait_for("tr[data-instance='web-1'][data-acked='2'][data-state='ack']")
        .await;
    browser.screenshot("published-and-acked").await;

    // The instance really runs it.
    tokio::time::timeout(PAGE_WAIT, watch.wait_for(|s| s.applied == Some(2)))
        .await
        .unwrap();
    let live = layer.policies().current();
    assert_eq!(live.endpoint(EP).unwrap().retry().max_attempts(), 2);

    // The history shows who changed what.
    browser
        .goto(&format!("{}/ui/services/web/history", center.url()))
        .await;
    let v2 = browser.text("table.history tr#v2").await;
    assert!(
        v2.contains("alice")
            && v2.contains("fewer retries")
            && v2.contains("3")
            && v2.contains("2"),
        "{v2}"
    );

    // A policy that does not validate is refused on the form, naming the field; the text stays.
    browser
        .goto(&format!("{}/ui/services/web/publish", center.url()))
        .await;
    browser
        .fill(
            "#policy",
            &policy(2).replace(
                "max_attempts = 2 }\ntimeouts",
                "max_attempts = 0 }\ntimeouts",
            ),
        )
        .await;
    browser.click("form.publish button[type=submit]").await;
    let refusal = browser.text(".notice.bad").await;
    assert!(refusal.contains("max_attempts"), "{refusal}");
    browser.screenshot("publish-refused").await;

    // A canary for every instance (100 %): the overview shows its share and the instance
    // running it.
    browser
        .goto(&format!("{}/ui/services/web/publish", center.url()))
        .await;
    browser.fill("#policy", &policy(4)).await;
    browser.fill("#message", "try 4 attempts on a canary").await;
    browser.fill("#share", "100").await;
    browser.click("form.publish button[type=submit]").await;
    browser
        .wait_for("tr[data-instance='web-1'][data-acked='3'][data-state='ack']")
        .await;
    let canary = browser.text(".card.canary").await;
    assert!(
        canary.contains("v3")
            && canary.contains("for 100% of instances")
            && canary.contains("1 of 1 instances selected"),
        "{canary}"
    );
    assert_eq!(
        browser
            .count("tr[data-instance='web-1'] .badge.canary")
            .await,
        1
    );
    browser.screenshot("canary").await;

    // Promoted: v3 is the stable version, and there is no canary any more.
    browser.click(".card.canary button.step.promote").await;
    browser.wait_for(".card.canary p.big.muted").await;
    let cards = browser.text(".cards").await;
    assert!(
        cards.contains("v3") && cards.contains("Every instance runs the stable version"),
        "{cards}"
    );
    assert_eq!(browser.count(".badge.canary").await, 0);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roll_back_from_the_history() {
    let Some(browser) = Browser::start("roll_back_from_the_history").await else {
        return;
    };
    let center = center_with_web().await;
    let (layer, watch) = web_instance(&center, "web-1").await;
    let (status, _) = center
        .api(&center.editor)
        .publish("web", 1, &policy(5))
        .await;
    assert_eq!(status, 201);
    tokio::time::timeout(PAGE_WAIT, watch.wait_for(|s| s.applied == Some(2)))
        .await
        .unwrap();
    browser.sign_in(&center.url(), &center.editor).await;

    browser
        .goto(&format!("{}/ui/services/web/history", center.url()))
        .await;
    // The latest version has no rollback button; the older one has one.
    assert_eq!(browser.count("tr#v2 button.rollback").await, 0);
    let diff = browser.text("tr#v2 ul.diff").await;
    assert!(
        diff.contains("retry.max_attempts") && diff.contains("3") && diff.contains("5"),
        "{diff}"
    );
    browser.screenshot("history").await;
    browser.click("tr#v1 button.rollback").await;

    let notice = browser.text(".notice.good").await;
    assert!(notice.contains("Version 3 published"), "{notice}");
    browser
        .wait_for("tr[data-instance='web-1'][data-acked='3'][data-state='ack']")
        .await;
    tokio::time::timeout(PAGE_WAIT, watch.wait_for(|s| s.applied == Some(3)))
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
        3
    );
    browser
        .goto(&format!("{}/ui/services/web/history", center.url()))
        .await;
    let v3 = browser.text("table.history tr#v3").await;
    assert!(
        v3.contains("rollback of v1") && v3.contains("alice"),
        "{v3}"
    );
    browser.screenshot("rolled-back").await;
    browser.close().await;
}
