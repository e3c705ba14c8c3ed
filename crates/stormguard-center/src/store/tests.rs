//! The group commit of acknowledgements, on a real SQLite file.

use super::{Backend, NewAudit, Store, StoreError};

async fn sqlite() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("c.db").display());
    (Store::open(&url).await.expect("open"), dir)
}

async fn ack(store: Store, instance: String) -> Result<(), StoreError> {
    let audit = NewAudit {
        at_ms: 1,
        actor: "svc",
        action: "ack",
        service: "svc",
        version: Some(7),
        instance: Some(&instance),
        detail: "",
    };
    store.acknowledge(true, &audit).await
}

async fn written(store: &Store) -> (Vec<String>, usize) {
    let instances = store.instances("svc").await.expect("instances");
    assert!(
        instances
            .iter()
            .all(|r| r.version == Some(7) && r.applied == Some(1))
    );
    let audit = store.audit_log(Some("svc"), 10_000).await.expect("audit");
    let acks = audit.iter().filter(|row| row.action == "ack").count();
    (instances.into_iter().map(|r| r.instance).collect(), acks)
}

/// Spawns an ACK per name while the test holds the write turn, lets each hand its record
/// over (a current-thread runtime runs every spawned task at the yields), and returns the
/// callers, the turn still held: they all land in the writer's next group.
async fn held_group(
    store: &Store,
    names: &[&str],
) -> (
    Vec<tokio::task::JoinHandle<Result<(), StoreError>>>,
    tokio::sync::OwnedMutexGuard<()>,
) {
    let turn = std::sync::Arc::clone(&store.writes).lock_owned().await;
    let calls = names
        .iter()
        .map(|name| tokio::spawn(ack(store.clone(), (*name).to_owned())))
        .collect();
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    (calls, turn)
}

/// Waits for the writer to finish the group it holds (it has the turn next).
async fn group_done(store: &Store, turn: tokio::sync::OwnedMutexGuard<()>) {
    drop(turn);
    drop(store.writes.lock().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acks_are_each_written_once_with_their_audit_record() {
    let (store, _dir) = sqlite().await;
    let calls = (0..300).map(|i| tokio::spawn(ack(store.clone(), format!("i-{i}"))));
    for call in futures_util::future::join_all(calls).await {
        call.expect("task").expect("ack written");
    }
    let (instances, acks) = written(&store).await;
    assert_eq!((instances.len(), acks), (300, 300));
}

#[tokio::test]
async fn acks_whose_callers_went_away_are_written_all_the_same() {
    let (store, _dir) = sqlite().await;
    let names: Vec<String> = (0..40).map(|i| format!("i-{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (calls, turn) = held_group(&store, &names).await;
    for call in &calls {
        call.abort();
    }
    group_done(&store, turn).await;
    let (instances, acks) = written(&store).await;
    assert_eq!(instances, names);
    assert_eq!(acks, 40);
}

#[tokio::test]
async fn an_ack_the_database_refuses_fails_alone() {
    let (store, _dir) = sqlite().await;
    let Backend::Sqlite(pool) = &store.backend else {
        unreachable!("an SQLite store")
    };
    sqlx::raw_sql(
        "CREATE TRIGGER refuse_bad BEFORE INSERT ON center_audit WHEN NEW.instance = 'i-bad'
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
    )
    .execute(pool)
    .await
    .expect("trigger");
    let (calls, turn) = held_group(&store, &["i-a", "i-bad", "i-b", "i-c"]).await;
    group_done(&store, turn).await;
    let mut outcomes = Vec::new();
    for call in calls {
        outcomes.push(call.await.expect("task").is_ok());
    }
    assert_eq!(outcomes, [true, false, true, true]);
    let (instances, acks) = written(&store).await;
    assert_eq!(instances, ["i-a", "i-b", "i-c"]);
    assert_eq!(acks, 3);
}
