use std::collections::VecDeque;
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
    let cases: [(LimiterConfig, &str); 9] = [
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

/// A server of `workers` workers behind a FIFO queue, simulated in 100 µs steps on a manual
/// clock.
struct Bench {
    manual: ManualClock,
    limiter: Limiter,
    workers: usize,
}

struct Trace {
    limit: Vec<u32>,
    rtt_ms: Vec<f64>,
    served: u64,
}

impl Bench {
    fn new(config: LimiterConfig, workers: usize) -> Self {
        let (manual, limiter) = limiter(config);
        Bench {
            manual,
            limiter,
            workers,
        }
    }

    fn run(
        &self,
        rate: f64,
        before: Duration,
        after: Duration,
        change_at: Duration,
        total: Duration,
    ) -> Trace {
        let clock = self.manual.clock();
        let step = Duration::from_micros(100);
        let steps = (total.as_micros() / step.as_micros()) as u64;
        let mut queue: VecDeque<Ticket> = VecDeque::new();
        let mut busy: Vec<(Duration, Ticket)> = Vec::new();
        let mut owed = 0.0;
        let mut trace = Trace {
            limit: Vec::new(),
            rtt_ms: Vec::new(),
            served: 0,
        };
        for i in 0..steps {
            let elapsed = step * i as u32;
            let service = if elapsed < change_at { before } else { after };
            // Completions.
            let mut k = 0;
            while k < busy.len() {
                if busy[k].0 <= elapsed {
                    let (_, ticket) = busy.swap_remove(k);
                    trace.served += 1;
                    self.limiter.release(ticket, clock.now(), Outcome::Success);
                } else {
                    k += 1;
                }
            }
            // Arrivals.
            owed += rate * step.as_secs_f64();
            while owed >= 1.0 {
                owed -= 1.0;
                if let Ok(ticket) = self.limiter.try_acquire(0, clock.now()) {
                    queue.push_back(ticket);
                }
            }
            while busy.len() < self.workers {
                let Some(ticket) = queue.pop_front() else {
                    break;
                };
                busy.push((elapsed + service, ticket));
            }
            if i % 1000 == 999 {
                trace.limit.push(self.limiter.limit());
                trace.rtt_ms.push(
                    self.limiter
                        .expected_rtt()
                        .unwrap_or_default()
                        .as_secs_f64()
                        * 1e3,
                );
            }
            self.manual.advance(step);
        }
        trace
    }
}

/// Offered 3x capacity by a 4-worker server whose handler goes from 10 ms to 20 ms at 5 s
/// (capacity 400/s, then 200/s), Vegas keeps the server busy (at least 97 % of capacity
/// served) with a short queue: from 1 s after the change on, the mean RTT of admitted
/// requests stays within 2x the new service time (40 ms), as it stayed within 2x the old one
/// (20 ms) before it. The limit follows each probe of the no-load RTT (every 5 s).
#[test]
fn vegas_converges_within_one_second_after_the_handler_gets_twice_slower() {
    let bench = Bench::new(LimiterConfig::new(Vegas::new().with_limits(1, 20, 200)), 4);
    let ms = Duration::from_millis;
    let trace = bench.run(
        1200.0,
        ms(10),
        ms(20),
        Duration::from_secs(5),
        Duration::from_secs(15),
    );
    for (slot, &rtt) in trace.rtt_ms.iter().enumerate().skip(20) {
        let bound = if slot < 50 {
            20.0
        } else if slot >= 60 {
            40.0
        } else {
            continue;
        };
        assert!(
            rtt <= bound,
            "slot {slot}: mean RTT {rtt} ms, limit {}",
            trace.limit[slot]
        );
    }
    assert!(
        trace.served as f64 >= 0.97 * 4000.0,
        "served {}",
        trace.served
    );
}

/// Gradient2 (Netflix's, faithfully) reacts to the slower handler within a second, but under
/// a load that never lets the queue drain its long-term RTT follows the short one and the
/// limit drifts up again: the reason [`Vegas`] is the default.
#[test]
fn gradient2_reacts_within_one_second_but_drifts_under_a_standing_queue() {
    let bench = Bench::new(
        LimiterConfig::new(Gradient2::new().with_limits(4, 20, 200)),
        4,
    );
    let ms = Duration::from_millis;
    let trace = bench.run(
        1200.0,
        ms(10),
        ms(20),
        Duration::from_secs(5),
        Duration::from_secs(15),
    );
    let before = trace.limit[49];
    assert!(
        trace.limit[50..60]
            .iter()
            .any(|&l| f64::from(l) < 0.8 * f64::from(before))
    );
    assert!(trace.limit[149] > before, "{:?}", &trace.limit[140..]);
    assert!(
        trace.served as f64 >= 0.97 * 4000.0,
        "served {}",
        trace.served
    );
}
