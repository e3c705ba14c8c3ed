use super::*;
use crate::classify::Outcome;
use crate::clock::ManualClock;
use proptest::prelude::*;
use std::time::Duration;

fn outcome(i: u8) -> Outcome {
    match i % 5 {
        0 => Outcome::Success,
        1 => Outcome::Retryable,
        2 => Outcome::Overloaded { retry_after: None },
        3 => Outcome::InDoubt,
        _ => Outcome::NeverRetry,
    }
}

/// Records and reads the totals back.
fn rec(w: &HealthWindow, outcome: Outcome, elapsed: Duration) -> HealthCounts {
    w.record(outcome, elapsed);
    w.snapshot()
}

fn model_counts(config: &HealthConfig, calls: &[(Outcome, Duration)]) -> HealthCounts {
    let mut c = HealthCounts::default();
    for (o, e) in calls {
        c.calls += 1;
        match o {
            Outcome::Success => c.successes += 1,
            Outcome::Retryable => c.retryable += 1,
            Outcome::Overloaded { .. } => c.overloaded += 1,
            Outcome::InDoubt => c.in_doubt += 1,
            Outcome::NeverRetry => c.never_retry += 1,
        }
        let failure = match o {
            Outcome::Success => false,
            Outcome::NeverRetry => config.never_retry_is_failure(),
            _ => true,
        };
        c.failures += u64::from(failure);
        c.slow += u64::from(config.slow_call_threshold().is_some_and(|t| *e > t));
    }
    c
}

#[test]
fn validation_names_the_field() {
    let cases = [
        (HealthConfig::count(0), "window.calls", Problem::Zero),
        (
            HealthConfig::count(MAX_WINDOW_CALLS + 1),
            "window.calls",
            Problem::TooLarge(MAX_WINDOW_CALLS as u64),
        ),
        (
            HealthConfig::time(Duration::ZERO, 10),
            "window.length",
            Problem::Zero,
        ),
        (
            HealthConfig::time(Duration::from_micros(900), 1),
            "window.length",
            Problem::Zero,
        ),
        (
            HealthConfig::time(Duration::from_secs(1), 0),
            "window.buckets",
            Problem::Zero,
        ),
        (
            HealthConfig::time(Duration::from_millis(5), 6),
            "window.buckets",
            Problem::TooLarge(5),
        ),
    ];
    for (config, field, problem) in cases {
        let err = HealthWindow::new(config, ManualClock::new().clock()).expect_err("must fail");
        assert_eq!((err.field, err.problem), (field, problem), "{config:?}");
        assert!(err.to_string().contains(field));
    }
}

#[test]
fn never_retry_is_a_call_but_not_a_failure_by_default() {
    let clock = ManualClock::new();
    let w = HealthWindow::new(HealthConfig::count(10), clock.clock()).expect("must succeed");
    let c = rec(&w, Outcome::NeverRetry, Duration::ZERO);
    assert_eq!((c.calls, c.never_retry, c.failures), (1, 1, 0));
    let w = HealthWindow::new(
        HealthConfig::count(10).with_never_retry_as_failure(true),
        clock.clock(),
    )
    .expect("must succeed");
    assert_eq!(rec(&w, Outcome::NeverRetry, Duration::ZERO).failures, 1);
}

#[test]
fn slow_means_strictly_longer_than_the_threshold() {
    let config = HealthConfig::count(10).with_slow_call_threshold(Duration::from_secs(1));
    let w = HealthWindow::new(config, ManualClock::new().clock()).expect("must succeed");
    assert_eq!(rec(&w, Outcome::Success, Duration::from_secs(1)).slow, 0);
    assert_eq!(
        rec(&w, Outcome::InDoubt, Duration::from_millis(1001)).slow,
        1
    );
}

#[test]
fn time_window_evicts_whole_buckets() {
    let clock = ManualClock::new();
    let w = HealthWindow::new(
        HealthConfig::time(Duration::from_secs(10), 10),
        clock.clock(),
    )
    .expect("must succeed");
    rec(&w, Outcome::Retryable, Duration::ZERO); // bucket 0
    clock.advance(Duration::from_millis(9_999)); // bucket 9: bucket 0 still inside
    rec(&w, Outcome::Success, Duration::ZERO);
    assert_eq!(w.snapshot().calls, 2);
    clock.advance(Duration::from_millis(1)); // bucket 10: bucket 0 falls out
    assert_eq!(
        w.snapshot(),
        model_counts(w.config(), &[(Outcome::Success, Duration::ZERO)])
    );
    w.reset();
    assert_eq!(w.snapshot(), HealthCounts::default());
}

#[test]
fn window_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<HealthWindow>();
}

#[test]
fn time_window_counts_every_threads_calls_once() {
    const THREADS: usize = 4;
    const CALLS: usize = 1_000;
    let clock = ManualClock::new();
    let w = HealthWindow::new(
        HealthConfig::time(Duration::from_secs(10), 10),
        clock.clock(),
    )
    .expect("must succeed");
    let record_all = |w: &HealthWindow| {
        std::thread::scope(|s| {
            for t in 0..THREADS {
                s.spawn(move || {
                    for i in 0..CALLS {
                        w.record(outcome((i + t) as u8), Duration::from_millis(i as u64));
                    }
                });
            }
        })
    };
    record_all(&w);
    let all: Vec<_> = (0..THREADS)
        .flat_map(|t| {
            (0..CALLS).map(move |i| (outcome((i + t) as u8), Duration::from_millis(i as u64)))
        })
        .collect();
    let mut expected = model_counts(w.config(), &all);
    assert_eq!(w.snapshot(), expected);
    assert_eq!(w.latency_snapshot().calls(), (THREADS * CALLS) as u64);

    // A new bucket: only this thread moves its shard into the history; the others' stay
    // live in their shards. Nothing is counted twice or lost.
    clock.advance(Duration::from_secs(1));
    w.record(Outcome::Success, Duration::ZERO);
    expected.add(&model_counts(
        w.config(),
        &[(Outcome::Success, Duration::ZERO)],
    ));
    assert_eq!(w.snapshot(), expected);

    // A reset forgets every thread's counts, and new records count from zero.
    w.reset();
    assert_eq!(w.snapshot(), HealthCounts::default());
    assert_eq!(w.latency_percentile(0.5), None);
    record_all(&w);
    assert_eq!(w.snapshot().calls, (THREADS * CALLS) as u64);

    clock.advance(Duration::from_secs(10));
    assert_eq!(w.snapshot(), HealthCounts::default());
}

#[test]
fn percentiles_cover_the_live_calls_only() {
    let clock = ManualClock::new();
    let w = HealthWindow::new(HealthConfig::time(Duration::from_secs(2), 2), clock.clock())
        .expect("must succeed");
    for _ in 0..10 {
        w.record(Outcome::Success, Duration::from_secs(5));
    }
    clock.advance(Duration::from_secs(1));
    for _ in 0..90 {
        w.record(Outcome::Success, Duration::from_millis(1));
    }
    let p50 = w.latency_percentile(0.5).expect("calls");
    assert!(p50 >= Duration::from_millis(1) && p50 < Duration::from_micros(1_250));
    let p95 = w.latency_percentile(0.95).expect("calls");
    assert!(p95 >= Duration::from_secs(5) && p95 < Duration::from_millis(6_250));
    clock.advance(Duration::from_secs(1));
    // The slow bucket has left the window.
    let p95 = w.latency_percentile(0.95).expect("calls");
    assert!(p95 < Duration::from_micros(1_250));
    assert_eq!(w.latency_percentile(f64::NAN), None);
}

proptest! {
    #[test]
    fn count_window_matches_the_last_n_calls(
        size in 1u32..20,
        never_retry_fails: bool,
        calls in prop::collection::vec((0u8..5, 0u64..2000), 0..200),
    ) {
        let config = HealthConfig::count(size)
            .with_slow_call_threshold(Duration::from_secs(1))
            .with_never_retry_as_failure(never_retry_fails);
        let w = HealthWindow::new(config, ManualClock::new().clock()).expect("must succeed");
        let mut seen = Vec::new();
        for (o, ms) in calls {
            let call = (outcome(o), Duration::from_millis(ms));
            seen.push(call);
            let got = rec(&w, call.0, call.1);
            let start = seen.len().saturating_sub(size as usize);
            prop_assert_eq!(got, model_counts(&config, &seen[start..]));
        }
    }

    /// Percentiles over a time window agree with the exact percentile of the live calls,
    /// to bucket precision, whatever the sequence of records and clock moves.
    #[test]
    fn time_window_percentiles_match_the_live_calls(
        steps in prop::collection::vec((0u64..3_000_000, 0u64..400), 1..150),
        q in 0.0f64..=1.0,
    ) {
        let clock = ManualClock::new();
        let (bucket_ms, buckets) = (250u64, 4u64);
        let config = HealthConfig::time(Duration::from_millis(bucket_ms * buckets), 4);
        let w = HealthWindow::new(config, clock.clock()).expect("must succeed");
        let mut seen: Vec<(u64, u64)> = Vec::new();
        for (micros, advance) in steps {
            clock.advance(Duration::from_millis(advance));
            let now = clock.elapsed().as_millis() as u64;
            w.record(Outcome::Success, Duration::from_micros(micros));
            seen.push((now, micros));
        }
        let now = clock.elapsed().as_millis() as u64;
        let mut live: Vec<u64> = seen
            .iter()
            .filter(|(t, _)| now / bucket_ms - t / bucket_ms < buckets)
            .map(|(_, m)| *m)
            .collect();
        live.sort_unstable();
        let got = w.latency_percentile(q);
        if live.is_empty() {
            prop_assert_eq!(got, None);
        } else {
            let rank = ((q * live.len() as f64).ceil() as usize).clamp(1, live.len());
            let exact = live[rank - 1];
            let got = got.expect("calls").as_micros() as u64;
            prop_assert!(got >= exact && got <= exact + exact / 4 + 1, "{} vs {}", got, exact);
        }
    }

    #[test]
    fn time_window_matches_the_calls_in_live_buckets(
        buckets in 1u32..8,
        bucket_ms in 1u64..50,
        steps in prop::collection::vec((0u8..5, 0u64..60), 0..200),
    ) {
        let clock = ManualClock::new();
        let config = HealthConfig::time(Duration::from_millis(bucket_ms * u64::from(buckets)), buckets);
        let w = HealthWindow::new(config, clock.clock()).expect("must succeed");
        let mut seen: Vec<(u64, Outcome)> = Vec::new();
        for (o, advance) in steps {
            clock.advance(Duration::from_millis(advance));
            let now = clock.elapsed().as_millis() as u64;
            seen.push((now, outcome(o)));
            let got = rec(&w, outcome(o), Duration::ZERO);
            let current = now / bucket_ms;
            let live: Vec<_> = seen
                .iter()
                .filter(|(t, _)| current - t / bucket_ms < u64::from(buckets))
                .map(|(_, o)| (*o, Duration::ZERO))
                .collect();
            prop_assert_eq!(got, model_counts(&config, &live));
        }
    }
}
