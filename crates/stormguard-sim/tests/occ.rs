//! Brooker's OCC set-up: full jitter needs under half the calls of plain exponential.

use stormguard_sim::progress::NoProgress;
use stormguard_sim::scenario::occ::{OccConfig, OccRow, run};
use stormguard_sim::strategy::Strategy;

fn rows(seed: u64, clients: Vec<u32>, runs: u32) -> Vec<OccRow> {
    run(
        &OccConfig {
            seed,
            clients,
            runs,
            strategies: vec![
                Strategy::Exponential,
                Strategy::Full,
                Strategy::Equal,
                Strategy::Decorrelated,
                Strategy::None,
            ],
            ..OccConfig::default()
        },
        &mut NoProgress,
    )
    .expect("valid")
    .rows
}

fn find(rows: &[OccRow], s: Strategy, clients: u32) -> &OccRow {
    rows.iter()
        .find(|r| r.strategy == s && r.clients == clients)
        .expect("row present")
}

#[test]
fn at_100_clients_full_jitter_needs_under_half_the_calls_of_exponential() {
    for seed in [1, 2, 3] {
        let r = rows(seed, vec![100], 20);
        let exp = find(&r, Strategy::Exponential, 100);
        let full = find(&r, Strategy::Full, 100);
        // 30 seeds × 30 runs: 0.47..=0.48.
        let ratio = full.calls / exp.calls;
        assert!(
            ratio < 0.5,
            "seed {seed}: {} / {} = {ratio}",
            full.calls,
            exp.calls
        );
        assert!(ratio > 0.40, "seed {seed}: {ratio}");
        // And it finishes far sooner.
        assert!(full.completion_ms < exp.completion_ms / 4.0);
        // Every client writes successfully exactly once.
        for row in &r {
            assert!(row.calls >= 100.0, "{row:?}");
        }
    }
}

#[test]
fn contention_grows_faster_than_the_number_of_clients() {
    let r = rows(7, vec![10, 50], 20);
    for s in [Strategy::Exponential, Strategy::Full] {
        let small = find(&r, s, 10).calls;
        let large = find(&r, s, 50).calls;
        assert!(large > 5.0 * small * 1.2, "{s}: {small} → {large}");
    }
}

#[test]
fn the_same_seed_gives_the_same_rows() {
    assert_eq!(rows(9, vec![30], 5), rows(9, vec![30], 5));
    assert_ne!(rows(9, vec![30], 5), rows(10, vec![30], 5));
}
