//! The group commit of acknowledgements, on a real SQLite file.

use super::{NewAudit, Store};

async fn sqlite() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("c.db").display());
    (Store::open(&url).await.expect("open"), dir)
}

async fn ack(store: Store, instance: String, version: u64) -> Result<(), super::StoreError> {
    let audit = NewAudit {
        at_ms: 1,
        actor: "svc",
        action: "ack",
        service: "svc",
        version: Some(version),
        instance: Some(&instance),
        detail: "",
    };
    store.acknowledge(true, &audit).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acks_are_each_written_once_with_their_audit_record() {
    let (store, _dir) = sqlite().await;
    let calls = (0..300).map(|i| tokio::spawn(ack(store.clone(), format!("i-{i}"), 7)));
    for call in futures_util::future::join_all(calls).await {
        call.expect("task").expect("ack written");
    }
    let instances = store.instances("svc").await.expect("instances");
    assert_eq!(instances.len(), 300);
    assert!(
        instances
            .iter()
            .all(|row| row.version == Some(7) && row.applied == Some(1))
    );
    let audit = store.audit_log(Some("svc"), 1000).await.expect("audit");
    assert_eq!(audit.iter().filter(|row| row.action == "ack").count(), 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_goes_away_does_not_take_the_others_acks_with_it() {
    let (store, _dir) = sqlite().await;
    // Hold the write turn so that every ACK below joins one pending group; once the first
    // caller (number 0) has taken the group to write it, abort the callers with even
    // numbers, the writer among them.
    let turn = std::sync::Arc::clone(&store.writes).lock_owned().await;
    let calls: Vec<_> = (0..40)
        .map(|i| tokio::spawn(ack(store.clone(), format!("i-{i}"), 3)))
        .collect();
    while super::lock(&store.acks).len() < 40 {
        tokio::task::yield_now().await;
    }
    drop(turn);
    while !super::lock(&store.acks).is_empty() {
        tokio::task::yield_now().await;
    }
    for call in calls.iter().step_by(2) {
        call.abort();
    }
    for (i, call) in calls.into_iter().enumerate() {
        match call.await {
            Ok(written) => written.expect("ack written"),
            Err(aborted) => assert!(aborted.is_cancelled() && i % 2 == 0),
        }
    }
    let instances = store.instances("svc").await.expect("instances");
    for i in (1..40).step_by(2) {
        assert!(
            instances.iter().any(|row| row.instance == format!("i-{i}")),
            "i-{i} was not written"
        );
    }
}
