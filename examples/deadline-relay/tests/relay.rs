//! The relay on real sockets in real time: each hop receives what the hop before it handed
//! on (compared as values, with a tolerance for the time between), the seeds' table holds
//! within that tolerance, and a C slower than its budget is cancelled by its deadline layer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use deadline_relay::{ENTRY_BUDGET, Outcome, Relay, seeds_hops};
use http::StatusCode;

/// Time a hop may lose between the hop before it computing the budget and its own handler
/// starting: connection set-up, HTTP parsing, scheduling (debug build, loaded machine).
const PER_HOP: Duration = Duration::from_millis(20);
const PATIENCE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn every_hop_receives_what_the_previous_one_handed_on() {
    let relay = Relay::start(seeds_hops(Duration::from_millis(5)), false)
        .await
        .unwrap();
    let (status, body, reports) = tokio::time::timeout(PATIENCE, relay.call())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "C done");
    let names: Vec<_> = reports.iter().map(|r| r.name).collect();
    assert_eq!(names, ["gateway", "A", "B", "C"]);
    assert!(
        reports
            .iter()
            .all(|r| r.outcome == Outcome::Answered(StatusCode::OK))
    );

    // The gateway's own budget: 1000 ms, read when its handler started.
    let gateway = &reports[0];
    assert!(gateway.via.is_none());
    assert!(gateway.received <= ENTRY_BUDGET && gateway.received > ENTRY_BUDGET - PER_HOP);
    for pair in reports.windows(2) {
        let (caller, callee) = (&pair[0], &pair[1]);
        let handed = caller.handed.expect("every hop but the last hands on");
        assert!(
            callee.received <= handed && callee.received > handed.saturating_sub(PER_HOP),
            "{} handed on {handed:?}, {} received {:?}",
            caller.name,
            callee.name,
            callee.received
        );
        assert!(callee.via.is_some());
    }
    // The seeds' table, each row within the accumulated tolerance.
    let seeds = [
        (1000, 950, Some(900)),
        (900, 800, Some(600)),
        (600, 450, Some(300)),
        (300, 300, None),
    ];
    for (depth, (report, (received, own, hands))) in reports.iter().zip(seeds).enumerate() {
        let slack = PER_HOP * u32::try_from(depth + 1).unwrap();
        let near = |got: Duration, want: u64| {
            let want = Duration::from_millis(want);
            got <= want && got + slack > want
        };
        assert!(near(report.received, received), "{report:?}");
        assert!(near(report.own_timeout, own), "{report:?}");
        match hands {
            Some(h) => assert!(near(report.handed.unwrap(), h), "{report:?}"),
            None => assert!(report.handed.is_none()),
        }
    }
}

#[tokio::test]
async fn a_c_slower_than_its_budget_is_cancelled_and_the_chain_answers() {
    let relay = Relay::start(seeds_hops(Duration::from_secs(60)), false)
        .await
        .unwrap();
    let (status, body, reports) = tokio::time::timeout(PATIENCE, relay.call())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body, "C answered 504 Gateway Timeout: deadline exceeded");
    let outcomes: Vec<_> = reports.iter().map(|r| (r.name, r.outcome)).collect();
    assert_eq!(
        outcomes,
        [
            ("gateway", Outcome::Answered(StatusCode::BAD_GATEWAY)),
            ("A", Outcome::Answered(StatusCode::BAD_GATEWAY)),
            ("B", Outcome::Answered(StatusCode::BAD_GATEWAY)),
            ("C", Outcome::Cancelled),
        ]
    );
}
