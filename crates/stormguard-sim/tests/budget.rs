//! How fast each budget kind shuts retries off when success drops (the seeds' Q5).

use stormguard_sim::budgets::BudgetKind;
use stormguard_sim::progress::NoProgress;
use stormguard_sim::scenario::budget::{BudgetConfig, BudgetRow, FailurePattern, run};

fn rows(seed: u64, failures: FailurePattern) -> Vec<BudgetRow> {
    run(
        &BudgetConfig {
            seed,
            failures,
            ..BudgetConfig::default()
        },
        &mut NoProgress,
    )
    .expect("valid defaults")
    .rows
}

fn row(rows: &[BudgetRow], kind: BudgetKind) -> &BudgetRow {
    rows.iter()
        .find(|r| r.strategy == kind)
        .expect("row present")
}

fn shutoff(rows: &[BudgetRow], kind: BudgetKind) -> f64 {
    row(rows, kind)
        .shutoff_ms
        .expect("the budget refused a retry")
}

#[test]
fn seeds_bucket_shuts_off_in_about_20_ms_and_grpc_in_about_11() {
    for seed in [1, 2, 3, 4, 5, 42] {
        let r = rows(seed, FailurePattern::Spread);
        // 10 tokens / (500 − 50) per second ≈ 22 ms; 200 seeds: 18..=22.
        let seeds = shutoff(&r, BudgetKind::Seeds);
        assert!((17.0..=24.0).contains(&seeds), "seed {seed}: {seeds}");
        // 5 tokens / 450 per second ≈ 11 ms.
        let grpc = shutoff(&r, BudgetKind::Grpc);
        assert!((9.0..=13.0).contains(&grpc), "seed {seed}: {grpc}");
        assert!(row(&r, BudgetKind::None).shutoff_ms.is_none());
        assert_eq!(row(&r, BudgetKind::None).refused, 0);
    }
}

#[test]
fn random_failures_give_the_same_figures_on_average() {
    let n = 20;
    let (mut seeds, mut grpc) = (0.0, 0.0);
    for seed in 0..n {
        let r = rows(seed, FailurePattern::Random);
        seeds += shutoff(&r, BudgetKind::Seeds);
        grpc += shutoff(&r, BudgetKind::Grpc);
    }
    let (seeds, grpc) = (seeds / n as f64, grpc / n as f64);
    // 200 seeds: means 20.2 and 11.0.
    assert!((15.0..=26.0).contains(&seeds), "{seeds}");
    assert!((8.0..=14.5).contains(&grpc), "{grpc}");
}

#[test]
fn after_the_step_retries_are_pinned_where_each_budget_puts_them() {
    for seed in [1, 2, 3] {
        let r = rows(seed, FailurePattern::Spread);
        // No budget: failures want about 0.75 retries per request (2 retries at 50 %).
        assert!(row(&r, BudgetKind::None).retry_share_after > 0.65);
        // The seeds' bucket: what successes pay for, 0.1 per success ≈ 5 % of requests.
        let s = row(&r, BudgetKind::Seeds).retry_share_after;
        assert!((0.04..=0.065).contains(&s), "seed {seed}: {s}");
        // gRPC at 50 % failures stops for good.
        assert_eq!(row(&r, BudgetKind::Grpc).retries_per_s_after, 0.0);
        // The ratio budget settles near its 20 %.
        let ratio = row(&r, BudgetKind::Ratio).retry_share_after;
        assert!((0.18..=0.22).contains(&ratio), "seed {seed}: {ratio}");
        // The AWS quota runs dry in about a third of a second, then allows about 20 %.
        let aws = shutoff(&r, BudgetKind::Aws);
        assert!((250.0..=450.0).contains(&aws), "seed {seed}: {aws}");
        // Envoy's concurrency budget bounds retries in flight at once.
        assert!(shutoff(&r, BudgetKind::Concurrency) < 20.0);
        // Before the step, 1 % failures: about 10 retries a second everywhere.
        for row in &r {
            assert!((5.0..=15.0).contains(&row.retries_per_s_before), "{row:?}");
        }
    }
}

#[test]
fn refusals_name_the_flag() {
    let bad = |cfg: BudgetConfig| run(&cfg, &mut NoProgress).expect_err("refused").flag;
    let d = BudgetConfig::default;
    assert_eq!(bad(BudgetConfig { after: 1.5, ..d() }), "after");
    assert_eq!(
        bad(BudgetConfig {
            step_at: std::time::Duration::from_secs(9),
            ..d()
        }),
        "step-at"
    );
    let mut params = d();
    params.budget.max_tokens = 0;
    assert_eq!(bad(params), "max-tokens");
    let mut params = d();
    params.budget.token_ratio = 5.0;
    assert_eq!(bad(params), "token-ratio");
    let mut params = d();
    params.kinds = vec![BudgetKind::None];
    params.budget.retry_ratio = 20.0;
    assert_eq!(bad(params), "retry-ratio");
}
