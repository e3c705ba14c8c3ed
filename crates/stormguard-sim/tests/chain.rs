//! Retry amplification along a chain: the exact products, retrying at one layer, budgets.

use stormguard_sim::progress::NoProgress;
use stormguard_sim::scenario::chain::{ChainConfig, ChainMode, ChainRow, run};

fn chain(layers: u32, retries: u32, modes: Vec<ChainMode>) -> Vec<ChainRow> {
    run(
        &ChainConfig {
            layers,
            retries: vec![retries],
            rate: 1000.0,
            modes,
            ..ChainConfig::default()
        },
        &mut NoProgress,
    )
    .expect("valid")
    .rows
}

#[test]
fn a_down_service_sees_the_exact_product_of_one_plus_retries() {
    for (layers, retries, expected) in [(3, 2, 27.0), (3, 3, 64.0), (5, 2, 243.0), (1, 2, 3.0)] {
        let rows = chain(layers, retries, vec![ChainMode::EveryLayer]);
        assert_eq!(
            rows[0].amplification, expected,
            "{layers} layers × {retries}"
        );
        assert_eq!(rows[0].requests_per_layer[0], 1000);
        assert_eq!(rows[0].success_rate, 0.0);
    }
    let rows = chain(2, 2, vec![ChainMode::EveryLayer]);
    assert_eq!(rows[0].requests_per_layer, vec![1000, 3000, 9000]);
}

#[test]
fn per_layer_retries_multiply_as_given() {
    let rows = run(
        &ChainConfig {
            retries: vec![1, 2, 3],
            rate: 500.0,
            modes: vec![ChainMode::EveryLayer],
            ..ChainConfig::default()
        },
        &mut NoProgress,
    )
    .expect("valid")
    .rows;
    assert_eq!(rows[0].amplification_per_layer, vec![1.0, 2.0, 6.0, 24.0]);
}

#[test]
fn retrying_at_the_entry_only_gives_three_times() {
    let rows = chain(3, 2, vec![ChainMode::EntryOnly]);
    assert_eq!(rows[0].amplification_per_layer, vec![1.0, 3.0, 3.0, 3.0]);
}

#[test]
fn budgets_bound_amplification_near_1_1() {
    for seed in [1, 2, 3] {
        let rows = run(
            &ChainConfig {
                seed,
                modes: vec![ChainMode::Budget, ChainMode::BudgetNack],
                ..ChainConfig::default()
            },
            &mut NoProgress,
        )
        .expect("valid")
        .rows;
        // Each layer adds its 10 %; the budgets compound: 1.1³ = 1.331.
        let compounded = rows[0].amplification;
        assert!(
            (1.30..=1.34).contains(&compounded),
            "seed {seed}: {compounded}"
        );
        // With "don't retry" passed up, only the lowest layer retries.
        let nack = rows[1].amplification;
        assert!((1.08..=1.11).contains(&nack), "seed {seed}: {nack}");
        assert_eq!(&rows[1].amplification_per_layer[..3], &[1.0, 1.0, 1.0]);
    }
}

#[test]
fn a_partly_failing_service_is_helped_by_retries() {
    let rows = run(
        &ChainConfig {
            fail_prob: 0.5,
            rate: 2000.0,
            modes: vec![ChainMode::EveryLayer, ChainMode::EntryOnly],
            ..ChainConfig::default()
        },
        &mut NoProgress,
    )
    .expect("valid")
    .rows;
    // Every layer retrying hides a 50 % failure rate completely, at twice the load.
    assert!(rows[0].success_rate > 0.99, "{}", rows[0].success_rate);
    assert!(
        (1.85..=2.1).contains(&rows[0].amplification),
        "{}",
        rows[0].amplification
    );
    // Three tries at the entry: 1 − 0.5³ = 87.5 % succeed, 1.75 attempts each.
    assert!(
        (0.85..=0.90).contains(&rows[1].success_rate),
        "{}",
        rows[1].success_rate
    );
    assert!(
        (1.70..=1.80).contains(&rows[1].amplification),
        "{}",
        rows[1].amplification
    );
}

#[test]
fn refusals_name_the_flag() {
    let bad = |cfg: ChainConfig| run(&cfg, &mut NoProgress).expect_err("refused").flag;
    let d = ChainConfig::default;
    assert_eq!(bad(ChainConfig { layers: 0, ..d() }), "layers");
    assert_eq!(
        bad(ChainConfig {
            retries: vec![1, 2],
            ..d()
        }),
        "retries"
    );
    assert_eq!(
        bad(ChainConfig {
            fail_prob: 1.5,
            ..d()
        }),
        "fail-prob"
    );
    assert_eq!(bad(ChainConfig { rate: -1.0, ..d() }), "rate");
    // A fraction: 10 would be 1000 % (no budget at all), as the core's ratio budget says.
    assert_eq!(
        bad(ChainConfig {
            retry_ratio: 10.0,
            ..d()
        }),
        "retry-ratio"
    );
    assert_eq!(
        bad(ChainConfig {
            layers: 16,
            retries: vec![9],
            modes: vec![ChainMode::EveryLayer],
            ..d()
        }),
        "rate"
    );
}

#[test]
fn budgets_hold_with_more_layers_than_a_thread_batches_for() {
    // Five budgets driven by one thread: the core batches deposits for four of them and
    // deposits straight into the fifth; every layer must still see its 10 %.
    let report = run(
        &ChainConfig {
            layers: 5,
            modes: vec![ChainMode::Budget, ChainMode::BudgetNack],
            ..ChainConfig::default()
        },
        &mut NoProgress,
    )
    .expect("runs");
    let budget = &report.rows[0].amplification_per_layer;
    for (layer, amp) in budget.iter().enumerate() {
        let expected = 1.1f64.powi(i32::try_from(layer).expect("few layers"));
        assert!(
            (amp - expected).abs() < 0.01,
            "layer {layer}: {amp} vs {expected}"
        );
    }
    let nack = report.rows[1].amplification;
    assert!((nack - 1.1).abs() < 0.01, "budget + nack: {nack}");
}
