//! Adaptive throttling at 10x overload, on a virtual clock: a backend that can accept `C`
//! requests per second, clients offering `10·C` per second. In steady state the backend must
//! see about `K·C` requests per second (±5 %) — the property Google's SRE book gives the
//! formula for — for `K = 2` and `K = 1.1`; and a backend that keeps up is never throttled.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use stormguard::classify::Outcome;
use stormguard::clock::ManualClock;
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};

/// The backend accepts this many requests per second and refuses the rest.
const CAPACITY: u64 = 100;
/// Simulated time: 10 minutes; the rate is measured over the last 5 (the window is 2).
const RUN_SECS: u64 = 600;
const MEASURE_FROM_SECS: u64 = 300;

/// What the backend received per second, on average, over the measured span; and how many
/// requests the throttle rejected in total.
fn steady_state_rate(config: ThrottleConfig, offered_per_sec: u64, seed: u64) -> (f64, u64) {
    let clock = ManualClock::new();
    let throttle = AdaptiveThrottle::new(config, clock.clock())
        .unwrap()
        .with_seed(seed);
    let gap = Duration::from_nanos(1_000_000_000 / offered_per_sec);
    let (mut received, mut rejected) = (0u64, 0u64);
    for second in 0..RUN_SECS {
        let mut accepted_this_second = 0;
        for _ in 0..offered_per_sec {
            clock.advance(gap);
            if throttle.try_acquire().is_err() {
                rejected += 1;
                continue;
            }
            if second >= MEASURE_FROM_SECS {
                received += 1;
            }
            if accepted_this_second < CAPACITY {
                accepted_this_second += 1;
                throttle.record(Outcome::Success);
            } else {
                throttle.record(Outcome::Overloaded { retry_after: None });
            }
        }
    }
    (
        received as f64 / (RUN_SECS - MEASURE_FROM_SECS) as f64,
        rejected,
    )
}

fn assert_backend_sees_k_times_capacity(config: ThrottleConfig) {
    let k = config.k();
    for seed in [1, 2, 3] {
        let (rate, _) = steady_state_rate(config, 10 * CAPACITY, seed);
        let expected = k * CAPACITY as f64;
        eprintln!("K = {k}: backend received {rate:.1}/s, expected {expected:.1}/s");
        assert!(
            (rate - expected).abs() <= 0.05 * expected,
            "K = {k}, seed {seed}: backend received {rate:.1}/s, expected {expected:.1}/s ± 5 %"
        );
    }
}

#[test]
fn at_10x_overload_the_backend_sees_twice_its_capacity_with_k_2() {
    assert_backend_sees_k_times_capacity(ThrottleConfig::sre_default());
}

#[test]
fn at_10x_overload_the_backend_sees_1_1_times_its_capacity_with_k_1_1() {
    assert_backend_sees_k_times_capacity(ThrottleConfig::aggressive());
}

#[test]
fn a_backend_with_room_to_spare_is_never_throttled() {
    let (rate, rejected) = steady_state_rate(ThrottleConfig::aggressive(), CAPACITY / 2, 1);
    assert_eq!(rejected, 0);
    assert_eq!(rate, (CAPACITY / 2) as f64);
}
