//! PostgreSQL restarted under two running center replicas: while it is down, publishes fail
//! with a 503 that names the store (and nothing of the driver's message), and the watchers
//! keep the policy they run; once it is back, publishes succeed and every watcher, on both
//! replicas, gets the new versions — the one replica's watchers only through its LISTEN
//! connection, which must have reconnected (the instances' poll is set to an hour, so it
//! cannot bring them).
//!
//! The server is a private one (`initdb` in a temporary directory, a free port): the shared
//! server on :5432 is never stopped. Real time; every wait ends on a condition, bounded.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use stormguard::backoff::{Backoff, Jitter};
use stormguard_tower::client::{CenterWatch, CenterWatchConfig};
use support::{PrivatePostgres, TestCenter, attempts, client_stack};
use tokio::time::timeout;

const GIVE_UP: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_fails_publishes_clearly_and_every_watcher_resumes() {
    let Some(bin) = support::private_postgres_bin("PostgreSQL restart") else {
        return;
    };
    let postgres = tokio::task::spawn_blocking(move || PrivatePostgres::start(&bin))
        .await
        .unwrap();
    let url = postgres.url();
    let one = TestCenter::on(&url, None).await;
    let two = TestCenter::on(&url, None).await;
    assert_eq!(
        one.api(&one.editor)
            .publish("orders", 0, &attempts(3))
            .await
            .0,
        201
    );
    let token = one.instance_token("orders").await;

    // Three instances on each replica. No poll within the test: a version reaches an
    // instance by its stream only.
    let layers: Vec<_> = (0..6).map(|_| client_stack(2)).collect();
    let watches: Vec<_> = layers
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let center = if i % 2 == 0 { &one } else { &two };
            let config =
                CenterWatchConfig::new(&center.url(), "orders", &format!("orders-{i}"), &token)
                    .with_poll_interval(Duration::from_secs(3600))
                    .with_backoff(
                        Backoff::exponential(Duration::from_millis(5))
                            .with_cap(Duration::from_millis(100))
                            .with_jitter(Jitter::Full),
                    )
                    .with_seed(i as u64);
            CenterWatch::start(layer.policies(), config).unwrap()
        })
        .collect();
    let applied = |version: u64| {
        let watches = &watches;
        async move {
            for watch in watches {
                timeout(GIVE_UP, watch.wait_for(|s| s.applied == Some(version)))
                    .await
                    .unwrap_or_else(|_| {
                        panic!("version {version} never applied: {:?}", watch.state())
                    });
            }
        }
    };
    applied(1).await;

    let server = tokio::task::spawn_blocking(move || {
        postgres.stop_immediately();
        postgres
    });
    let postgres = server.await.unwrap();

    // Down: a publish through either replica fails, clearly.
    for center in [&one, &two] {
        let (status, body) = center
            .api(&center.editor)
            .publish("orders", 1, &attempts(1))
            .await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["status"], 503);
        let error = body["error"].as_str().unwrap();
        assert!(error.contains("PostgreSQL store is unavailable"), "{error}");
        assert!(error.contains("error id"), "{error}");
        assert!(
            !error.contains("127.0.0.1") && !error.to_lowercase().contains("pool"),
            "the driver's message stays in the log: {error}"
        );
    }
    // The instances run on, with the policy they had.
    for (watch, layer) in watches.iter().zip(&layers) {
        assert_eq!(watch.state().applied, Some(1));
        let in_use = layer.policies().current();
        assert_eq!(
            in_use.endpoint("default").unwrap().retry().max_attempts(),
            3
        );
    }

    let server = tokio::task::spawn_blocking(move || {
        postgres.start_again();
        postgres
    });
    let _postgres = server.await.unwrap();

    // Back: through replica two first. Its own watchers hear of it at once; replica one's
    // only through its LISTEN connection, lost in the restart.
    let published = publish_until_accepted(&two, 1, 1).await;
    assert_eq!(published, 201);
    applied(2).await;
    // And through replica one, whose publishes reach replica two's watchers.
    assert_eq!(publish_until_accepted(&one, 2, 4).await, 201);
    applied(3).await;
    for layer in &layers {
        let in_use = layer.policies().current();
        assert_eq!(
            in_use.endpoint("default").unwrap().retry().max_attempts(),
            4
        );
    }
}

/// Publishes on `base` until the answer is not 503 (the first requests after the restart
/// may still find the pool's old connections dead), bounded; the final status.
async fn publish_until_accepted(center: &TestCenter, base: u64, max_attempts: u32) -> u16 {
    timeout(GIVE_UP, async {
        loop {
            let (status, _) = center
                .api(&center.editor)
                .publish("orders", base, &attempts(max_attempts))
                .await;
            if status != 503 {
                return status;
            }
        }
    })
    .await
    .expect("publishes never succeeded after the restart")
}
