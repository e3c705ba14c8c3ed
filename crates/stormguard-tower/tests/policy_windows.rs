//! Time windows in the live stack: the policy in force changes at each window edge with no
//! reload, and what the stack has learned (an open breaker) survives an edge that does not
//! change it. Wall-clock and monotonic time are both tokio's paused clock, anchored at a
//! chosen instant.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use stormguard::breaker::BreakerState;
use stormguard::deadline::WallClock;
use stormguard::policy::PolicyFile;
use stormguard::retry::StopReason;
use stormguard_tower::body::ReplayBody;
use stormguard_tower::client::{Client, ClientLayer, ClientLayerBuilder};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt, service_fn};

/// The seeds' case: the bank's 3 a.m. maintenance in Shanghai loosens `/callback`'s timeouts;
/// `/orders` keeps its breaker through the window, `/stock`'s window changes its breaker.
const POLICY: &str = r#"
[endpoints."POST /callback"]
timeouts = { per_try = "300ms", overall = "1s" }
retry = { max_attempts = 1 }

[[endpoints."POST /callback".windows]]
start = "03:00"
end = "04:00"
time_zone = "Asia/Shanghai"
overrides = { timeouts = { per_try = "2s", overall = "5s" } }

[endpoints."GET /orders"]
timeouts = { per_try = "300ms" }
retry = { max_attempts = 1 }
breaker = { count = 4, minimum_throughput = 4, failure_ratio = 0.5, open = "1h" }

[[endpoints."GET /orders".windows]]
start = "03:00"
end = "04:00"
time_zone = "Asia/Shanghai"
overrides = { timeouts = { per_try = "2s" } }

[endpoints."GET /stock"]
retry = { max_attempts = 1 }
breaker = { count = 4, minimum_throughput = 4, failure_ratio = 0.5, open = "1h" }

[[endpoints."GET /stock".windows]]
start = "03:00"
end = "04:00"
time_zone = "Asia/Shanghai"
overrides = { breaker = { failure_ratio = 0.9 } }
"#;

fn utc(text: &str) -> SystemTime {
    let ts: jiff::Timestamp = text.parse().expect("a test timestamp");
    SystemTime::try_from(ts).expect("in range")
}

/// A wall clock that reads `origin` when made and moves with tokio's (paused) clock.
fn wall_from(origin: SystemTime) -> WallClock {
    let start = tokio::time::Instant::now();
    WallClock::from_fn(move || origin + (tokio::time::Instant::now() - start))
}

/// The stack of [`POLICY`] at 18:59 UTC, 02:59 in Shanghai: the window starts in one minute.
fn seeds_case_at_02_59() -> ClientLayer {
    ClientLayerBuilder::routes(&PolicyFile::from_toml(POLICY).unwrap())
        .with_wall_clock(wall_from(utc("2026-06-01T18:59:00Z")))
        .with_seed(1)
        .build()
        .unwrap()
}

type Body = Full<Bytes>;
type Svc = BoxCloneService<Request<ReplayBody<Body>>, Response<Body>, std::convert::Infallible>;

/// A downstream that fails (503) while `failing` holds and records the `grpc-timeout` each
/// attempt carried.
fn downstream(failing: Arc<Mutex<bool>>, seen: Arc<Mutex<Vec<String>>>) -> Svc {
    BoxCloneService::new(service_fn(move |req: Request<ReplayBody<Body>>| {
        let timeout = req
            .headers()
            .get("grpc-timeout")
            .map(|v| v.to_str().unwrap_or_default().to_owned())
            .unwrap_or_default();
        seen.lock().unwrap().push(timeout);
        let status = if *failing.lock().unwrap() {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        };
        async move {
            Ok(Response::builder()
                .status(status)
                .body(Full::new(Bytes::new()))
                .unwrap())
        }
    }))
}

async fn call(client: &Client<Svc>, method: &str, path: &str) -> Result<StatusCode, StopReason> {
    let request = Request::builder()
        .method(method)
        .uri(format!("http://svc{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    match client.clone().oneshot(request).await {
        Ok(response) => Ok(response.status()),
        Err(error) => Err(error.stop().expect("a stop reason")),
    }
}

#[tokio::test(start_paused = true)]
async fn the_maintenance_window_applies_at_its_edges_without_a_reload_and_keeps_the_breaker() {
    let failing = Arc::new(Mutex::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let layer = seeds_case_at_02_59();
    let client = layer.layer(downstream(Arc::clone(&failing), Arc::clone(&seen)));
    let version = layer.policies().version();
    let last_timeout = || seen.lock().unwrap().last().cloned().unwrap_or_default();

    assert_eq!(call(&client, "POST", "/callback").await, Ok(StatusCode::OK));
    assert_eq!(
        last_timeout(),
        "300000u",
        "before the window: per_try 300ms"
    );

    // Open both breakers before the window.
    *failing.lock().unwrap() = true;
    for path in ["/orders", "/stock"] {
        for _ in 0..4 {
            assert_eq!(
                call(&client, "GET", path).await,
                Ok(StatusCode::SERVICE_UNAVAILABLE)
            );
        }
        assert_eq!(
            call(&client, "GET", path).await,
            Err(StopReason::BreakerOpen),
            "{path}"
        );
    }
    *failing.lock().unwrap() = false;

    // 03:00 Shanghai: the next call is made by the window's policy.
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(call(&client, "POST", "/callback").await, Ok(StatusCode::OK));
    assert_eq!(last_timeout(), "2000000u", "in the window: per_try 2s");
    // The window changed /orders' timeouts only: its breaker is the same, still open.
    assert_eq!(
        call(&client, "GET", "/orders").await,
        Err(StopReason::BreakerOpen)
    );
    // The window changed /stock's breaker: a fresh one, closed.
    assert_eq!(call(&client, "GET", "/stock").await, Ok(StatusCode::OK));
    // An edge is not a reload: the configured policies, and so the version, are the same.
    assert_eq!(layer.policies().version(), version);
    assert_eq!(layer.policies().status().swaps, 0);
    assert_eq!(
        layer.policies().current().endpoint("POST /callback"),
        PolicyFile::from_toml(POLICY)
            .unwrap()
            .endpoint("POST /callback")
    );

    // 03:59:59: still in the window.
    tokio::time::advance(Duration::from_secs(3599)).await;
    assert_eq!(call(&client, "POST", "/callback").await, Ok(StatusCode::OK));
    assert_eq!(last_timeout(), "2000000u");

    // 04:00: back to the endpoint's own policy.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(call(&client, "POST", "/callback").await, Ok(StatusCode::OK));
    assert_eq!(
        last_timeout(),
        "300000u",
        "after the window: per_try 300ms again"
    );

    // And again the next night, 23 hours later.
    tokio::time::advance(Duration::from_secs(23 * 3600)).await;
    assert_eq!(call(&client, "POST", "/callback").await, Ok(StatusCode::OK));
    assert_eq!(last_timeout(), "2000000u");
}

#[tokio::test(start_paused = true)]
async fn across_new_yorks_fall_back_the_stack_follows_the_first_occurrence_rule() {
    const FALL: &str = r#"
        [endpoints."GET /x"]
        timeouts = { per_try = "300ms" }
        [[endpoints."GET /x".windows]]
        start = "01:30"
        end = "02:30"
        time_zone = "America/New_York"
        overrides = { timeouts = { per_try = "2s" } }
    "#;
    // 2026-11-01 04:00 UTC is 00:00 EDT; 01:30 EDT is 05:30 UTC, 02:30 EST is 07:30 UTC.
    let wall = wall_from(utc("2026-11-01T04:00:00Z"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let layer = ClientLayerBuilder::routes(&PolicyFile::from_toml(FALL).unwrap())
        .with_wall_clock(wall)
        .build()
        .unwrap();
    let client = layer.layer(downstream(Arc::new(Mutex::new(false)), Arc::clone(&seen)));
    let mut elapsed = Duration::ZERO;
    // (minutes after 04:00 UTC, the per-try timeout on the wire)
    for (minute, expected) in [
        (89, "300000u"),   // 05:29 UTC, 01:29 EDT
        (90, "2000000u"),  // 05:30 UTC, the first 01:30
        (135, "2000000u"), // 06:15 UTC, 01:15 EST: the repeated hour, still inside
        (209, "2000000u"), // 07:29 UTC, 02:29 EST
        (210, "300000u"),  // 07:30 UTC, 02:30 EST: the end
    ] {
        let at = Duration::from_secs(minute * 60);
        tokio::time::advance(at - elapsed).await;
        elapsed = at;
        assert_eq!(call(&client, "GET", "/x").await, Ok(StatusCode::OK));
        assert_eq!(
            seen.lock().unwrap().last().map(String::as_str),
            Some(expected),
            "{minute} minutes after 04:00 UTC"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_same_file_swapped_in_after_an_edge_no_call_followed_puts_the_windows_policy_in_force()
{
    // /stock's window gives it a breaker of its own at 03:00.
    let failing = Arc::new(Mutex::new(true));
    let layer = seeds_case_at_02_59();
    let client = layer.layer(downstream(Arc::clone(&failing), Arc::default()));
    for _ in 0..4 {
        assert_eq!(
            call(&client, "GET", "/stock").await,
            Ok(StatusCode::SERVICE_UNAVAILABLE)
        );
    }
    let stock = |layer: &ClientLayer| {
        layer
            .policies()
            .endpoint_status()
            .into_iter()
            .find(|e| e.name == "GET /stock")
            .and_then(|e| e.breaker)
    };
    assert_eq!(stock(&layer), Some(BreakerState::Open));

    // 03:00, and no call since: a reload of the unchanged file (a watcher's second read)
    // is no swap, but it builds the policies now in force, as the next call would have.
    tokio::time::advance(Duration::from_secs(60)).await;
    layer
        .policies()
        .swap(&PolicyFile::from_toml(POLICY).unwrap())
        .unwrap();
    assert_eq!(layer.policies().status().swaps, 0);
    assert_eq!(
        stock(&layer),
        Some(BreakerState::Closed),
        "the window's breaker"
    );
}
