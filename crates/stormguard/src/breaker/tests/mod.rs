use super::*;
use crate::classify::Outcome;
use crate::clock::{Clock, ManualClock};
use crate::health::{HealthConfig, HealthWindow, WindowKind};
use proptest::prelude::*;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

#[derive(Debug, Default)]
struct Events {
    changes: Mutex<Vec<StateChange>>,
    rejected: Mutex<Vec<BreakerOpen>>,
}

impl Events {
    fn changes(&self) -> Vec<StateChange> {
        self.changes.lock().expect("must succeed").clone()
    }
    fn transitions(&self) -> Vec<(BreakerState, BreakerState, Cause)> {
        self.changes()
            .iter()
            .map(|c| (c.from, c.to, c.cause))
            .collect()
    }
    fn last_open_for(&self) -> Duration {
        self.changes()
            .iter()
            .rev()
            .find_map(|c| c.open_for)
            .expect("must succeed")
    }
}

impl BreakerObserver for Events {
    fn state_changed(&self, change: &StateChange) {
        self.changes.lock().expect("must succeed").push(*change);
    }
    fn call_rejected(&self, rejected: &BreakerOpen) {
        self.rejected.lock().expect("must succeed").push(*rejected);
    }
}

fn small(calls: u32) -> BreakerConfig {
    BreakerConfig::new(HealthConfig::count(calls))
        .with_minimum_throughput(calls)
        .with_failure_ratio(0.5)
        .with_open_duration(Duration::from_secs(10))
        .with_permitted_probes(2)
}

fn breaker(
    config: BreakerConfig,
    clock: &ManualClock,
) -> (CircuitBreaker<Arc<Events>>, Arc<Events>) {
    let events = Arc::new(Events::default());
    let b = CircuitBreaker::new(config, clock.clock())
        .expect("must succeed")
        .with_seed(7)
        .with_observer(Arc::clone(&events));
    (b, events)
}

fn call<O: BreakerObserver>(b: &CircuitBreaker<O>, outcome: Outcome) {
    b.try_acquire().expect("must succeed").record(outcome, MS);
}

fn trip<O: BreakerObserver>(b: &CircuitBreaker<O>, calls: u32) {
    for _ in 0..calls {
        call(b, Outcome::Retryable);
    }
    assert_eq!(b.state(), BreakerState::Open);
}

#[test]
fn presets_are_valid_and_carry_their_sources_numbers() {
    for config in [
        BreakerConfig::resilience4j_default(),
        BreakerConfig::polly_default(),
        BreakerConfig::seeds_default(),
    ] {
        config.validate().expect("must succeed");
    }
    let r = CircuitBreaker::resilience4j_default();
    let c = r.config();
    assert_eq!(
        (
            c.failure_ratio(),
            c.slow_call_ratio(),
            c.minimum_throughput()
        ),
        (0.5, 1.0, 100)
    );
    assert_eq!(c.window().kind(), WindowKind::Count { calls: 100 });
    assert_eq!(
        c.window().slow_call_threshold(),
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        (c.open_duration(), c.permitted_probes()),
        (Duration::from_secs(60), 10)
    );

    let p = CircuitBreaker::polly_default();
    let c = p.config();
    assert_eq!((c.failure_ratio(), c.minimum_throughput()), (0.1, 100));
    assert_eq!(
        c.window().kind(),
        WindowKind::Time {
            length: Duration::from_secs(30),
            buckets: 10
        }
    );
    assert_eq!(c.open_duration(), Duration::from_secs(5));

    let s = CircuitBreaker::seeds_default();
    assert_eq!(s.config().comparison, Comparison::Above);
    assert_eq!(s.state(), BreakerState::Closed);
}

#[test]
fn every_bad_field_is_named() {
    let base = small(10);
    let cases = [
        (base.with_failure_ratio(f64::NAN), "breaker.failure_ratio"),
        (base.with_failure_ratio(1.01), "breaker.failure_ratio"),
        (base.with_slow_call_ratio(-0.1), "breaker.slow_call_ratio"),
        (base.with_jitter(2.0), "breaker.jitter"),
        (
            base.with_minimum_throughput(0),
            "breaker.minimum_throughput",
        ),
        (
            base.with_minimum_throughput(11),
            "breaker.minimum_throughput",
        ),
        (
            base.with_open_duration(Duration::from_micros(10)),
            "breaker.open_duration",
        ),
        (
            base.with_growth(2.0, Duration::from_secs(1)),
            "breaker.max_open_duration",
        ),
        (
            base.with_growth(0.5, Duration::from_secs(60)),
            "breaker.growth",
        ),
        (
            base.with_growth(f64::INFINITY, Duration::from_secs(60)),
            "breaker.growth",
        ),
        (base.with_permitted_probes(0), "breaker.permitted_probes"),
        (base.with_window(HealthConfig::count(0)), "window.calls"),
    ];
    for (config, field) in cases {
        assert_eq!(
            config.validate().expect_err("must fail").field,
            field,
            "{config:?}"
        );
        let err = CircuitBreaker::new(config, ManualClock::new().clock()).expect_err("must fail");
        assert_eq!(err.field, field);
    }
    // A shared window: its own size bounds the minimum throughput.
    let window =
        Arc::new(HealthWindow::new(HealthConfig::count(5), Clock::system()).expect("must succeed"));
    let err = CircuitBreaker::with_window(small(10), window).expect_err("must fail");
    assert_eq!(err.field, "breaker.minimum_throughput");
}

#[test]
fn open_lasts_exactly_the_open_duration() {
    let clock = ManualClock::new();
    let (b, events) = breaker(small(4), &clock);
    call(&b, Outcome::Success);
    call(&b, Outcome::Success);
    call(&b, Outcome::Retryable);
    assert_eq!(b.state(), BreakerState::Closed);
    call(&b, Outcome::Retryable);
    assert_eq!(b.state(), BreakerState::Open);
    let opened = events.changes()[0];
    assert_eq!(opened.cause, Cause::FailureRatio);
    assert_eq!(opened.open_for, Some(Duration::from_secs(10)));
    assert_eq!(opened.counts.expect("must succeed").failures, 2);

    clock.advance(Duration::from_millis(9_999));
    let err = b.try_acquire().expect_err("must fail");
    assert_eq!(
        err,
        BreakerOpen {
            retry_after: MS,
            reason: Rejection::Open
        }
    );
    assert_eq!(events.rejected.lock().expect("must succeed").len(), 1);
    clock.advance(MS);
    let probe = b.try_acquire().expect("must succeed");
    assert!(probe.is_probe());
    assert_eq!(b.state(), BreakerState::HalfOpen);
    drop(probe);
}

#[test]
fn probes_close_when_all_succeed() {
    let clock = ManualClock::new();
    let (b, events) = breaker(small(4), &clock);
    trip(&b, 4);
    clock.advance(Duration::from_secs(10));
    let p1 = b.try_acquire().expect("must succeed");
    let p2 = b.try_acquire().expect("must succeed");
    let busy = b.try_acquire().expect_err("must fail");
    assert_eq!(busy.reason, Rejection::ProbesBusy);
    p1.record(Outcome::Success, MS);
    assert_eq!(b.state(), BreakerState::HalfOpen);
    // Only two probes per half-open period, even after one finished.
    assert_eq!(
        b.try_acquire().expect_err("must fail").reason,
        Rejection::ProbesBusy
    );
    p2.record(Outcome::Success, MS);
    assert_eq!(b.state(), BreakerState::Closed);
    assert_eq!(b.window().snapshot().calls, 0, "closing clears the window");
    assert_eq!(
        events.transitions(),
        vec![
            (
                BreakerState::Closed,
                BreakerState::Open,
                Cause::FailureRatio
            ),
            (
                BreakerState::Open,
                BreakerState::HalfOpen,
                Cause::OpenElapsed
            ),
            (
                BreakerState::HalfOpen,
                BreakerState::Closed,
                Cause::ProbesSucceeded
            ),
        ]
    );
}

#[test]
fn any_failed_or_slow_probe_reopens() {
    for (outcome, elapsed) in [
        (Outcome::InDoubt, MS),
        (Outcome::Success, Duration::from_secs(3)),
    ] {
        let clock = ManualClock::new();
        let config = small(4)
            .with_window(HealthConfig::count(4).with_slow_call_threshold(Duration::from_secs(2)));
        let (b, events) = breaker(config, &clock);
        trip(&b, 4);
        clock.advance(Duration::from_secs(10));
        let p1 = b.try_acquire().expect("must succeed");
        let p2 = b.try_acquire().expect("must succeed");
        p1.record(Outcome::Success, MS);
        p2.record(outcome, elapsed);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(
            events.changes().last().expect("must succeed").cause,
            Cause::ProbeFailed
        );
    }
}

#[test]
fn abandoned_probe_returns_its_slot_and_stale_probes_do_not_count() {
    let clock = ManualClock::new();
    let (b, _events) = breaker(small(4).with_permitted_probes(1), &clock);
    trip(&b, 4);
    clock.advance(Duration::from_secs(10));
    drop(b.try_acquire().expect("must succeed"));
    let stale = b.try_acquire().expect("must succeed");
    assert!(stale.is_probe());
    // Force a new half-open period: isolate, reset, trip again.
    b.isolate();
    assert_eq!(
        b.try_acquire().expect_err("must fail").reason,
        Rejection::Isolated
    );
    b.reset();
    trip(&b, 4);
    clock.advance(Duration::from_secs(10));
    let current = b.try_acquire().expect("must succeed");
    // The stale probe's success is recorded in the window but does not close the breaker.
    stale.record(Outcome::Success, MS);
    assert_eq!(b.state(), BreakerState::HalfOpen);
    current.record(Outcome::Success, MS);
    assert_eq!(b.state(), BreakerState::Closed);
}

#[test]
fn calls_from_before_the_open_do_not_move_the_state() {
    let clock = ManualClock::new();
    let (b, _events) = breaker(small(4), &clock);
    let late = b.try_acquire().expect("must succeed");
    trip(&b, 4);
    late.record(Outcome::Success, MS);
    assert_eq!(b.state(), BreakerState::Open);
    // Dropping a closed-state permit never touches the probe count.
    let late = {
        b.reset();
        b.try_acquire().expect("must succeed")
    };
    trip(&b, 4);
    clock.advance(Duration::from_secs(10));
    let probe = b.try_acquire().expect("must succeed");
    drop(late);
    let _second = b.try_acquire().expect("must succeed");
    assert_eq!(
        b.try_acquire().expect_err("must fail").reason,
        Rejection::ProbesBusy
    );
    drop(probe);
}

#[test]
fn slow_call_ratio_opens() {
    let clock = ManualClock::new();
    let config = small(4)
        .with_window(HealthConfig::count(4).with_slow_call_threshold(Duration::from_secs(1)))
        .with_failure_ratio(1.0)
        .with_slow_call_ratio(0.75);
    let (b, events) = breaker(config, &clock);
    for _ in 0..3 {
        b.try_acquire()
            .expect("must succeed")
            .record(Outcome::Success, Duration::from_secs(2));
    }
    call(&b, Outcome::Success);
    assert_eq!(b.state(), BreakerState::Open);
    assert_eq!(events.changes()[0].cause, Cause::SlowCallRatio);
}

#[test]
fn never_retry_does_not_open_by_default_and_above_is_strict() {
    let clock = ManualClock::new();
    let (b, _e) = breaker(small(4), &clock);
    for _ in 0..8 {
        call(&b, Outcome::NeverRetry);
    }
    assert_eq!(b.state(), BreakerState::Closed);

    let (b, _e) = breaker(small(4).with_comparison(Comparison::Above), &clock);
    for o in [
        Outcome::Success,
        Outcome::Retryable,
        Outcome::Success,
        Outcome::Retryable,
    ] {
        call(&b, o);
    }
    assert_eq!(
        b.state(),
        BreakerState::Closed,
        "50 % is not more than 50 %"
    );
    call(&b, Outcome::Retryable); // window: R S R R = 75 %
    assert_eq!(b.state(), BreakerState::Open);
}

#[test]
fn growth_is_capped_and_resets_on_close() {
    let clock = ManualClock::new();
    let config = small(4)
        .with_open_duration(Duration::from_secs(1))
        .with_growth(2.0, Duration::from_secs(5))
        .with_permitted_probes(1);
    let (b, events) = breaker(config, &clock);
    trip(&b, 4);
    let mut seen = vec![events.last_open_for()];
    for _ in 0..4 {
        clock.advance(events.last_open_for());
        b.try_acquire()
            .expect("must succeed")
            .record(Outcome::Retryable, MS);
        seen.push(events.last_open_for());
    }
    let secs = |s| Duration::from_secs(s);
    assert_eq!(seen, vec![secs(1), secs(2), secs(4), secs(5), secs(5)]);
    clock.advance(secs(5));
    b.try_acquire()
        .expect("must succeed")
        .record(Outcome::Success, MS);
    assert_eq!(b.state(), BreakerState::Closed);
    trip(&b, 4);
    assert_eq!(events.last_open_for(), secs(1));
}

#[test]
fn jitter_stays_within_bounds_and_varies() {
    let clock = ManualClock::new();
    let config = small(4)
        .with_open_duration(Duration::from_secs(10))
        .with_growth(1.5, Duration::from_secs(20))
        .with_jitter(0.25)
        .with_permitted_probes(1);
    for seed in 0..20 {
        let events = Arc::new(Events::default());
        let b = CircuitBreaker::new(config, clock.clock())
            .expect("must succeed")
            .with_seed(seed)
            .with_observer(Arc::clone(&events));
        trip(&b, 4);
        let mut base = 10_000.0_f64;
        let mut durations = Vec::new();
        for _ in 0..6 {
            let d = events.last_open_for();
            let ms = d.as_millis() as f64;
            assert!(
                ms >= (base * 0.75).floor() && ms <= (base * 1.25).min(20_000.0),
                "{ms} vs {base}"
            );
            assert!(d <= Duration::from_secs(20));
            durations.push(d);
            clock.advance(d);
            b.try_acquire()
                .expect("must succeed")
                .record(Outcome::Retryable, MS);
            base = (base * 1.5).min(20_000.0);
        }
        let distinct: std::collections::HashSet<_> = durations.iter().collect();
        assert!(
            distinct.len() > 1,
            "jitter varies between opens: {durations:?}"
        );
    }
    // Different seeds give different first durations.
    let firsts: std::collections::HashSet<_> = (0..10)
        .map(|seed| {
            let events = Arc::new(Events::default());
            let b = CircuitBreaker::new(config, clock.clock())
                .expect("must succeed")
                .with_seed(seed)
                .with_observer(Arc::clone(&events));
            trip(&b, 4);
            events.last_open_for()
        })
        .collect();
    assert!(firsts.len() > 1);
}

#[test]
fn time_window_breaker_forgets_old_failures() {
    let clock = ManualClock::new();
    let config = BreakerConfig::seeds_default();
    let (b, _e) = breaker(config, &clock);
    for _ in 0..15 {
        call(&b, Outcome::Retryable);
    }
    clock.advance(Duration::from_secs(11));
    for _ in 0..20 {
        call(&b, Outcome::Success);
    }
    for _ in 0..19 {
        call(&b, Outcome::Retryable);
    }
    assert_eq!(
        b.state(),
        BreakerState::Closed,
        "19 of 39 is not more than half"
    );
    call(&b, Outcome::Retryable);
    call(&b, Outcome::Retryable);
    assert_eq!(b.state(), BreakerState::Open, "21 of 41 is");
}

#[test]
fn many_threads_open_once_and_admit_exactly_the_probes() {
    const THREADS: usize = 8;
    let clock = ManualClock::new();
    let config = BreakerConfig::new(HealthConfig::count(50))
        .with_minimum_throughput(50)
        .with_failure_ratio(0.5)
        .with_open_duration(Duration::from_secs(1))
        .with_permitted_probes(5);
    let (b, events) = breaker(config, &clock);
    let b = Arc::new(b);
    // Phase 1: everybody fails until rejected.
    let admitted: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let b = &b;
                s.spawn(move || {
                    let mut n = 0;
                    while let Ok(p) = b.try_acquire() {
                        p.record(Outcome::Retryable, MS);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("must succeed"))
            .sum()
    });
    assert_eq!(b.state(), BreakerState::Open);
    assert!(admitted >= 50, "{admitted}");
    assert_eq!(b.window().snapshot().calls, 50.min(admitted));
    assert_eq!(events.transitions().len(), 1, "opened exactly once");

    // Phase 2: open duration over; everybody tries to probe at once, holding the permit.
    clock.advance(Duration::from_secs(1));
    let barrier = std::sync::Barrier::new(THREADS);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let (b, barrier) = (&b, &barrier);
                s.spawn(move || {
                    let mut held = Vec::new();
                    for _ in 0..10 {
                        if let Ok(p) = b.try_acquire() {
                            assert!(p.is_probe());
                            held.push(p);
                        }
                    }
                    let n = held.len();
                    barrier.wait();
                    for p in held {
                        p.record(Outcome::Success, MS);
                    }
                    n
                })
            })
            .collect();
        let probes: usize = handles
            .into_iter()
            .map(|h| h.join().expect("must succeed"))
            .sum();
        assert_eq!(probes, 5);
    });
    assert_eq!(b.state(), BreakerState::Closed);
    assert_eq!(
        events.transitions()[1..],
        [
            (
                BreakerState::Open,
                BreakerState::HalfOpen,
                Cause::OpenElapsed
            ),
            (
                BreakerState::HalfOpen,
                BreakerState::Closed,
                Cause::ProbesSucceeded
            ),
        ]
    );
}

#[test]
fn failures_recorded_by_another_policy_count_at_the_next_call() {
    let clock = ManualClock::new();
    let window = Arc::new(
        HealthWindow::new(
            HealthConfig::time(Duration::from_secs(10), 10),
            clock.clock(),
        )
        .expect("must succeed"),
    );
    let b = CircuitBreaker::with_window(small(4), Arc::clone(&window)).expect("must succeed");
    // Healthy calls through the breaker: the fast path is armed.
    call(&b, Outcome::Success);
    call(&b, Outcome::Success);
    // Another user of the same window (a hedger, say) records failures directly.
    for _ in 0..3 {
        window.record(Outcome::Retryable, MS);
    }
    assert_eq!(
        b.state(),
        BreakerState::Closed,
        "the breaker decides on its own calls"
    );
    // The next call, a healthy one, sees 3 failures in 6 calls: 50 % opens it.
    call(&b, Outcome::Success);
    assert_eq!(b.state(), BreakerState::Open);
}

#[test]
fn owned_permits_record_and_abandon_like_borrowed_ones() {
    let clock = ManualClock::new();
    let (b, _events) = breaker(small(4).with_permitted_probes(1), &clock);
    let b = Arc::new(b);
    for _ in 0..4 {
        b.try_acquire_owned()
            .expect("must succeed")
            .record(Outcome::Retryable, MS);
    }
    assert_eq!(b.state(), BreakerState::Open);
    clock.advance(Duration::from_secs(10));
    let probe = b.try_acquire_owned().expect("must succeed");
    assert!(probe.is_probe());
    assert!(Arc::ptr_eq(probe.breaker(), &b));
    assert_eq!(
        b.try_acquire_owned().expect_err("must fail").reason,
        Rejection::ProbesBusy
    );
    drop(probe);
    let probe = std::thread::spawn({
        let b = Arc::clone(&b);
        move || b.try_acquire_owned().expect("the slot came back")
    })
    .join()
    .expect("must succeed");
    probe.record(Outcome::Success, MS);
    assert_eq!(b.state(), BreakerState::Closed);
}

#[test]
fn breaker_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CircuitBreaker>();
    assert_send_sync::<CircuitBreaker<Arc<dyn BreakerObserver>>>();
    assert_send_sync::<Permit<'static>>();
    assert_send_sync::<OwnedPermit>();
}

/// The property tests: random calls against a model of the thresholds.
mod props;
