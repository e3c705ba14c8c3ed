//! The seeds' storm table and the added rows, over several seeds.
//!
//! Tolerances were set from 500 seeds (the ranges in the comments are the observed minimum
//! and maximum), so they are wide enough never to flake and narrow enough to catch a wrong
//! strategy.

use stormguard_sim::progress::NoProgress;
use stormguard_sim::scenario::storm::{StormConfig, StormRow, run};
use stormguard_sim::strategy::Strategy;

const SEEDS: [u64; 8] = [1, 2, 3, 7, 42, 1000, 31337, u64::MAX];

fn rows(seed: u64) -> Vec<StormRow> {
    run(
        &StormConfig {
            seed,
            ..StormConfig::default()
        },
        &mut NoProgress,
    )
    .expect("valid defaults")
    .rows
}

fn row(rows: &[StormRow], s: Strategy) -> &StormRow {
    rows.iter().find(|r| r.strategy == s).expect("row present")
}

#[test]
fn unjittered_rows_are_exact_whatever_the_seed() {
    for seed in SEEDS {
        let rows = rows(seed);
        let fig = |s| {
            let r = row(&rows, s);
            (r.total_retries, r.peak_per_bin, r.last_retry_s)
        };
        assert_eq!(fig(Strategy::Fixed), (4000, 1000, 4.0));
        assert_eq!(fig(Strategy::Linear), (4000, 1000, 10.0));
        assert_eq!(fig(Strategy::Exponential), (4000, 1000, 15.0));
    }
}

#[test]
fn full_jitter_peaks_near_160_and_ends_near_14_s() {
    for seed in SEEDS {
        let r = rows(seed);
        let full = row(&r, Strategy::Full);
        assert_eq!(full.total_retries, 4000);
        // 500 seeds: 141..=183.
        assert!(
            (130..=190).contains(&full.peak_per_bin),
            "seed {seed}: {}",
            full.peak_per_bin
        );
        // 500 seeds: 13.26..=14.81; it can never pass 15 s.
        assert!(
            (13.0..15.0).contains(&full.last_retry_s),
            "seed {seed}: {}",
            full.last_retry_s
        );
    }
}

#[test]
fn equal_jitter_peaks_near_216_and_decorrelated_near_73() {
    let mut equal = 0;
    let mut decorrelated = 0;
    for seed in SEEDS {
        let r = rows(seed);
        let e = row(&r, Strategy::Equal).peak_per_bin;
        let d = row(&r, Strategy::Decorrelated).peak_per_bin;
        // 500 seeds: equal 203..=249, decorrelated 62..=89.
        assert!((185..=255).contains(&e), "seed {seed}: equal {e}");
        assert!((55..=95).contains(&d), "seed {seed}: decorrelated {d}");
        equal += e;
        decorrelated += d;
    }
    let n = SEEDS.len() as u64;
    assert!(
        (200..=232).contains(&(equal / n)),
        "mean equal peak {}",
        equal / n
    );
    assert!(
        (65..=81).contains(&(decorrelated / n)),
        "mean decorrelated peak {}",
        decorrelated / n
    );
}

#[test]
fn jitter_cuts_the_peak_about_six_fold() {
    for seed in SEEDS {
        let r = rows(seed);
        let cut = row(&r, Strategy::Exponential).peak_per_bin as f64
            / row(&r, Strategy::Full).peak_per_bin as f64;
        assert!((5.0..=7.5).contains(&cut), "seed {seed}: {cut}");
    }
}

#[test]
fn the_same_seed_gives_the_same_report_and_threads_do_not_matter() {
    let cfg = StormConfig {
        clients: 300_000,
        strategies: vec![Strategy::Full, Strategy::Decorrelated],
        ..StormConfig::default()
    };
    let one = run(&cfg, &mut NoProgress).expect("valid");
    let again = run(&cfg, &mut NoProgress).expect("valid");
    let threaded = run(
        &StormConfig {
            threads: 3,
            ..cfg.clone()
        },
        &mut NoProgress,
    )
    .expect("valid");
    assert_eq!(one, again);
    let figures = |r: &StormRow| {
        (
            r.total_retries,
            r.peak_per_bin,
            r.peak_at_s,
            r.last_retry_s,
            r.per_bin.clone(),
        )
    };
    for (a, b) in one.rows.iter().zip(&threaded.rows) {
        assert_eq!(figures(a), figures(b));
    }
    let other = run(&StormConfig { seed: 43, ..cfg }, &mut NoProgress).expect("valid");
    assert_ne!(one.rows[0].per_bin, other.rows[0].per_bin);
}

#[test]
fn refusals_name_the_flag() {
    let bad = |cfg: StormConfig| run(&cfg, &mut NoProgress).expect_err("refused").flag;
    let d = StormConfig::default;
    assert_eq!(bad(StormConfig { clients: 0, ..d() }), "clients");
    assert_eq!(bad(StormConfig { retries: 0, ..d() }), "retries");
    assert_eq!(
        bad(StormConfig {
            base: std::time::Duration::ZERO,
            ..d()
        }),
        "base"
    );
    assert_eq!(
        bad(StormConfig {
            cap: std::time::Duration::from_millis(500),
            ..d()
        }),
        "cap"
    );
    assert_eq!(
        bad(StormConfig {
            bin: std::time::Duration::from_secs(600),
            ..d()
        }),
        "bin"
    );
    assert_eq!(
        bad(StormConfig {
            strategies: vec![],
            ..d()
        }),
        "strategy"
    );
}
