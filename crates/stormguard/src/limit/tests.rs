use std::time::{Duration, Instant};

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
/// (the estimated queue, `round(4 × (1 − 1 / 2.5)) = 2`, is between `3·log10(4)` and
/// `6·log10(4)`); the tolerance of 2 cuts it to
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
    let mut plain = LimitAlgorithm::from(
        Vegas::new()
            .with_limits(1, 4, 100)
            .with_tolerance(100.0)
            .with_slow_start(false),
    );
    assert_eq!(plain.update(&window(5)), 4);
    let mut vegas =
        LimitAlgorithm::from(Vegas::new().with_limits(1, 4, 100).with_slow_start(false));
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
    let mut vegas =
        LimitAlgorithm::from(Vegas::new().with_limits(1, 20, 100).with_slow_start(false));
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

/// A server of `workers` workers taking requests in arrival order, each `service` of work,
/// behind `limiter` and offered more than it can take: every slot the limiter gives is taken
/// at once. Runs for `length` of `manual`'s time; returns the limit after every release that
/// changed it, with the time since the start and the requests in flight just before.
fn saturate(
    manual: &ManualClock,
    limiter: &Limiter,
    workers: usize,
    service: Duration,
    length: Duration,
) -> Vec<(Duration, u32, u32)> {
    let server = Server {
        workers,
        work: |_| service,
        handoff: Duration::ZERO,
    };
    saturate_server(manual, limiter, server, length).trace
}

/// The server [`saturate_server`] drives: `workers` workers taking requests in arrival order;
/// the `k`-th admitted request needs `work(k)` of a worker and reaches one `handoff` after its
/// admission (the task wake-ups between a slot and the work, during which a worker without
/// a request waiting idles).
struct Server<W> {
    workers: usize,
    work: W,
    handoff: Duration,
}

/// What [`saturate_server`] saw.
struct Saturated {
    /// The limit after every release that changed it, with the time since the start and the
    /// requests in flight just before.
    trace: Vec<(Duration, u32, u32)>,
    /// The share of the workers' time spent working.
    busy: f64,
}

/// `server` behind `limiter`, offered more than it can take: every slot the limiter gives is
/// taken at once, for `length` of `manual`'s time.
fn saturate_server(
    manual: &ManualClock,
    limiter: &Limiter,
    mut server: Server<impl FnMut(u64) -> Duration>,
    length: Duration,
) -> Saturated {
    let clock = manual.clock();
    let start = clock.now();
    let mut free = vec![start; server.workers];
    let mut running: Vec<(Instant, Duration, Ticket)> = Vec::new();
    let mut trace = vec![(Duration::ZERO, limiter.limit(), 0)];
    let mut admitted = 0;
    let mut busy = Duration::ZERO;
    loop {
        let now = clock.now();
        while let Ok(ticket) = limiter.try_acquire(0, now) {
            let (w, at) = free
                .iter()
                .copied()
                .enumerate()
                .min_by_key(|&(_, at)| at)
                .expect("workers");
            let work = (server.work)(admitted);
            admitted += 1;
            let done = at.max(now + server.handoff) + work;
            free[w] = done;
            running.push((done, work, ticket));
        }
        let (next, _) = running
            .iter()
            .enumerate()
            .min_by_key(|(_, (done, _, _))| *done)
            .expect("in flight");
        let (done, work, ticket) = running.swap_remove(next);
        let end = start + length;
        if done > end {
            // What the unfinished requests had done by the end.
            for (done, work, _) in running.iter().chain([&(done, work, ticket)]) {
                busy += work.saturating_sub(*done - end);
            }
            return Saturated {
                trace,
                busy: busy.as_secs_f64() / (length.as_secs_f64() * server.workers as f64),
            };
        }
        busy += work;
        manual.advance(done - now);
        let in_flight = limiter.in_flight();
        let before = limiter.limit();
        limiter.release(ticket, done, Outcome::Success);
        if limiter.limit() != before {
            trace.push((done - start, limiter.limit(), in_flight));
        }
    }
}

/// The limit of `trace` at `at`.
fn limit_at(trace: &[(Duration, u32, u32)], at: Duration) -> u32 {
    trace
        .iter()
        .take_while(|(t, _, _)| *t <= at)
        .last()
        .map_or(0, |&(_, limit, _)| limit)
}

/// Slow start at the algorithm's level: windows without a queue double the limit; the first
/// with its mean RTT a quarter above the shortest mean leaves, cutting the limit to the
/// concurrency that was served without a queue (here 16 × 10 / 20 = 8); Vegas's own rules run
/// from the next window on.
#[test]
fn slow_start_doubles_until_the_round_trip_grows_then_cuts_to_what_had_no_queue() {
    let window = |limit: u32, rtt_ms: u64| WindowSample {
        rtt: Duration::from_millis(rtt_ms),
        min_rtt: Duration::from_millis(10),
        samples: 50,
        dropped: 0,
        max_in_flight: limit,
    };
    let mut vegas = Vegas::new();
    assert!(vegas.in_slow_start());
    assert_eq!(vegas.limit(), 1);
    let mut algorithm = LimitAlgorithm::from(vegas.clone());
    for (limit, next) in [(1, 2), (2, 4), (4, 8), (8, 16)] {
        assert_eq!(algorithm.update(&window(limit, 10)), next);
    }
    // A window that did not use half of the limit leaves it as it is.
    assert_eq!(algorithm.update(&window(7, 10)), 16);
    // 12 ms is within a quarter of 10 ms: no queue to speak of, but the limit doubles what
    // was served without one, 16 × 10 / 12.
    assert_eq!(algorithm.update(&window(16, 12)), 26);
    // Twice the RTT: out, cut to the 13⅓ that had no queue.
    assert_eq!(algorithm.update(&window(26, 20)), 13);
    let LimitAlgorithm::Vegas(v) = &algorithm else {
        unreachable!("a Vegas limit")
    };
    assert!(!v.in_slow_start());
    assert_eq!(v.rtt_noload(), Some(Duration::from_millis(10)));
    // Vegas's rules now: 21 ms against 10 ms is over the tolerance of 2: 13⅓ × 2 / 2.1.
    assert_eq!(algorithm.update(&window(13, 21)), 12);
    // A drop ends slow start too, under the algorithm's own rule for it.
    vegas = Vegas::new().with_limits(1, 8, 100);
    assert_eq!(
        vegas.update(&WindowSample {
            dropped: 1,
            ..window(8, 10)
        }),
        7
    );
    assert!(!vegas.in_slow_start());
    // Without slow start, Vegas's rules from the first window.
    let mut plain = Vegas::new().with_limits(1, 8, 100).with_slow_start(false);
    assert_eq!(plain.update(&window(8, 10)), 13);
}

/// A saturated server of 50 workers and 10 ms of work behind the default Vegas limit, which
/// starts at 1: slow start doubles it per 100 ms window, overshoots once to about twice the
/// workers (the window that shows the queue), leaves within a second with the limit cut to
/// about the 50 workers, and the limit then stays between them and Vegas's queue of at most
/// `6·log10(limit)` (plus one step): it never runs away, and never falls back below the
/// workers.
#[test]
fn vegas_slow_start_converges_from_one_to_capacity_without_overshooting() {
    let (manual, limiter) = limiter(LimiterConfig::default());
    assert_eq!(limiter.limit(), 1);
    let ms = Duration::from_millis;
    let trace = saturate(&manual, &limiter, 50, ms(10), Duration::from_secs(5));
    let LimitAlgorithm::Vegas(vegas) = limiter.algorithm() else {
        unreachable!("the default is Vegas")
    };
    assert!(!vegas.in_slow_start());
    assert_eq!(vegas.rtt_noload(), Some(ms(10)));
    // Doubling: 1, 2, 4, ... one window each, until the first window with a queue.
    let doubled: Vec<u32> = trace.iter().map(|&(_, l, _)| l).take(7).collect();
    assert_eq!(doubled, [1, 2, 4, 8, 16, 32, 64], "{trace:?}");
    // Never past twice the workers (plus the tenth of a window whose round trips started
    // before the last doubling), and that for one window: 103, then cut to about 50.
    let peak = trace.iter().map(|&(_, l, _)| l).max().expect("a trace");
    assert!(peak <= 110, "{trace:?}");
    assert_eq!(
        trace.iter().filter(|&&(_, l, _)| l > 64).count(),
        1,
        "{trace:?}"
    );
    assert!(limit_at(&trace, ms(1000)) >= 50, "{trace:?}");
    let settled = trace.iter().filter(|(t, _, _)| *t >= ms(1000));
    for &(t, limit, _) in settled {
        assert!((50..=64).contains(&limit), "{limit} at {t:?}: {trace:?}");
    }
}

/// One worker and 2 ms of work (the `limit_load` example's server): slow start finds the
/// queue at a limit of 2 and cuts back to 1 — never more than one request waiting.
#[test]
fn vegas_slow_start_in_front_of_one_worker_stops_at_two() {
    let (manual, limiter) = limiter(LimiterConfig::default());
    let ms = Duration::from_millis;
    let trace = saturate(&manual, &limiter, 1, ms(2), Duration::from_secs(3));
    assert_eq!(
        trace[..3].iter().map(|&(_, l, _)| l).collect::<Vec<_>>(),
        [1, 2, 1],
        "{trace:?}"
    );
    assert!(trace.iter().all(|&(_, l, _)| l <= 3), "{trace:?}");
}

/// One worker as a real server has it: the work varies (2.0 to 2.4 ms) and an admitted
/// request reaches the worker 0.3 ms after its slot (task wake-ups), so the no-load RTT a
/// window sees is its fastest request and the mean is above it even without a queue. At a
/// limit of 1 the worker idles through every hand-over (2.2 / 2.5 = 88 % busy); the limit has
/// to find 2, where one request waits behind the running one and the worker never idles,
/// and stay there: not stuck at 1, not at 3 or more (a request then waits two service times).
#[test]
fn vegas_keeps_one_request_waiting_for_one_worker_whose_work_varies() {
    let (manual, limiter) = limiter(LimiterConfig::default());
    let us = Duration::from_micros;
    let server = Server {
        workers: 1,
        work: |k: u64| us(2_000 + k * 7_919 % 401),
        handoff: us(300),
    };
    let run = saturate_server(&manual, &limiter, server, Duration::from_secs(10));
    let after_start: Vec<u32> = run
        .trace
        .iter()
        .filter(|(t, _, _)| *t >= Duration::from_secs(1))
        .map(|&(_, l, _)| l)
        .collect();
    assert!(run.busy >= 0.95, "busy {:.3}: {:?}", run.busy, run.trace);
    assert!(
        after_start.iter().all(|&l| (1..=3).contains(&l)),
        "{:?}",
        run.trace
    );
    let at_two = (10..100)
        .filter(|&tenth| limit_at(&run.trace, Duration::from_millis(tenth * 100)) == 2)
        .count();
    assert!(at_two >= 85, "{at_two} of 90 tenths at 2: {:?}", run.trace);
}

/// Gradient2 from a limit of 1 in front of 50 workers: the same slow start, out within a
/// second at about the workers; the gradient rule then runs from there (and drifts up by its
/// queue size times its smoothing per window, as Gradient2 does under a standing queue).
#[test]
fn gradient2_slow_start_converges_from_one_to_capacity() {
    let config = LimiterConfig::new(Gradient2::new().with_limits(1, 1, 1000));
    let (manual, limiter) = limiter(config);
    let ms = Duration::from_millis;
    let trace = saturate(&manual, &limiter, 50, ms(10), Duration::from_secs(2));
    let LimitAlgorithm::Gradient2(g) = limiter.algorithm() else {
        unreachable!("a Gradient2 limit")
    };
    assert!(!g.in_slow_start());
    let doubled: Vec<u32> = trace.iter().map(|&(_, l, _)| l).take(7).collect();
    assert_eq!(doubled, [1, 2, 4, 8, 16, 32, 64], "{trace:?}");
    let peak = trace.iter().map(|&(_, l, _)| l).max().expect("a trace");
    assert!(peak <= 110, "{trace:?}");
    assert_eq!(
        trace.iter().filter(|&&(_, l, _)| l > 64).count(),
        1,
        "{trace:?}"
    );
    let at_one_second = limit_at(&trace, ms(1000));
    assert!((50..=64).contains(&at_one_second), "{trace:?}");
}

/// A limit of 1 in front of a 1 s handler: a window closes after one sample rather than the
/// default ten, so slow start doubles once per round trip instead of once per ten.
#[test]
fn a_window_below_its_minimum_of_samples_closes_after_one_round_of_the_limit() {
    let (manual, limiter) = limiter(LimiterConfig::default());
    let trace = saturate(
        &manual,
        &limiter,
        8,
        Duration::from_secs(1),
        Duration::from_secs(4),
    );
    let limits: Vec<u32> = trace.iter().map(|&(_, l, _)| l).collect();
    assert_eq!(limits[..4], [1, 2, 4, 8], "{trace:?}");
}

#[test]
fn a_slot_passed_on_never_comes_free_and_the_next_round_trip_starts_at_the_hand_over() {
    let ms = Duration::from_millis;
    let (manual, l) =
        limiter(LimiterConfig::new(Aimd::new().with_limits(1, 1, 1)).with_window(ms(100), 2));
    let clock = manual.clock();
    let first = l.try_acquire(0, clock.now()).expect("room");
    // A request waits in a queue in front of the limiter while the first runs 10 ms.
    manual.advance(ms(10));
    let second = l
        .pass_on(first, clock.now(), Some(Outcome::Success), 0)
        .expect("handed over");
    assert_eq!(l.in_flight(), 1);
    assert!(
        l.try_acquire(0, clock.now()).is_err(),
        "a newcomer cannot take the slot"
    );
    manual.advance(ms(100));
    l.release(second, clock.now(), Outcome::Success);
    // The window saw both round trips, each from its admission: 10 ms and 100 ms.
    assert_eq!(l.expected_rtt(), Some(ms(55)));
    assert_eq!(l.in_flight(), 0);
}

#[test]
fn a_slot_is_given_back_instead_when_the_limit_fell_below_the_requests_in_flight() {
    let ms = Duration::from_millis;
    let (manual, l) = limiter(
        LimiterConfig::new(Aimd::new().with_limits(1, 4, 4).with_backoff_ratio(0.5))
            .with_window(ms(100), 1),
    );
    let clock = manual.clock();
    let mut tickets: Vec<_> = (0..4)
        .map(|_| l.try_acquire(0, clock.now()).expect("room"))
        .collect();
    manual.advance(ms(100));
    // A drop closes the window: the limit halves to 2 with 3 still in flight.
    l.release(tickets.remove(0), clock.now(), Outcome::InDoubt);
    assert_eq!((l.limit(), l.in_flight()), (2, 3));
    let passed = l.pass_on(tickets.remove(0), clock.now(), None, 0);
    assert!(
        passed.is_none(),
        "two others in flight: no room for a waiter"
    );
    assert_eq!(l.in_flight(), 2);
    // At the limit's level again, the next finished request's slot goes on.
    let next = l
        .pass_on(tickets.remove(0), clock.now(), None, 0)
        .expect("one other in flight, under the limit of 2");
    assert_eq!(l.in_flight(), 2);
    for t in tickets.into_iter().chain([next]) {
        l.forget(t);
    }
    assert_eq!(l.in_flight(), 0);
}

/// A closed window's limit and mean RTT travel in one word: both halves read back, and
/// values past their bits saturate instead of spilling into the other half.
#[test]
fn a_window_is_packed_into_one_word_and_saturates() {
    let unpack = |packed: u64| {
        (
            u32::try_from(packed & WINDOW_LIMIT_MASK).expect("24 bits"),
            packed >> WINDOW_LIMIT_BITS,
        )
    };
    assert_eq!(unpack(pack_window(2, 4_000_000)), (2, 4_000_000));
    assert_eq!(unpack(pack_window(0, 0)), (1, 1), "never the empty word");
    assert_eq!(
        unpack(pack_window(u32::MAX, u64::MAX)),
        ((1 << 24) - 1, (1 << 40) - 1)
    );
}

/// The limit a window ran at and its mean RTT are given together, as of its close.
#[test]
fn the_last_window_gives_the_limit_it_ran_at_with_its_round_trips() {
    let (manual, limiter) = limiter(
        LimiterConfig::new(Aimd::new().with_limits(3, 3, 3))
            .with_window(Duration::from_millis(1), 1),
    );
    let clock = manual.clock();
    assert_eq!(limiter.last_window(), None);
    let ticket = limiter.try_acquire(0, clock.now()).expect("room");
    manual.advance(Duration::from_millis(5));
    limiter.release(ticket, clock.now(), crate::classify::Outcome::Success);
    assert_eq!(limiter.last_window(), Some((3, Duration::from_millis(5))));
    assert_eq!(limiter.expected_rtt(), Some(Duration::from_millis(5)));
}
