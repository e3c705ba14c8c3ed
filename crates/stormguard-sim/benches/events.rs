//! Events per second of each scenario's engine, on one thread.
//!
//! Run with `cargo bench -p stormguard-sim --bench events`. Each line is one scenario at a
//! size large enough that set-up is noise; "events" are what the scenario's loop handles:
//! retry decisions for `storm` (which needs no queue, see its docs), queue pops for the
//! others. A pure queue line measures push + pop at a steady population of pending events.
//! Figures are wall-clock and vary with the machine; nothing here asserts on them.

use std::hint::black_box;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::SmallRng};
use stormguard_sim::budgets::BudgetKind;
use stormguard_sim::progress::NoProgress;
use stormguard_sim::queue::EventQueue;
use stormguard_sim::scenario::{budget, chain, occ, overload, storm};
use stormguard_sim::strategy::Strategy;

/// The first argument that is not a flag (`cargo bench` passes `--bench`): only lines whose
/// name contains it run.
fn wanted(name: &str) -> bool {
    std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .is_none_or(|filter| name.contains(&filter))
}

fn report(name: &str, events: u64, elapsed: Duration) {
    println!(
        "{name:<44} {events:>12} events {:>9.1} ms {:>7.1} M events/s",
        elapsed.as_secs_f64() * 1e3,
        events as f64 / elapsed.as_secs_f64() / 1e6
    );
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed())
}

/// Runs `f` (which returns the events it handled) if `name` is wanted, and reports it.
fn bench(name: &str, f: impl FnOnce() -> Option<u64>) {
    if !wanted(name) {
        return;
    }
    let (events, elapsed) = timed(f);
    if let Some(events) = events {
        report(name, events, elapsed);
    }
}

/// The classic hold model: `pending` events, each pop followed by a push a uniform random
/// time later.
fn queue_hold(pending: usize, ops: u64) -> Option<u64> {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut q = EventQueue::with_capacity(pending);
    for i in 0..pending as u64 {
        q.push(rng.random_range(0..1_000_000), i);
    }
    let mut sum = 0u64;
    for _ in 0..ops {
        if let Some((at, p)) = q.pop() {
            sum = sum.wrapping_add(p);
            q.push(at + rng.random_range(0..1_000_000), p);
        }
    }
    black_box(sum);
    Some(ops)
}

/// The same hold model on `std::collections::BinaryHeap`, for comparison.
fn heap_hold(pending: usize, ops: u64) -> Option<u64> {
    use std::cmp::Reverse;
    let mut rng = SmallRng::seed_from_u64(1);
    let mut q = std::collections::BinaryHeap::with_capacity(pending);
    for i in 0..pending as u64 {
        q.push(Reverse(
            (u128::from(rng.random_range(0..1_000_000u64)) << 64) | u128::from(i),
        ));
    }
    let mut sum = 0u64;
    for _ in 0..ops {
        if let Some(Reverse(e)) = q.pop() {
            sum = sum.wrapping_add(e as u64);
            let at = (e >> 64) as u64 + rng.random_range(0..1_000_000);
            q.push(Reverse((u128::from(at) << 64) | (e & u128::from(u64::MAX))));
        }
    }
    black_box(sum);
    Some(ops)
}

fn main() {
    for pending in [1_000, 100_000] {
        bench(&format!("queue hold, {pending} pending"), || {
            queue_hold(pending, 10_000_000)
        });
        bench(&format!("std BinaryHeap hold, {pending} pending"), || {
            heap_hold(pending, 10_000_000)
        });
    }

    for strategy in [Strategy::Fixed, Strategy::Exponential, Strategy::Full] {
        let cfg = storm::StormConfig {
            clients: 2_000_000,
            strategies: vec![strategy],
            ..storm::StormConfig::default()
        };
        bench(&format!("storm {strategy}, 2M clients × 4"), || {
            storm::run(&cfg, &mut NoProgress).ok().map(|r| r.events)
        });
    }

    let cfg = occ::OccConfig {
        runs: 200,
        strategies: vec![Strategy::Full],
        ..occ::OccConfig::default()
    };
    bench("occ, 100 clients × 200 runs, full jitter", || {
        occ::run(&cfg, &mut NoProgress).ok().map(|r| r.events)
    });

    for kind in [BudgetKind::None, BudgetKind::Grpc, BudgetKind::Ratio] {
        let cfg = budget::BudgetConfig {
            rate: 100_000.0,
            duration: Duration::from_secs(20),
            kinds: vec![kind],
            ..budget::BudgetConfig::default()
        };
        bench(&format!("budget {kind}, 100k/s × 20 s"), || {
            budget::run(&cfg, &mut NoProgress).ok().map(|r| r.events)
        });
    }

    let cfg = overload::OverloadConfig {
        rate: 28_000.0,
        capacity: 30_000.0,
        protections: vec![overload::Protection::None],
        ..overload::OverloadConfig::default()
    };
    bench("overload none, 28k/s against 30k/s, 60 s", || {
        overload::run(&cfg, &mut NoProgress).ok().map(|r| r.events)
    });

    for mode in [chain::ChainMode::EveryLayer, chain::ChainMode::Budget] {
        let cfg = chain::ChainConfig {
            duration: Duration::from_secs(20),
            modes: vec![mode],
            ..chain::ChainConfig::default()
        };
        bench(
            &format!("chain {}, 3 × 2 retries, 200k entries", mode.name()),
            || chain::run(&cfg, &mut NoProgress).ok().map(|r| r.events),
        );
    }
}
