//! The self-heal story seen on the center's dashboard, in Debian's headless chromium: the
//! same [`World`] as `tests.rs`, played under the paused clock by the same [`play_paused`],
//! and a browser signed in to that run's center, which sees the rule `cdn-failing` fire
//! (with the error ratio that fired it), hold while the CDN fails, and revert; the versions
//! it published in the history with their diffs; and the incident in the downstream's
//! charts. Screenshots go to `target/browser-screenshots/self-heal-*.png`. The browser
//! harness is the center's own (`stormguard-center/tests/dashboard/browser.rs`, included
//! here): without `STORMGUARD_TEST_CHROMEDRIVER` the test says SKIPPED and returns, unless
//! `STORMGUARD_REQUIRE_BROWSER=1`.
//!
//! # Looking while the rule is active, under a paused clock
//!
//! The browser is another process. While the test waits on it the runtime has nothing to
//! do, and a paused clock then *auto-advances* to the next timer: with the pacer, a
//! millisecond at a time, as fast as the runtime can spin. A page load of a few hundred real
//! milliseconds would let the story run on by seconds or more (the CDN recovering, the rule
//! reverting) and the page would show no particular instant. But tokio holds a paused clock
//! still while a `spawn_blocking` task runs (documented under `tokio::time::pause`,
//! "Preventing auto-advance"), so each look at the dashboard is a blocking task: from the
//! moment every client runs the fired version until the look ends, virtual time stands
//! still (no user request starts, the collector does not scrape, no timeout fires) while
//! the sockets still work, so the center answers the browser from its state at that
//! instant. The look is started as soon as the last client applies the version: the task
//! that waits for it is woken by that apply and queued at once, so the clock cannot move in
//! between (it moves only when no task is ready). The browser itself runs in real time on a runtime of its own inside that
//! blocking task: the harness's waits (fantoccini polls on tokio's clock) would never end
//! on the frozen one.
//!
//! What this does to the charts: the collector stamps its rounds with the wall clock, so
//! the 70 s of the story span the few real seconds the run took, and the lines cross the
//! look's real seconds, in the middle of the outage, in one straight stretch.

#[path = "../../../stormguard-center/tests/dashboard/browser.rs"]
#[allow(
    dead_code,
    reason = "the center's dashboard tests' harness, shared; this test needs most of it"
)]
mod browser;

use browser::Browser;

use super::fleet::SERVICE;
use super::scenario::{Config, World};
use super::tests::play_paused;

/// The version the rule publishes when it fires: the first after the one the run starts
/// with.
const FIRED: u64 = 2;
/// The version its revert publishes.
const REVERTED: u64 = 3;
/// The rule's card on the Rules tab.
const CARD: &str = "section.rule[data-rule='cdn-failing']";
/// The image endpoint's row in the overview's settings table.
const ENDPOINT_ROW: &str = "table.endpoints tr[data-endpoint='GET /img/*']";
/// Its cells of the attempts and the fallback.
const ATTEMPTS: &str = "td:nth-child(2)";
const FALLBACK: &str = "td:last-child";
const TEST: &str = "the_dashboard_shows_the_self_heal_rule_fire_hold_and_revert";

/// Where the run's dashboard is and how to sign in.
#[derive(Clone)]
struct Dashboard {
    center: String,
    token: String,
}

#[tokio::test]
async fn the_dashboard_shows_the_self_heal_rule_fire_hold_and_revert() {
    if browser::chromedriver(TEST).is_none() {
        return;
    }
    let mut world = World::start(&Config::default()).await.expect("the set-up");
    let (center, token) = world.dashboard();
    let dashboard = Dashboard {
        center: center.to_owned(),
        token: token.to_owned(),
    };
    let switched = world.every_client_runs(FIRED);
    let during = tokio::spawn(look_when_switched(switched, dashboard.clone()));
    let run = play_paused(&mut world).await;
    // The look happened on the way: the story could not go on while it ran.
    assert!(
        during.is_finished(),
        "the clients never all ran v{FIRED}: {:?}",
        run.versions
    );
    if let Err(error) = during.await {
        std::panic::resume_unwind(error.into_panic());
    }
    let authors: Vec<_> = run.versions.iter().map(|v| v.author.as_str()).collect();
    assert_eq!(authors, ["ops", "rule:cdn-failing", "rule:cdn-failing"]);
    look(dashboard, after_the_run).await;
}

/// Waits until every client runs the fired version and looks at the dashboard then.
async fn look_when_switched(
    switched: impl std::future::Future<Output = bool>,
    dashboard: Dashboard,
) {
    assert!(switched.await, "a client's watch ended before v{FIRED}");
    look(dashboard, while_active).await;
}

/// Signs a new browser in to `dashboard` and runs `inspect` with it (and the center's URL),
/// on a runtime of its own in real time, as a blocking task: the test's paused clock stands
/// still until it returns (see the module's docs). A failed assertion fails the test.
async fn look<F>(dashboard: Dashboard, inspect: F)
where
    F: for<'a> AsyncFnOnce(&'a Browser, &'a str) + Send + 'static,
{
    let looked = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the browser");
        runtime.block_on(async {
            let browser = Browser::start(TEST)
                .await
                .expect("chromedriver was found before the run");
            browser.sign_in(&dashboard.center, &dashboard.token).await;
            inspect(&browser, &dashboard.center).await;
            browser.close().await;
        });
    })
    .await;
    if let Err(error) = looked {
        std::panic::resume_unwind(error.into_panic());
    }
}

/// At the instant every client runs the fired version: the rule active with the values
/// that fired it, the instances on it, and the CDN still failing.
async fn while_active(browser: &Browser, center: &str) {
    browser
        .goto(&format!("{center}/ui/services/{SERVICE}/rules"))
        .await;
    let card = browser.text(CARD).await;
    assert!(
        card.contains("error_ratio{code=504} > 20% for 2s")
            && card.contains("retry.max_attempts = 1")
            && card.contains("fallback = on_give_up"),
        "{card}"
    );
    assert_eq!(
        browser.text(&format!("{CARD} .badge.state")).await,
        "active"
    );
    assert_eq!(
        browser.count(&format!("{CARD} tr.firing")).await,
        1,
        "fired once, not reverted yet"
    );
    check_fired_row(browser).await;
    browser.screenshot("self-heal-active-rules").await;

    browser
        .goto(&format!("{center}/ui/services/{SERVICE}"))
        .await;
    every_instance_acked(browser, FIRED).await;
    let stable = browser.text(".cards .card").await;
    assert!(
        stable.contains(&format!("v{FIRED}")) && stable.contains("rule cdn-failing"),
        "{stable}"
    );
    assert_eq!(setting(browser, ATTEMPTS).await, "1");
    assert_eq!(setting(browser, FALLBACK).await, "on_give_up");
    // One attempt per call now, each still answered 504 by the CDN (the backup source
    // answers the users): the attempts' error ratio stays above the rule's threshold.
    let errors = percent(&browser.text(&now_of("errors")).await);
    assert!(errors > 20.0, "error ratio now {errors}%");
    browser.screenshot("self-heal-active-overview").await;
}

/// After the run: the rule idle again, its firing and its revert; the two versions it
/// published in the history; the incident in the charts.
async fn after_the_run(browser: &Browser, center: &str) {
    browser
        .goto(&format!("{center}/ui/services/{SERVICE}/rules"))
        .await;
    assert_eq!(browser.text(&format!("{CARD} .badge.state")).await, "idle");
    assert_eq!(browser.count(&format!("{CARD} tr.firing")).await, 2);
    // Newest first: the revert, then the firing.
    let revert = browser.text(&format!("{CARD} tbody tr.firing")).await;
    assert!(
        revert.contains("reverted")
            && revert.contains(&format!("v{REVERTED}"))
            && revert.contains("retry.max_attempts: 1 → 4 (restored)")
            && revert.contains("fallback: \"on_give_up\" → \"never\" (restored)"),
        "{revert}"
    );
    let ratio = observed(&revert, "error_ratio{code=504}");
    assert!(ratio < 0.05, "reverted at an error ratio of {ratio}");
    check_fired_row(browser).await;
    browser.screenshot("self-heal-rules").await;

    browser
        .click(&format!(
            "nav.tabs a[href='/ui/services/{SERVICE}/history']"
        ))
        .await;
    let v1 = browser.text("table.history tr#v1").await;
    assert!(v1.contains("ops"), "{v1}");
    for (version, changes) in [
        (
            FIRED,
            ["retry.max_attempts 4 → 1", "fallback never → on_give_up"],
        ),
        (
            REVERTED,
            ["retry.max_attempts 1 → 4", "fallback on_give_up → never"],
        ),
    ] {
        let row = browser.text(&format!("table.history tr#v{version}")).await;
        assert!(row.contains("rule cdn-failing"), "{row}");
        // Exactly the two fields the rule sets, each from the old value to the new.
        let diff = browser
            .text(&format!("table.history tr#v{version} ul.diff"))
            .await;
        let mut lines: Vec<&str> = diff.lines().collect();
        lines.sort_unstable();
        let expected = changes.map(|change| format!("endpoints.\"GET /img/*\".{change}"));
        assert_eq!(
            lines,
            [expected[1].as_str(), expected[0].as_str()],
            "{diff}"
        );
    }
    browser.screenshot("self-heal-history").await;

    browser
        .click(&format!("nav.tabs a[href='/ui/services/{SERVICE}']"))
        .await;
    every_instance_acked(browser, REVERTED).await;
    assert_eq!(setting(browser, ATTEMPTS).await, "4");
    assert_eq!(setting(browser, FALLBACK).await, "never");
    let downstream = ".downstream[data-endpoint='GET /img/*']";
    assert_eq!(
        browser
            .count(&format!("{downstream} svg.chart path.line"))
            .await,
        3
    );
    // The incident, against the axes' least tops (10 %, 2 attempts): some round saw more
    // than 10 % of the attempts fail and more than 2 attempts per request (4 before the
    // switch); the last round, with the CDN back, none failing and no retries.
    let top_errors = percent(&browser.text(&top_of("errors")).await);
    assert!(top_errors > 10.0, "error ratio axis up to {top_errors}%");
    assert_eq!(browser.text(&now_of("errors")).await, "0%");
    let top_attempts = number(&browser.text(&top_of("attempts")).await);
    assert!(top_attempts > 2.0, "attempts axis up to {top_attempts}");
    // (About one: the last round also counts calls that ended after the users stopped.)
    let now_attempts = number(&browser.text(&now_of("attempts")).await);
    assert!(
        now_attempts < 1.5,
        "attempts per request now {now_attempts}"
    );
    // The rule's two versions are marked on the time axis.
    assert!(
        browser
            .count(&format!("{downstream} svg.chart.errors line.mark"))
            .await
            >= 2
    );
    browser.screenshot("self-heal-overview").await;
}

/// The firing's row: v2, the error ratio that fired it (above the rule's 20 %), and the
/// fields it changed.
async fn check_fired_row(browser: &Browser) {
    let fired = browser
        .text(&format!("{CARD} tr.firing[data-action='rule-fire']"))
        .await;
    assert!(
        fired.contains("fired")
            && fired.contains(&format!("v{FIRED}"))
            && fired.contains("retry.max_attempts: 4 → 1")
            && fired.contains("fallback: \"never\" → \"on_give_up\""),
        "{fired}"
    );
    let ratio = observed(&fired, "error_ratio{code=504}");
    assert!(ratio > 0.2, "fired at an error ratio of {ratio}");
}

/// Waits until the overview shows every client on `version`, acknowledged.
async fn every_instance_acked(browser: &Browser, version: u64) {
    let clients = Config::default().clients;
    for i in 1..=clients {
        browser
            .wait_for(&format!(
                "tr[data-instance='{SERVICE}-{i}'][data-acked='{version}'][data-state='ack']"
            ))
            .await;
    }
    assert_eq!(browser.count("table.instances tbody tr").await, clients);
}

/// The image endpoint's setting in `cell` ([`ATTEMPTS`], [`FALLBACK`]) of the overview's
/// settings table.
async fn setting(browser: &Browser, cell: &str) -> String {
    browser.text(&format!("{ENDPOINT_ROW} {cell}")).await
}

/// The latest value of a chart (`errors`, `p99`, `attempts`).
fn now_of(chart: &str) -> String {
    format!("figure.chart:has(svg.chart.{chart}) strong.now")
}

/// The top of a chart's value axis (its third tick: 0, half, top).
fn top_of(chart: &str) -> String {
    format!("svg.chart.{chart} text.tick:nth-of-type(3)")
}

/// `12%` as 12.
fn percent(text: &str) -> f64 {
    number(
        text.strip_suffix('%')
            .unwrap_or_else(|| panic!("not a percentage: {text:?}")),
    )
}

fn number(text: &str) -> f64 {
    text.parse()
        .unwrap_or_else(|_| panic!("not a number: {text:?}"))
}

/// The value a firing row shows for `series` (`error_ratio{code=504} = 0.93`).
fn observed(row: &str, series: &str) -> f64 {
    row.split(&format!("{series} = "))
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no value of {series} in {row:?}"))
}
