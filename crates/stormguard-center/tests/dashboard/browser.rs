//! A headless Debian chromium driven through chromedriver (WebDriver, by `fantoccini`).
//!
//! `STORMGUARD_TEST_CHROMEDRIVER` names the chromedriver program (`.ci/run` installs the
//! `chromium` and `chromium-driver` packages and sets it); `STORMGUARD_TEST_CHROMIUM` the
//! browser (default `/usr/bin/chromium`). Without the first a test prints a loud SKIPPED line
//! and returns, unless `STORMGUARD_REQUIRE_BROWSER=1` (CI), where it fails.
//!
//! Each browser has a fresh profile in a temporary directory, runs headless without the
//! sandbox (tests run as root) and without anything that reaches outside the machine
//! (updates, sync, QUIC). Only one browser runs at a time (the machine is small); a test
//! holds [`Browser`] for its whole run.
//!
//! The self-heal demo's browser test (`crates/stormguard-cli/src/selfheal/browser_tests.rs`)
//! includes this file too (`#[path]`), so that both drive chromium the same way.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// The longest a page is waited for (an element to appear, an ACK to show).
pub(crate) const PAGE_WAIT: Duration = Duration::from_secs(30);

/// One browser at a time, across the tests of this binary.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A browser session, its chromedriver, and its profile directory.
pub(crate) struct Browser {
    pub(crate) client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

/// The chromedriver program, or `None` after a loud SKIPPED line.
pub(crate) fn chromedriver(test: &str) -> Option<PathBuf> {
    match std::env::var("STORMGUARD_TEST_CHROMEDRIVER") {
        Ok(path) if !path.is_empty() => Some(path.into()),
        _ => {
            if std::env::var("STORMGUARD_REQUIRE_BROWSER").as_deref() == Ok("1") {
                panic!("STORMGUARD_TEST_CHROMEDRIVER is not set but STORMGUARD_REQUIRE_BROWSER=1");
            }
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: {test}: STORMGUARD_TEST_CHROMEDRIVER (Debian's chromium-driver) not set"
            );
            None
        }
    }
}

impl Browser {
    /// Starts chromedriver on a free port and a headless chromium session through it.
    pub(crate) async fn start(test: &str) -> Option<Browser> {
        let driver_path = chromedriver(test)?;
        let turn = ONE_AT_A_TIME.lock().await;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", driver_path.display()));
        // chromedriver says on its standard output when it listens.
        let mut lines = BufReader::new(driver.stdout.take().expect("stdout")).lines();
        let started = tokio::time::timeout(PAGE_WAIT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("started successfully") {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(started, Ok(true), "chromedriver did not start");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let profile = tempfile::tempdir().expect("profile dir");
        let chromium = std::env::var("STORMGUARD_TEST_CHROMIUM")
            .unwrap_or_else(|_| "/usr/bin/chromium".into());
        let mut capabilities = Capabilities::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a chromium session through chromedriver");
        Some(Browser {
            client,
            driver,
            _profile: profile,
            _turn: turn,
        })
    }

    /// Opens `url`.
    pub(crate) async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("navigate");
    }

    /// Signs in to the dashboard at `center` (`http://127.0.0.1:PORT`) through its form
    /// with `token`; the services page follows.
    pub(crate) async fn sign_in(&self, center: &str, token: &str) {
        self.goto(&format!("{center}/ui")).await;
        // Not signed in: the dashboard leads to the sign-in form.
        self.wait_for("form[action='/ui/login'] input[name=token]")
            .await;
        assert_eq!(self.path().await, "/ui/login");
        self.fill("#token", token).await;
        self.click("form[action='/ui/login'] button[type=submit]")
            .await;
        self.wait_for("table.services").await;
    }

    /// Loads the page shown again.
    pub(crate) async fn refresh(&self) {
        self.client.refresh().await.expect("reload");
    }

    /// Waits (at most [`PAGE_WAIT`]) for an element matching `css`.
    pub(crate) async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        match self
            .client
            .wait()
            .at_most(PAGE_WAIT)
            .every(Duration::from_millis(100))
            .for_element(Locator::Css(css))
            .await
        {
            Ok(element) => element,
            Err(error) => {
                let url = self.client.current_url().await.map(|u| u.to_string());
                let source = self.client.source().await.unwrap_or_default();
                panic!("no element {css:?} on {url:?} ({error}); the page:\n{source}");
            }
        }
    }

    /// The visible text of the first element matching `css`.
    pub(crate) async fn text(&self, css: &str) -> String {
        self.wait_for(css).await.text().await.expect("text")
    }

    /// How many elements match `css` now.
    pub(crate) async fn count(&self, css: &str) -> usize {
        self.client
            .find_all(Locator::Css(css))
            .await
            .expect("find")
            .len()
    }

    /// Types `text` into the field `css` (cleared first).
    pub(crate) async fn fill(&self, css: &str, text: &str) {
        let field = self.wait_for(css).await;
        field.clear().await.expect("clear");
        field.send_keys(text).await.expect("type");
    }

    /// Clicks the element `css`.
    pub(crate) async fn click(&self, css: &str) {
        self.wait_for(css).await.click().await.expect("click");
    }

    /// The path of the page shown.
    pub(crate) async fn path(&self) -> String {
        self.client
            .current_url()
            .await
            .expect("url")
            .path()
            .to_owned()
    }

    /// Saves the page as `target/browser-screenshots/NAME.png` and returns the path.
    pub(crate) async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("screenshot");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        let _ = writeln!(std::io::stderr(), "screenshot: {}", path.display());
        path
    }

    /// Ends the session and chromedriver.
    pub(crate) async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill().await;
    }
}

/// `target/browser-screenshots` of the workspace (or of `CARGO_TARGET_DIR`).
fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        PathBuf::from,
    );
    target.join("browser-screenshots")
}
