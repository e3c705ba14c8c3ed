//! `--fanout nats://…`: versions reach instances through a JetStream key-value bucket on the
//! real NATS server, and their ACKs reach the center.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write as _;
use std::time::Duration;

use stormguard_center::CenterConfig;
use stormguard_center::fanout::NatsFanout;
use stormguard_tower::client::{CenterWatch, CenterWatchConfig};
use support::{TestCenter, attempts, client_stack};
use tokio::time::timeout;

fn nats_url() -> Option<String> {
    match std::env::var("STORMGUARD_TEST_NATS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("STORMGUARD_REQUIRE_ALL_STORES").as_deref() == Ok("1") {
                panic!("STORMGUARD_TEST_NATS_URL is not set but STORMGUARD_REQUIRE_ALL_STORES=1");
            }
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: NATS fanout: STORMGUARD_TEST_NATS_URL not set"
            );
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_watching_the_bucket_apply_each_version_and_ack_it_to_the_center() {
    let Some(nats) = nats_url() else { return };
    let bucket = "stormguard_policies_test";
    // A service name of this run only: the bucket outlives the test.
    let service = format!(
        "orders-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("center.db").display());
    let config = CenterConfig {
        fanout: Some(NatsFanout::connect(&nats, bucket).await.unwrap()),
        ..CenterConfig::default()
    };
    let center = TestCenter::with_config(&url, None, config).await;
    let editor = center.api(&center.editor);
    assert_eq!(editor.publish(&service, 0, &attempts(3)).await.0, 201);
    let token = center.instance_token(&service).await;
    let layer = client_stack(2);
    let config =
        CenterWatchConfig::new(&center.url(), &service, "i-1", &token).with_nats(&nats, bucket);
    let watch = CenterWatch::start(layer.policies(), config).unwrap();
    let applied = |version: u64| {
        let watch = &watch;
        async move {
            timeout(
                Duration::from_secs(30),
                watch.wait_for(|s| s.applied == Some(version)),
            )
            .await
            .unwrap_or_else(|_| panic!("version {version} never applied: {:?}", watch.state()));
        }
    };
    applied(1).await;
    assert_eq!(editor.publish(&service, 1, &attempts(1)).await.0, 201);
    applied(2).await;
    assert_eq!(
        layer
            .policies()
            .current()
            .endpoint("default")
            .unwrap()
            .retry()
            .max_attempts(),
        1
    );
    // The instance never opened a stream to the center: its ACK came over HTTP.
    let viewer = center.api(&center.viewer);
    let acked = timeout(Duration::from_secs(30), async {
        loop {
            let (_, status) = viewer.get(&format!("/v1/services/{service}/status")).await;
            if status["instances"][0]["version"] == 2 && status["instances"][0]["applied"] == true {
                return status;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        acked.is_ok(),
        "the ACK of version 2 never reached the center"
    );
}
