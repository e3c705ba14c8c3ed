use std::time::Duration;

use super::*;
use crate::clock::ManualClock;

fn limiter(config: LimiterConfig) -> (ManualClock, Limiter) {
    let manual = ManualClock::new();
    let limiter = Limiter::new(config, &manual.clock()).expect("valid");
    (manual, limiter)
}

#[test]
fn every_bad_field_is_named() {
    let cases: [(LimiterConfig, &str); 12] = [
        (
            LimiterConfig::new(Aimd::new().with_limits(0, 1, 2)),
            "limit.aimd.min",
        ),
        (
            LimiterConfig::new(Aimd::new().with_limits(5, 4, 10)),
            "limit.aimd.initial",
        ),
        (
            LimiterConfig::new(Aimd::new().with_backoff_ratio(1.0)),
            "limit.aimd.backoff_ratio",
        ),
        (
            LimiterConfig::new(Aimd::new().with_timeout(Duration::ZERO)),
            "limit.aimd.timeout",
        ),
        (
            LimiterConfig::new(Vegas::new().with_limits(1, 20, 10)),
            "limit.vegas.max",
        ),
        (
            LimiterConfig::new(Vegas::new().with_smoothing(f64::NAN)),
            "limit.vegas.smoothing",
        ),
        (
            LimiterConfig::new(Vegas::new().with_tolerance(0.9)),
            "limit.vegas.tolerance",
        ),
        (
            LimiterConfig::new(Vegas::new().with_tolerance(f64::NAN)),
            "limit.vegas.tolerance",
        ),
        (
            LimiterConfig::new(Vegas::new().with_tolerance(1e6)),
            "limit.vegas.tolerance",
        ),
        (
            LimiterConfig::new(Gradient2::new().with_tolerance(0.9)),
            "limit.gradient2.tolerance",
        ),
        (
            LimiterConfig::default().with_window(Duration::ZERO, 1),
            "limit.window",
        ),
        (
            LimiterConfig::default().with_partitions(vec![0.5, -0.1]),
            "limit.partitions",
        ),
    ];
    for (config, field) in cases {
        let err = Limiter::new(config.clone(), &ManualClock::new().clock()).expect_err("bad");
        assert_eq!(err.field, field, "{config:?}");
    }
}

#[test]
fn admits_up_to_the_limit_and_releases() {
    let (manual, l) = limiter(LimiterConfig::new(Aimd::new().with_limits(3, 3, 10)));
    let now = manual.clock().now();
    let tickets: Vec<_> = (0..3)
        .map(|_| l.try_acquire(0, now).expect("room"))
        .collect();
    assert_eq!(
        l.try_acquire(0, now).expect_err("full"),
        LimitExceeded {
            limit: 3,
            in_flight: 3
        }
    );
    let mut tickets = tickets.into_iter();
    if let Some(t) = tickets.next() {
        l.forget(t);
    }
    let t = l.try_acquire(0, now).expect("a slot was given back");
    l.release(t, now, Outcome::Success);
    for t in tickets {
        l.release(t, now, Outcome::Success);
    }
    assert_eq!(l.in_flight(), 0);
}

#[test]
fn a_partition_under_its_share_is_admitted_at_the_limit() {
    let config =
        LimiterConfig::new(Aimd::new().with_limits(10, 10, 10)).with_partitions(vec![0.8, 0.2]);
    let (manual, l) = limiter(config);
    let now = manual.clock().now();
    // Free traffic borrows the whole limit while paying traffic is idle...
    let free: Vec<_> = (0..10)
        .map(|_| l.try_acquire(1, now).expect("borrowed"))
        .collect();
    assert!(l.try_acquire(1, now).is_err());
    // ...and paying traffic still gets its 80 % share.
    let paying: Vec<_> = (0..8)
        .map(|_| l.try_acquire(0, now).expect("guaranteed"))
        .collect();
    assert!(l.try_acquire(0, now).is_err());
    assert_eq!(
        (l.partition_in_flight(0), l.partition_in_flight(1)),
        (8, 10)
    );
    for t in free.into_iter().chain(paying) {
        l.forget(t);
    }
    assert_eq!(l.in_flight(), 0);
}

#[test]
fn aimd_backs_off_on_drops_and_grows_while_used() {
    let (manual, l) = limiter(
        LimiterConfig::new(Aimd::new().with_limits(2, 20, 100))
            .with_window(Duration::from_millis(100), 1),
    );
    let clock = manual.clock();
    let t = l.try_acquire(0, clock.now()).expect("room");
    manual.advance(Duration::from_millis(150));
    l.release(t, clock.now(), Outcome::InDoubt);
    assert_eq!(l.limit(), 18);
    // Used at least half: +1 per window.
    let tickets: Vec<_> = (0..10)
        .map(|_| l.try_acquire(0, clock.now()).expect("room"))
        .collect();
    manual.advance(Duration::from_millis(150));
    for t in tickets {
        l.release(t, clock.now(), Outcome::Success);
    }
    assert_eq!(l.limit(), 19);
    assert_eq!(l.expected_rtt(), Some(Duration::from_millis(150)));
}

// How the algorithms follow a handler that gets twice slower, on a simulated server under
// the virtual (manual) clock: `stormguard-sim`'s `converge` scenario and its tests.

#[test]
fn a_window_adds_up_the_samples_of_every_releasing_thread() {
    let (manual, l) = limiter(LimiterConfig::new(Aimd::new().with_limits(30, 30, 30)));
    let clock = manual.clock();
    let mut tickets: Vec<_> = (0..21)
        .map(|_| l.try_acquire(0, clock.now()).expect("room"))
        .collect();
    let start = clock.now();
    let release_on_a_thread = |tickets: Vec<Ticket>, after: Duration| {
        std::thread::scope(|s| {
            s.spawn(|| {
                for t in tickets {
                    l.release(t, start + after, Outcome::Success);
                }
            });
        });
    };
    release_on_a_thread(tickets.drain(..10).collect(), Duration::from_millis(10));
    release_on_a_thread(tickets.drain(..10).collect(), Duration::from_millis(30));
    assert_eq!(l.expected_rtt(), None, "the window is still open");
    manual.advance(Duration::from_millis(200));
    for t in tickets {
        l.release(t, clock.now(), Outcome::Success);
    }
    // (10 × 10 ms + 10 × 30 ms + 200 ms) / 21, from three threads' shards.
    assert_eq!(
        l.expected_rtt(),
        Some(Duration::from_nanos(600_000_000 / 21))
    );
    assert_eq!(l.in_flight(), 0);
}

/// One worker behind a Vegas limit of 4: each window's requests wait for three others, so
/// the mean RTT is 2.5 times the no-load RTT. Vegas's request-count thresholds alone keep 4
/// (the estimated queue of 3 is under `6·log10(4)`); the tolerance of 2 cuts it to
/// `4 × 2 / 2.5 = 3.2`, and a window within the tolerance then leaves it there.
#[test]
fn vegas_lowers_a_limit_whose_round_trips_exceed_the_tolerance() {
    let window = |rtt_ms: u64| WindowSample {
        rtt: Duration::from_millis(rtt_ms),
        min_rtt: Duration::from_millis(2),
        samples: 50,
        dropped: 0,
        max_in_flight: 4,
    };
    let mut plain = LimitAlgorithm::from(Vegas::new().with_limits(1, 4, 100).with_tolerance(100.0));
    assert_eq!(plain.update(&window(5)), 4);
    let mut vegas = LimitAlgorithm::from(Vegas::new().with_limits(1, 4, 100));
    assert_eq!(vegas.update(&window(5)), 3);
    assert_eq!(
        vegas.update(&WindowSample {
            max_in_flight: 3,
            ..window(4)
        }),
        3
    );
}

/// One very fast sample (a cache hit, an early error) makes the no-load RTT tiny and every
/// later window look hundreds of times too slow: the tolerance then halves the limit per
/// window at most, instead of taking it to its minimum at once.
#[test]
fn vegas_halves_at_most_per_window_after_a_fast_outlier() {
    let mut vegas = LimitAlgorithm::from(Vegas::new().with_limits(1, 20, 100));
    let outlier = WindowSample {
        rtt: Duration::from_millis(5),
        min_rtt: Duration::from_micros(5),
        samples: 50,
        dropped: 0,
        max_in_flight: 20,
    };
    assert_eq!(vegas.update(&outlier), 10);
    assert_eq!(
        vegas.update(&WindowSample {
            max_in_flight: 10,
            ..outlier
        }),
        5
    );
}
