//! The relay on real sockets (four axum servers on 127.0.0.1 and a hyper client), all on one
//! current-thread runtime under paused tokio time: every hop's figures are exact, and the
//! seeds' table holds to the nanosecond.
//!
//! The clock is held ([`ClockHold`], see `clock_hold.rs` for why): it moves only by
//! `tokio::time::advance`, once C has been reached, so no time passes in transit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../crates/stormguard-tower/tests/support/clock_hold.rs"]
mod clock_hold;

use std::time::Duration;

use deadline_relay::{ENTRY_BUDGET, Outcome, Relay, answer_for, seeds_hops};
use http::StatusCode;
use stormguard::deadline::DeadlineHeader;

use clock_hold::ClockHold;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Calls the gateway; once C has started its work, moves the paused clock by `then`.
async fn call_advancing_at_c(
    relay: &Relay,
    then: Duration,
) -> (StatusCode, String, Vec<deadline_relay::HopReport>) {
    let mut reports = relay.reports();
    let (result, ()) = tokio::join!(relay.call(), async {
        reports
            .wait_for(|reports| reports.iter().any(|r| r.name == "C"))
            .await
            .unwrap();
        tokio::time::advance(then).await;
    });
    result.unwrap()
}

#[tokio::test(start_paused = true)]
async fn every_hop_receives_exactly_what_the_previous_one_handed_on() {
    let mut hold = ClockHold::new();
    let relay = Relay::start(seeds_hops(MS(5)), false).await.unwrap();
    let (status, body, reports) = hold.within(call_advancing_at_c(&relay, MS(5))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "C done");

    // The seeds' table: received, own timeout, handed on (ms); C's 5 ms of work is the only
    // time that passes, so every hop ends 5 ms after it started.
    let table: Vec<_> = reports
        .iter()
        .map(|r| {
            (
                r.name,
                r.received,
                r.own_timeout,
                r.handed,
                r.outcome,
                r.took,
            )
        })
        .collect();
    let ok = Outcome::Answered(StatusCode::OK);
    assert_eq!(
        table,
        [
            ("gateway", MS(1000), MS(950), Some(MS(900)), ok, MS(5)),
            ("A", MS(900), MS(800), Some(MS(600)), ok, MS(5)),
            ("B", MS(600), MS(450), Some(MS(300)), ok, MS(5)),
            ("C", MS(300), MS(300), None, ok, MS(5)),
        ]
    );
    assert_eq!(reports[0].received, ENTRY_BUDGET);
    // The gateway had no header (its own budget); the others read grpc-timeout, which ties
    // with x-request-deadline and comes first in the list.
    let via: Vec<_> = reports.iter().map(|r| r.via).collect();
    let grpc = Some(DeadlineHeader::GrpcTimeout);
    assert_eq!(via, [None, grpc, grpc, grpc]);
}

#[tokio::test(start_paused = true)]
async fn a_c_slower_than_its_budget_is_cancelled_and_every_hop_answers_504() {
    let mut hold = ClockHold::new();
    let relay = Relay::start(seeds_hops(Duration::from_secs(60)), false)
        .await
        .unwrap();
    // C would work for 60 s; its deadline layer ends it when its 300 ms are up.
    let (status, body, reports) = hold.within(call_advancing_at_c(&relay, MS(300))).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(body, "C answered 504 Gateway Timeout: deadline exceeded");
    let outcomes: Vec<_> = reports
        .iter()
        .map(|r| (r.name, r.outcome, r.took))
        .collect();
    let timeout = Outcome::Answered(StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        outcomes,
        [
            ("gateway", timeout, MS(300)),
            ("A", timeout, MS(300)),
            ("B", timeout, MS(300)),
            ("C", Outcome::Cancelled, MS(300)),
        ]
    );
}

#[test]
fn a_hop_answers_504_for_504_503_for_503_and_otherwise_502_or_200() {
    for code in 100..=599u16 {
        let downstream = StatusCode::from_u16(code).unwrap();
        let expected = match code {
            200..=299 => StatusCode::OK,
            503 => StatusCode::SERVICE_UNAVAILABLE,
            504 => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::BAD_GATEWAY,
        };
        assert_eq!(answer_for(downstream), expected, "{downstream}");
    }
}
