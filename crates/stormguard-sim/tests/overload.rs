//! The metastable failure of Bronson et al. and the protections that break it.

use std::time::Duration;

use stormguard_sim::progress::NoProgress;
use stormguard_sim::scenario::overload::{
    LimitKind, OverloadConfig, OverloadRow, Protection, Trigger, run,
};

fn rows(cfg: OverloadConfig) -> Vec<OverloadRow> {
    run(&cfg, &mut NoProgress).expect("valid").rows
}

#[test]
fn unprotected_retries_stay_stuck_near_560_with_no_goodput() {
    for seed in [1, 2, 3] {
        let r = rows(OverloadConfig {
            seed,
            protections: vec![Protection::None],
            ..OverloadConfig::default()
        });
        let none = &r[0];
        assert!((275.0..=285.0).contains(&none.goodput_before), "{none:?}");
        assert!(
            (540.0..=580.0).contains(&none.offered_after),
            "{}",
            none.offered_after
        );
        assert!(none.goodput_after < 14.0, "{}", none.goodput_after);
        assert!(!none.recovered);
        assert!(none.recovery_s.is_none());
        assert!(none.wasted > 0, "the server works for clients that gave up");
    }
}

#[test]
fn a_budget_or_jitter_and_a_deadline_recover() {
    for seed in [1, 2, 3] {
        let r = rows(OverloadConfig {
            seed,
            protections: vec![
                Protection::Budget,
                Protection::JitterDeadline,
                Protection::All,
            ],
            ..OverloadConfig::default()
        });
        for row in &r {
            assert!(row.recovered, "{}: {row:?}", row.label);
            assert!(row.goodput_after >= 0.95 * row.goodput_before);
            assert!(
                row.offered_after <= 300.0,
                "{}: {}",
                row.label,
                row.offered_after
            );
            assert!(
                row.recovery_s.is_some_and(|s| s <= 3.0),
                "{}: {:?}",
                row.label,
                row.recovery_s
            );
        }
    }
}

#[test]
fn after_a_spike_only_the_deadline_clears_the_stale_queue() {
    let r = rows(OverloadConfig {
        trigger: Trigger::Spike,
        protections: Protection::ALL.to_vec(),
        ..OverloadConfig::default()
    });
    let by = |p| r.iter().find(|row| row.strategy == p).expect("row");
    assert!(!by(Protection::None).recovered);
    // The budget stops retries, but the server still serves a queue nobody waits for.
    assert!(!by(Protection::Budget).recovered);
    assert!(by(Protection::Budget).offered_after < 300.0);
    assert!(by(Protection::JitterDeadline).recovered);
    assert!(by(Protection::JitterDeadline).expired > 0);
    assert!(by(Protection::All).recovered);
}

#[test]
fn a_capacity_drop_is_metastable_too() {
    let r = rows(OverloadConfig {
        trigger: Trigger::CapacityDrop,
        protections: vec![Protection::None, Protection::JitterDeadline],
        ..OverloadConfig::default()
    });
    assert!(!r[0].recovered);
    assert!(r[1].recovered);
}

#[test]
fn jitter_alone_does_not_remove_load_when_retries_fit_the_deadline() {
    let r = rows(OverloadConfig {
        deadline: Duration::from_secs(2),
        protections: vec![Protection::JitterDeadline, Protection::All],
        ..OverloadConfig::default()
    });
    assert!(!r[0].recovered, "a 2 s deadline lets every retry through");
    assert!(r[1].recovered, "the budget still stops them");
}

/// Issue 17's acceptance, HotOS'21 set-up, clients that retry at once without a budget: with
/// the server's adaptive limit (Vegas) and deadline shedding, goodput is back at 95 % of what
/// it was before the outage within 2 s of its end; without, it stays stuck.
#[test]
fn the_servers_limit_recovers_within_two_seconds_from_clients_without_budgets() {
    for seed in [1, 2, 3] {
        let r = rows(OverloadConfig {
            seed,
            protections: vec![Protection::None, Protection::Limit],
            ..OverloadConfig::default()
        });
        let (none, limit) = (&r[0], &r[1]);
        assert!(!none.recovered && none.goodput_after < 14.0, "{none:?}");
        assert!(limit.recovered, "{limit:?}");
        assert!(
            limit.recovery_s.is_some_and(|s| s <= 2.0),
            "{:?}",
            limit.recovery_s
        );
        assert!(limit.goodput_after >= 0.95 * limit.goodput_before);
        assert_eq!(
            limit.wasted, 0,
            "the server never works for a caller that left"
        );
        assert!(limit.shed > 0);
    }
}

/// At 2x and 3x capacity offered all along (no trigger), clients retrying every shed request
/// at once: goodput stays at least 90 % of capacity (300/s) with the limit, with admitted
/// requests answered in tens of milliseconds; without it the server collapses.
#[test]
fn the_servers_limit_keeps_goodput_at_capacity_under_sustained_overload() {
    for rate in [600.0, 900.0] {
        let r = rows(OverloadConfig {
            rate,
            trigger: Trigger::Spike,
            spike: 0.0,
            protections: vec![Protection::None, Protection::Limit],
            ..OverloadConfig::default()
        });
        let (none, limit) = (&r[0], &r[1]);
        assert!(none.goodput_after < 30.0, "{rate}: {}", none.goodput_after);
        assert!(
            limit.goodput_after >= 270.0,
            "{rate}: {}",
            limit.goodput_after
        );
        assert!(
            limit.latency_after_ms.is_some_and(|ms| ms <= 50.0),
            "{rate}: {:?}",
            limit.latency_after_ms
        );
    }
}

/// AIMD, which sees only drops, also holds goodput at 2x, with a long queue (it grows the
/// limit until requests time out).
#[test]
fn aimd_holds_goodput_at_twice_capacity_with_a_long_queue() {
    let r = rows(OverloadConfig {
        rate: 600.0,
        trigger: Trigger::Spike,
        spike: 0.0,
        limit: LimitKind::Aimd,
        protections: vec![Protection::Limit],
        ..OverloadConfig::default()
    });
    assert!(r[0].goodput_after >= 270.0, "{}", r[0].goodput_after);
    assert!(r[0].latency_after_ms.is_some_and(|ms| ms > 100.0));
}

#[test]
fn the_same_seed_gives_the_same_rows() {
    let cfg = OverloadConfig {
        protections: Protection::ALL.to_vec(),
        ..OverloadConfig::default()
    };
    assert_eq!(rows(cfg.clone()), rows(cfg));
}

#[test]
fn refusals_name_the_flag() {
    let bad = |cfg: OverloadConfig| run(&cfg, &mut NoProgress).expect_err("refused").flag;
    let d = OverloadConfig::default;
    assert_eq!(
        bad(OverloadConfig {
            trigger_at: Duration::from_secs(1),
            ..d()
        }),
        "trigger-at"
    );
    assert_eq!(
        bad(OverloadConfig {
            trigger_for: Duration::from_secs(49),
            ..d()
        }),
        "duration"
    );
    assert_eq!(
        bad(OverloadConfig {
            slowdown: 0.5,
            ..d()
        }),
        "slowdown"
    );
    assert_eq!(
        bad(OverloadConfig {
            bin: Duration::from_secs(61),
            ..d()
        }),
        "bin"
    );
    // No retry can fit in a deadline that is no longer than the minimum call.
    assert_eq!(
        bad(OverloadConfig {
            min_call: Duration::from_secs(5),
            deadline: Duration::from_secs(1),
            ..d()
        }),
        "min-call"
    );
    assert_eq!(
        bad(OverloadConfig {
            min_call: Duration::from_secs(1),
            ..d()
        }),
        "min-call"
    );
    // Every budget number is checked, also those of kinds the run does not build.
    let mut params = d();
    params.budget_params.retry_ratio = 20.0;
    assert_eq!(bad(params), "retry-ratio");
}
