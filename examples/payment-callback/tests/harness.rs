//! The quick harness, in-process on SQLite: the duplicates scenario, and the crash scenario
//! with a real child process killed by SIGKILL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use stormguard_payment_callback::Launcher;
use stormguard_payment_callback::harness::{self, HarnessConfig, Scenario};

fn quick(scenarios: &[Scenario], launcher: Option<Launcher>) -> HarnessConfig {
    let mut config = HarnessConfig::new(launcher);
    config.quick = true;
    config.scenarios = scenarios.to_vec();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_make_one_row_and_one_event() {
    let results = harness::run(&quick(&[Scenario::Duplicates], None))
        .await
        .expect("the harness runs");
    let r = &results[0];
    assert!(r.passed(), "{}", harness::render(&results));
    // 200 deliveries of one callback, every one finally answered success...
    assert_eq!((r.notifications, r.delivered), (200, 200));
    assert!(r.deliveries >= 200);
    // ...one payment row, one outbox message, one event applied once.
    assert_eq!(r.counts.orders, 1);
    assert_eq!((r.counts.outbox, r.counts.outbox_published), (1, 1));
    assert_eq!((r.counts.applied, r.counts.applied_distinct), (1, 1));
    assert_eq!(r.broker.distinct, 1);
    assert_eq!(r.broker.acked, r.broker.messages);
    // Deliveries that arrived before the order was paid were risk-checked (and retried when
    // the check failed); later duplicates are answered from the database without a check.
    assert!((1..=200).contains(&r.risk.first_attempts()), "{:?}", r.risk);
    assert!(r.max_latency <= stormguard_payment_callback::service::BUSINESS_DEADLINE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_loses_no_callback_and_duplicates_nothing() {
    let launcher = Launcher::new(env!("CARGO_BIN_EXE_payment-callback"), Vec::<String>::new());
    let results = harness::run(&quick(&[Scenario::Crash], Some(launcher)))
        .await
        .expect("the harness runs");
    let r = &results[0];
    assert!(r.passed(), "{}", harness::render(&results));
    assert_eq!(r.notifications, r.delivered);
    assert_eq!(r.counts.orders, r.orders);
    assert_eq!(r.counts.applied, r.orders);
    assert_eq!(r.counts.applied_distinct, r.orders);
    // The kill cost deliveries that the platform then redelivered.
    assert!(r.failed_deliveries > 0, "{r:?}");
    assert!(
        r.notes.iter().any(|n| n.contains("SIGKILL")),
        "{:?}",
        r.notes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crash_scenario_needs_a_launcher() {
    let err = harness::run(&quick(&[Scenario::Crash], None))
        .await
        .expect_err("no launcher");
    assert!(err.to_string().contains("crash scenario"), "{err}");
}
