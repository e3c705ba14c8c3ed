//! Two center replicas on one PostgreSQL database: a publish through either reaches the
//! watchers of both (LISTEN/NOTIFY), and compare-and-set holds across replicas.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use stormguard_tower::client::{CenterWatch, CenterWatchConfig};
use support::{TestCenter, attempts, client_stack};
use tokio::time::timeout;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_postgres_see_each_others_publishes() {
    let Some(url) = support::postgres_url("two replicas") else {
        return;
    };
    let url = support::postgres_schema(&url).await;
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

    // One instance on each replica.
    let layers: Vec<_> = (0..2).map(|_| client_stack(2)).collect();
    let watches: Vec<_> = [&one, &two]
        .iter()
        .zip(&layers)
        .enumerate()
        .map(|(i, (center, layer))| {
            let config =
                CenterWatchConfig::new(&center.url(), "orders", &format!("orders-{i}"), &token);
            CenterWatch::start(layer.policies(), config).unwrap()
        })
        .collect();
    let applied = |version: u64| {
        let watches = &watches;
        async move {
            for watch in watches {
                timeout(
                    Duration::from_secs(30),
                    watch.wait_for(|s| s.applied == Some(version)),
                )
                .await
                .unwrap_or_else(|_| panic!("version {version} never applied: {:?}", watch.state()));
            }
        }
    };
    applied(1).await;
    // Published through replica two: replica one's watcher hears of it by NOTIFY.
    assert_eq!(
        two.api(&two.editor)
            .publish("orders", 1, &attempts(1))
            .await
            .0,
        201
    );
    applied(2).await;
    // And back through replica one; a stale base on either replica is a conflict.
    assert_eq!(
        one.api(&one.editor)
            .publish("orders", 2, &attempts(4))
            .await
            .0,
        201
    );
    applied(3).await;
    assert_eq!(
        two.api(&two.editor)
            .publish("orders", 2, &attempts(5))
            .await
            .0,
        409
    );
    assert_eq!(
        layers[0]
            .policies()
            .current()
            .endpoint("default")
            .unwrap()
            .retry()
            .max_attempts(),
        4
    );
}
