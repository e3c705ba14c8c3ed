//! The fault injector: seeded rates (exact for a seed, close over many calls), switching at
//! run time, latency distributions drawn under tokio's paused clock, and config validation
//! that never panics.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use stormguard::classify::{Classify, Outcome};
use stormguard::fault::{Abort, FaultConfig, FaultInjector, InvalidFault, Latency};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);

fn injector(config: FaultConfig) -> FaultInjector {
    FaultInjector::new(config).unwrap()
}

/// Counts (delayed, aborted) over `n` draws.
fn tally(injector: &FaultInjector, n: u32) -> (u32, u32) {
    (0..n).fold((0, 0), |(d, a), _| {
        let i = injector.draw();
        (
            d + u32::from(!i.delay.is_zero()),
            a + u32::from(i.abort.is_some()),
        )
    })
}

#[test]
fn rates_are_exact_for_a_seed_and_close_over_many_draws() {
    let config = FaultConfig::new(7)
        .with_latency(0.1, Latency::Fixed(5 * MS))
        .with_abort(0.2, Abort::Reset);
    // Exact for the seed: the same 1000 calls fault the same way on every run.
    let first = tally(&injector(config), 1000);
    assert_eq!(first, tally(&injector(config), 1000));
    assert_eq!(first, (115, 204));
    // A different seed draws a different sequence.
    assert_ne!(
        first,
        tally(
            &injector(
                FaultConfig::new(8)
                    .with_latency(0.1, Latency::Fixed(5 * MS))
                    .with_abort(0.2, Abort::Reset)
            ),
            1000
        )
    );
    // Over many draws the shares are within 5 standard deviations of the rates.
    let n = 100_000;
    let many = injector(config);
    let (delayed, aborted) = tally(&many, n);
    assert!((9_525..=10_475).contains(&delayed), "delayed {delayed}");
    assert!((19_370..=20_630).contains(&aborted), "aborted {aborted}");
    let stats = many.stats();
    assert_eq!(
        (stats.calls, stats.delayed, stats.aborted),
        (u64::from(n), u64::from(delayed), u64::from(aborted))
    );
}

#[test]
fn rate_changes_apply_to_the_next_call_and_bad_rates_change_nothing() {
    let faults = injector(FaultConfig::new(3).with_abort(1.0, Abort::Reset));
    assert_eq!(tally(&faults, 100), (0, 100));
    faults.set_abort_rate(0.5).unwrap();
    let (_, half) = tally(&faults, 10_000);
    assert!((4_750..=5_250).contains(&half), "{half}");
    assert_eq!(
        faults.set_abort_rate(f64::NAN).unwrap_err().to_string(),
        "abort rate must be a number in 0.0..=1.0, got NaN"
    );
    assert!(faults.set_latency_rate(-0.1).is_err());
    assert_eq!(faults.abort_rate(), 0.5);
    assert_eq!(faults.latency_rate(), 0.0);
}

#[tokio::test(start_paused = true)]
async fn switching_at_run_time_and_aborts_skip_the_call() {
    let faults = Arc::new(injector(
        FaultConfig::new(1)
            .with_latency(1.0, Latency::Fixed(100 * MS))
            .with_abort(1.0, Abort::Reset)
            .with_enabled(false),
    ));
    let polled = Arc::new(AtomicBool::new(false));
    let call = |polled: Arc<AtomicBool>| async move {
        polled.store(true, Ordering::SeqCst);
        Ok::<u32, std::io::Error>(1)
    };

    // Disabled: no delay, the call runs, nothing is counted.
    let start = Instant::now();
    assert_eq!(faults.wrap(call(polled.clone())).await.unwrap(), 1);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(polled.swap(false, Ordering::SeqCst));
    assert_eq!(faults.stats().calls, 0);

    // Enabled: 100 ms, then a reset; the call itself is never polled.
    faults.enable();
    let start = Instant::now();
    let err = faults.wrap(call(polled.clone())).await.unwrap_err();
    assert_eq!(start.elapsed(), 100 * MS);
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    assert!(!polled.load(Ordering::SeqCst));
    assert_eq!(Abort::Reset.classify(), Outcome::InDoubt);

    // Aborts off, latency on: the call runs after the delay.
    faults.set_abort_rate(0.0).unwrap();
    let start = Instant::now();
    assert_eq!(faults.wrap(call(polled.clone())).await.unwrap(), 1);
    assert_eq!(start.elapsed(), 100 * MS);
    assert!(polled.load(Ordering::SeqCst));

    // Disabled again mid-traffic.
    faults.disable();
    let start = Instant::now();
    faults.wrap(call(polled.clone())).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn status_aborts_carry_their_retry_after() {
    let shed = Abort::Status {
        status: 503,
        retry_after: Some(2 * Duration::from_secs(1)),
    };
    let faults = injector(FaultConfig::new(1).with_abort(1.0, shed));
    let err: Abort = faults
        .wrap(async { Ok::<(), Abort>(()) })
        .await
        .unwrap_err();
    assert_eq!(err, shed);
    assert_eq!(
        err.classify(),
        Outcome::Overloaded {
            retry_after: Some(Duration::from_secs(2))
        }
    );
}

/// Wraps `n` calls one after another and returns each call's virtual duration.
async fn durations(faults: &FaultInjector, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        faults.wrap(async { Ok::<(), Abort>(()) }).await.unwrap();
        out.push(start.elapsed());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn latency_distributions_under_paused_time() {
    let fixed = injector(FaultConfig::new(1).with_latency(1.0, Latency::Fixed(42 * MS)));
    assert!(durations(&fixed, 10).await.iter().all(|d| *d == 42 * MS));

    let uniform = injector(FaultConfig::new(2).with_latency(
        1.0,
        Latency::Uniform {
            min: 10 * MS,
            max: 30 * MS,
        },
    ));
    let draws = durations(&uniform, 2000).await;
    // tokio's timer fires on whole milliseconds, so a draw of 29.4 ms sleeps 30 ms.
    assert!(draws.iter().all(|d| *d >= 10 * MS && *d <= 30 * MS));
    let low_half = draws.iter().filter(|d| **d < 20 * MS).count();
    assert!((900..=1100).contains(&low_half), "{low_half}");

    let bimodal = injector(FaultConfig::new(3).with_latency(
        1.0,
        Latency::Bimodal {
            fast: 10 * MS,
            slow: 500 * MS,
            slow_share: 0.05,
        },
    ));
    let draws = durations(&bimodal, 4000).await;
    let slow = draws.iter().filter(|d| **d == 500 * MS).count();
    let fast = draws.iter().filter(|d| **d == 10 * MS).count();
    assert_eq!(slow + fast, 4000);
    assert!((140..=260).contains(&slow), "{slow}");

    let exponential =
        injector(FaultConfig::new(4).with_latency(1.0, Latency::Exponential { mean: 50 * MS }));
    let draws = durations(&exponential, 4000).await;
    let mean = draws.iter().sum::<Duration>() / 4000;
    assert!(mean > 45 * MS && mean < 55 * MS, "{mean:?}");

    // Half of the calls delayed: the others take no time at all.
    let half = injector(FaultConfig::new(5).with_latency(0.5, Latency::Fixed(MS)));
    let delayed = durations(&half, 2000)
        .await
        .iter()
        .filter(|d| !d.is_zero())
        .count();
    assert!((900..=1100).contains(&delayed), "{delayed}");
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..10_000).prop_map(Duration::from_millis),
        any::<u64>().prop_map(Duration::from_nanos),
        Just(Duration::MAX),
    ]
}

fn any_rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        0.0..=1.0f64,
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY)
    ]
}

fn any_latency() -> impl Strategy<Value = Latency> {
    prop_oneof![
        any_duration().prop_map(Latency::Fixed),
        (any_duration(), any_duration()).prop_map(|(min, max)| Latency::Uniform { min, max }),
        (any_duration(), any_duration(), any_rate()).prop_map(|(fast, slow, slow_share)| {
            Latency::Bimodal {
                fast,
                slow,
                slow_share,
            }
        }),
        any_duration().prop_map(|mean| Latency::Exponential { mean }),
    ]
}

fn any_abort() -> impl Strategy<Value = Abort> {
    prop_oneof![
        Just(Abort::Reset),
        (any::<u16>(), proptest::option::of(any_duration())).prop_map(|(status, retry_after)| {
            Abort::Status {
                status,
                retry_after,
            }
        }),
    ]
}

proptest! {
    #[test]
    fn validation_never_panics_and_valid_configs_draw(
        seed in any::<u64>(),
        latency_rate in any_rate(),
        latency in any_latency(),
        abort_rate in any_rate(),
        abort in any_abort(),
        new_rate in any_rate(),
    ) {
        let config = FaultConfig::new(seed)
            .with_latency(latency_rate, latency)
            .with_abort(abort_rate, abort);
        let rates_ok = (0.0..=1.0).contains(&latency_rate) && (0.0..=1.0).contains(&abort_rate);
        match FaultInjector::new(config) {
            Ok(faults) => {
                prop_assert!(rates_ok);
                for _ in 0..8 {
                    let _ = faults.draw();
                }
                let changed = faults.set_latency_rate(new_rate).is_ok();
                prop_assert_eq!(changed, (0.0..=1.0).contains(&new_rate));
                let _ = faults.draw();
            }
            Err(InvalidFault::Rate { .. }) => prop_assert!(!rates_ok),
            Err(e) => {
                prop_assert!(rates_ok);
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }

    #[test]
    fn sampling_never_panics_even_for_refused_parameters(latency in any_latency(), seed in any::<u64>()) {
        use rand::SeedableRng;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        for _ in 0..8 {
            let _ = latency.sample(&mut rng);
        }
    }

    #[test]
    fn valid_rates_round_trip_to_the_millionth(rate in 0.0..=1.0f64) {
        let faults = FaultInjector::new(FaultConfig::new(0).with_abort(rate, Abort::Reset)).unwrap();
        prop_assert!((faults.abort_rate() - rate).abs() <= 5e-7);
    }
}
