//! The hedger under tokio's paused clock, against in-process downstreams (some made slow by a
//! seeded `FaultInjector`): the tail it cuts and the load it adds, cancellation of the losers,
//! fatal results, idempotency, the budget, pushback and the deadline.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stormguard::budget::{ConcurrencyBudget, RatioBudget, TokenBucket};
use stormguard::classify::{ByErrorClass, Outcome, Pushback, classify_http_status};
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline};
use stormguard::fault::{Abort, FaultConfig, FaultInjector, Latency};
use stormguard::hedge::{
    HedgeCall, HedgeDelay, HedgeFailure, HedgeObserver, HedgePolicy, HedgeStop, Hedger,
    HedgingStopped, WithPushback,
};
use stormguard::retry::{Attempt, IdempotencyKey};
use tokio::time::{Instant, sleep};

const MS: Duration = Duration::from_millis(1);

/// One observer callback, with the virtual time it happened at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Sent(u32),
    Ended(u32, Outcome),
    Cancelled(u32),
    Stopped(u32, HedgingStopped),
    Finished(u32, Option<u32>, HedgeStop),
}

/// Records every callback with its time since `start`.
struct Recorder {
    start: Instant,
    events: Mutex<Vec<(Duration, Event)>>,
}

impl Recorder {
    fn new() -> Arc<Self> {
        Arc::new(Recorder {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
        })
    }

    fn push(&self, event: Event) {
        let at = self.start.elapsed();
        self.events.lock().unwrap().push((at, event));
    }

    fn events(&self) -> Vec<(Duration, Event)> {
        self.events.lock().unwrap().clone()
    }

    fn count(&self, f: impl Fn(&Event) -> bool) -> usize {
        self.events().iter().filter(|(_, e)| f(e)).count()
    }
}

impl HedgeObserver for Recorder {
    fn attempt_sent(&self, attempt: u32) {
        self.push(Event::Sent(attempt));
    }
    fn attempt_ended(&self, attempt: u32, outcome: &Outcome) {
        self.push(Event::Ended(attempt, *outcome));
    }
    fn attempt_cancelled(&self, attempt: u32) {
        self.push(Event::Cancelled(attempt));
    }
    fn hedging_stopped(&self, sent: u32, why: HedgingStopped) {
        self.push(Event::Stopped(sent, why));
    }
    fn finished(&self, sent: u32, winner: Option<u32>, stop: HedgeStop) {
        self.push(Event::Finished(sent, winner, stop));
    }
}

/// Counts attempt futures dropped before they finished: the downstream call was cancelled.
#[derive(Default)]
struct Drops(AtomicU32);

/// Lives inside an attempt's future; a drop before `done` counts as a cancellation.
struct DropGuard {
    drops: Arc<Drops>,
    done: bool,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.done {
            self.drops.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A downstream whose attempt `n` waits `plan[n - 1].0` and then answers `plan[n - 1].1`
/// (an HTTP status), counting cancelled attempts.
fn scripted(
    plan: Vec<(Duration, u16)>,
    drops: Arc<Drops>,
) -> impl FnMut(Attempt) -> std::pin::Pin<Box<dyn Future<Output = Result<u16, ()>> + Send>> {
    move |attempt| {
        let (wait, status) = plan[attempt.number as usize - 1];
        let guard = DropGuard {
            drops: drops.clone(),
            done: false,
        };
        Box::pin(async move {
            // Move the whole guard in (a field assignment alone would capture only the field).
            let mut guard = guard;
            sleep(wait).await;
            guard.done = true;
            Ok(status)
        })
    }
}

fn by_status(r: &Result<u16, ()>) -> Outcome {
    match r {
        Ok(status) => classify_http_status(*status, None),
        Err(()) => Outcome::NeverRetry,
    }
}

fn policy(max: u32, delay: Duration) -> HedgePolicy {
    HedgePolicy::new(max, HedgeDelay::Fixed(delay)).with_idempotent(true)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[tokio::test(start_paused = true)]
async fn p99_drops_while_extra_load_stays_within_the_budget() {
    // 95 % of calls take 10 ms, 5 % take 500 ms; every call succeeds.
    let tail = Latency::Bimodal {
        fast: 10 * MS,
        slow: 500 * MS,
        slow_share: 0.05,
    };
    let downstream =
        |seed| FaultInjector::new(FaultConfig::new(seed).with_latency(1.0, tail)).unwrap();
    let n = 2000;
    let measure = |hedger: Hedger<Arc<RatioBudget>, Arc<Recorder>>, faults: FaultInjector| async move {
        let mut latencies = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            hedger
                .run(
                    |_| faults.wrap(async { Ok::<u16, Abort>(200) }),
                    ByErrorClass,
                )
                .await
                .unwrap();
            latencies.push(start.elapsed());
        }
        latencies.sort();
        latencies
    };
    // 10 % of requests over 10 s, no reserve: hedges may add at most 10 % to the load.
    let budget =
        || Arc::new(RatioBudget::new(0.1, Duration::from_secs(10), 0, Clock::tokio()).unwrap());

    let plain = Hedger::new(policy(2, 30 * MS).with_idempotent(false))
        .expect("a valid policy")
        .with_budget(budget())
        .with_observer(Recorder::new());
    let plain = measure(plain, downstream(11)).await;

    let recorder = Recorder::new();
    let hedged = Hedger::new(policy(3, 30 * MS))
        .expect("a valid policy")
        .with_budget(budget())
        .with_observer(recorder.clone());
    let hedged = measure(hedged, downstream(11)).await;

    let (p50_plain, p99_plain) = (percentile(&plain, 0.5), percentile(&plain, 0.99));
    let (p50_hedged, p99_hedged) = (percentile(&hedged, 0.5), percentile(&hedged, 0.99));
    assert_eq!((p50_plain, p99_plain), (10 * MS, 500 * MS));
    assert_eq!(p50_hedged, 10 * MS);
    // A slow original is overtaken 30 ms in by a hedge that is fast 95 % of the time.
    assert_eq!(p99_hedged, 40 * MS);

    let sent = recorder.count(|e| matches!(e, Event::Sent(_)));
    let hedges = sent - n;
    assert!(hedges > 50, "hedges {hedges}");
    assert!(hedges <= n / 10, "hedges {hedges} exceed the 10 % budget");
    // Every hedge either won or lost; the losers were cancelled, never left running.
    let cancelled = recorder.count(|e| matches!(e, Event::Cancelled(_)));
    let finished = recorder.count(|e| matches!(e, Event::Finished(..)));
    assert_eq!(finished, n);
    assert_eq!(sent, n + cancelled);

    // A 2 % budget cannot pay for the ~5 % of calls that want a hedge: it caps the extra
    // load, and the tail comes back.
    let recorder = Recorder::new();
    let tight =
        Arc::new(RatioBudget::new(0.02, Duration::from_secs(10), 0, Clock::tokio()).unwrap());
    let starved = Hedger::new(policy(3, 30 * MS))
        .expect("a valid policy")
        .with_budget(tight)
        .with_observer(recorder.clone());
    let starved = measure(starved, downstream(11)).await;
    let hedges = recorder.count(|e| matches!(e, Event::Sent(_))) - n;
    let refused = recorder.count(|e| matches!(e, Event::Stopped(_, HedgingStopped::Budget)));
    assert!(hedges <= n / 50, "hedges {hedges} exceed the 2 % budget");
    assert!(refused > 0);
    assert_eq!(percentile(&starved, 0.99), 500 * MS);
}

#[tokio::test(start_paused = true)]
async fn the_losers_are_dropped_when_a_hedge_wins() {
    let drops = Arc::new(Drops::default());
    let recorder = Recorder::new();
    let hedger = Hedger::new(policy(3, 20 * MS))
        .expect("a valid policy")
        .with_observer(recorder.clone());
    let op = scripted(
        vec![(1000 * MS, 200), (1000 * MS, 200), (5 * MS, 200)],
        drops.clone(),
    );
    let report = hedger.run_report(HedgeCall::new(), op, by_status).await;
    assert_eq!(report.result.unwrap(), 200);
    assert_eq!(
        (report.sent, report.winner, report.stop),
        (3, Some(3), HedgeStop::Succeeded)
    );
    assert_eq!(
        drops.0.load(Ordering::SeqCst),
        2,
        "attempts 1 and 2 dropped"
    );
    assert_eq!(
        recorder.events(),
        vec![
            (Duration::ZERO, Event::Sent(1)),
            (20 * MS, Event::Sent(2)),
            (40 * MS, Event::Sent(3)),
            (45 * MS, Event::Ended(3, Outcome::Success)),
            (45 * MS, Event::Cancelled(1)),
            (45 * MS, Event::Cancelled(2)),
            (45 * MS, Event::Finished(3, Some(3), HedgeStop::Succeeded)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_fatal_status_cancels_every_attempt() {
    let drops = Arc::new(Drops::default());
    let hedger = Hedger::new(policy(3, 10 * MS)).expect("a valid policy");
    let op = scripted(
        vec![(1000 * MS, 200), (1000 * MS, 200), (5 * MS, 404)],
        drops.clone(),
    );
    let start = Instant::now();
    let report = hedger.run_report(HedgeCall::new(), op, by_status).await;
    assert_eq!(start.elapsed(), 25 * MS);
    assert_eq!(
        report.result.unwrap(),
        404,
        "the fatal response is returned"
    );
    assert_eq!((report.winner, report.stop), (Some(3), HedgeStop::Fatal));
    assert_eq!(drops.0.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_non_fatal_failure_sends_the_next_hedge_at_once() {
    let recorder = Recorder::new();
    let hedger = Hedger::new(policy(3, 100 * MS))
        .expect("a valid policy")
        .with_observer(recorder.clone());
    let drops = Arc::new(Drops::default());
    let op = scripted(vec![(5 * MS, 503), (1000 * MS, 200), (10 * MS, 200)], drops);
    let report = hedger.run_report(HedgeCall::new(), op, by_status).await;
    assert_eq!(report.winner, Some(3));
    let sent: Vec<_> = recorder
        .events()
        .into_iter()
        .filter(|(_, e)| matches!(e, Event::Sent(_)))
        .collect();
    // 503 at 5 ms sends attempt 2 at once; attempt 3 follows a full delay later.
    assert_eq!(
        sent,
        vec![
            (Duration::ZERO, Event::Sent(1)),
            (5 * MS, Event::Sent(2)),
            (105 * MS, Event::Sent(3)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn when_everything_fails_non_fatally_the_last_failure_is_returned() {
    let drops = Arc::new(Drops::default());
    let hedger = Hedger::new(policy(3, 10 * MS)).expect("a valid policy");
    let op = scripted(vec![(50 * MS, 502), (5 * MS, 503), (5 * MS, 504)], drops);
    let report = hedger.run_report(HedgeCall::new(), op, by_status).await;
    assert_eq!(report.result.unwrap(), 502, "attempt 1 failed last");
    assert_eq!(
        (report.sent, report.winner, report.stop),
        (3, Some(1), HedgeStop::AllFailed)
    );
}

#[tokio::test(start_paused = true)]
async fn only_idempotent_or_keyed_calls_are_hedged() {
    let not_idempotent = HedgePolicy::new(3, HedgeDelay::Fixed(10 * MS));
    let hedger = Hedger::new(not_idempotent).expect("a valid policy");
    let slow = || scripted(vec![(1000 * MS, 200); 3], Arc::new(Drops::default()));

    let report = hedger.run_report(HedgeCall::new(), slow(), by_status).await;
    assert_eq!((report.sent, report.winner), (1, Some(1)));

    let keyed = HedgeCall::new().with_key(IdempotencyKey::new("order-1").unwrap());
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = keys.clone();
    let report = hedger
        .run_report(
            keyed,
            move |attempt: Attempt| {
                seen.lock().unwrap().push(attempt.key.clone());
                let wait = if attempt.number == 3 { 1 } else { 1000 };
                async move {
                    sleep(wait * MS).await;
                    Ok::<u16, ()>(200)
                }
            },
            by_status,
        )
        .await;
    assert_eq!((report.sent, report.winner), (3, Some(3)));
    let key = IdempotencyKey::new("order-1").unwrap();
    assert_eq!(
        *keys.lock().unwrap(),
        vec![Some(key); 3],
        "same key on every attempt"
    );

    let explicit = HedgeCall::new().idempotent(true);
    let report = hedger.run_report(explicit, slow(), by_status).await;
    assert_eq!(report.sent, 3);
}

#[tokio::test(start_paused = true)]
async fn a_budget_refusal_stops_hedging() {
    // The seeds' bucket: a hedge costs a token; 2 tokens pay for 2 hedges.
    let bucket = Arc::new(TokenBucket::spend_per_retry(2, 0.001).unwrap());
    let recorder = Recorder::new();
    let hedger = Hedger::new(policy(5, 10 * MS))
        .expect("a valid policy")
        .with_budget(bucket.clone())
        .with_observer(recorder.clone());
    let slow = || scripted(vec![(1000 * MS, 200); 5], Arc::new(Drops::default()));

    let report = hedger.run_report(HedgeCall::new(), slow(), by_status).await;
    assert_eq!(report.sent, 3);
    assert!(
        recorder
            .events()
            .contains(&(30 * MS, Event::Stopped(3, HedgingStopped::Budget)))
    );
    // The bucket is nearly empty: the next call gets no hedge at all.
    let report = hedger.run_report(HedgeCall::new(), slow(), by_status).await;
    assert_eq!(report.sent, 1);

    // An Envoy concurrency budget counts hedges in flight and releases cancelled ones.
    let envoy = Arc::new(ConcurrencyBudget::new(0.0, 1).unwrap());
    let hedger = Hedger::new(policy(5, 10 * MS))
        .expect("a valid policy")
        .with_budget(envoy.clone());
    let report = hedger.run_report(HedgeCall::new(), slow(), by_status).await;
    assert_eq!(report.sent, 2, "one hedge in flight at a time");
    assert_eq!((envoy.active_retries(), envoy.active_requests()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn pushback_postpones_or_stops_hedges() {
    // Overloaded with a delay: the next hedge waits for it, then the schedule resumes.
    let recorder = Recorder::new();
    let hedger = Hedger::new(policy(3, 20 * MS))
        .expect("a valid policy")
        .with_observer(recorder.clone());
    let report = hedger
        .run_report(
            HedgeCall::new(),
            |attempt: Attempt| async move {
                match attempt.number {
                    1 => {
                        sleep(5 * MS).await;
                        Err(Some(50 * MS))
                    }
                    _ => {
                        sleep(1000 * MS).await;
                        Ok::<u16, Option<Duration>>(200)
                    }
                }
            },
            |r: &Result<u16, Option<Duration>>| match r {
                Ok(_) => Outcome::Success,
                Err(wait) => Outcome::Overloaded { retry_after: *wait },
            },
        )
        .await;
    assert_eq!(report.winner, Some(2));
    let sent: Vec<_> = recorder
        .events()
        .into_iter()
        .filter(|(_, e)| matches!(e, Event::Sent(_)))
        .map(|(at, _)| at)
        .collect();
    assert_eq!(sent, vec![Duration::ZERO, 55 * MS, 75 * MS]);

    // "Do not retry" pushback: no more hedges, but the original keeps running and wins.
    let recorder = Recorder::new();
    let drops = Arc::new(Drops::default());
    let hedger = Hedger::new(policy(3, 10 * MS))
        .expect("a valid policy")
        .with_observer(recorder.clone());
    let classifier = WithPushback::new(by_status, |r: &Result<u16, ()>| {
        (r == &Ok(503)).then_some(Pushback::DoNotRetry)
    });
    let op = scripted(
        vec![(100 * MS, 200), (5 * MS, 503), (1 * MS, 200)],
        drops.clone(),
    );
    let report = hedger.run_report(HedgeCall::new(), op, classifier).await;
    assert_eq!((report.sent, report.winner), (2, Some(1)));
    assert_eq!(report.result.unwrap(), 200);
    assert_eq!(drops.0.load(Ordering::SeqCst), 0, "nothing was cancelled");
    assert!(
        recorder
            .events()
            .contains(&(15 * MS, Event::Stopped(2, HedgingStopped::Pushback)))
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_every_attempt() {
    let drops = Arc::new(Drops::default());
    let hedger = Hedger::new(policy(3, 30 * MS)).expect("a valid policy");
    let op = scripted(vec![(1000 * MS, 200); 3], drops.clone());
    let start = Instant::now();
    let request = Deadline::after(100 * MS, Clock::tokio());
    let err = deadline::scope(request, hedger.run(op, by_status))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), 100 * MS);
    assert!(matches!(err.last(), HedgeFailure::DeadlineExceeded));
    assert_eq!((err.stop(), err.sent()), (HedgeStop::DeadlineExceeded, 3));
    assert_eq!(drops.0.load(Ordering::SeqCst), 3);

    // No hedge when the deadline leaves less than the minimum call time; the attempts get
    // the remaining time as their timeout.
    let recorder = Recorder::new();
    let timeouts = Arc::new(Mutex::new(Vec::new()));
    let seen = timeouts.clone();
    let hedger = Hedger::new(policy(3, 20 * MS).with_min_call(40 * MS))
        .expect("a valid policy")
        .with_observer(recorder.clone());
    let call = HedgeCall::new().with_deadline(Deadline::after(70 * MS, Clock::tokio()));
    let report = hedger
        .run_report(
            call,
            move |attempt: Attempt| {
                seen.lock().unwrap().push(attempt.timeout);
                async {
                    sleep(1000 * MS).await;
                    Ok::<u16, ()>(200)
                }
            },
            by_status,
        )
        .await;
    assert_eq!(report.sent, 2);
    assert_eq!(
        *timeouts.lock().unwrap(),
        vec![Some(70 * MS), Some(50 * MS)]
    );
    assert!(
        recorder
            .events()
            .contains(&(40 * MS, Event::Stopped(2, HedgingStopped::DeadlineTooClose)))
    );
}

#[tokio::test(start_paused = true)]
async fn attempts_are_capped_at_five_and_a_dynamic_delay_is_read() {
    let recorder = Recorder::new();
    let reads = Arc::new(AtomicU32::new(0));
    let counted = reads.clone();
    let delay = HedgeDelay::dynamic(100 * MS, move || {
        counted.fetch_add(1, Ordering::SeqCst);
        Some(7 * MS)
    });
    let hedger = Hedger::new(HedgePolicy::new(9, delay).with_idempotent(true))
        .expect("a valid policy")
        .with_observer(recorder.clone());
    let op = scripted(vec![(1000 * MS, 200); 9], Arc::new(Drops::default()));
    let report = hedger.run_report(HedgeCall::new(), op, by_status).await;
    assert_eq!(report.sent, 5);
    assert_eq!(reads.load(Ordering::SeqCst), 1, "read once per call");
    let last_sent = recorder
        .events()
        .into_iter()
        .filter(|(_, e)| matches!(e, Event::Sent(_)))
        .map(|(at, _)| at)
        .next_back();
    assert_eq!(last_sent, Some(28 * MS));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_cancels_every_attempt() {
    let drops = Arc::new(Drops::default());
    let recorder = Recorder::new();
    let hedger = Hedger::new(policy(3, 10 * MS))
        .expect("a valid policy")
        .with_observer(recorder.clone());
    let op = scripted(vec![(1000 * MS, 200); 3], drops.clone());
    let timed_out = tokio::time::timeout(25 * MS, hedger.run(op, by_status)).await;
    assert!(timed_out.is_err());
    assert_eq!(drops.0.load(Ordering::SeqCst), 3);
    let events = recorder.events();
    assert_eq!(
        events.last(),
        Some(&(25 * MS, Event::Finished(3, None, HedgeStop::Cancelled)))
    );
}

#[tokio::test(start_paused = true)]
async fn far_deadlines_and_endless_pushback_neither_panic_nor_hang() {
    // A deadline of Duration::MAX is effectively none.
    let hedger = Hedger::new(policy(2, 10 * MS)).expect("a valid policy");
    let call = HedgeCall::new().with_deadline(Deadline::after(Duration::MAX, Clock::tokio()));
    let op = scripted(
        vec![(1000 * MS, 200), (5 * MS, 200)],
        Arc::new(Drops::default()),
    );
    let report = hedger.run_report(call, op, by_status).await;
    assert_eq!(report.winner, Some(2));

    // A pushback too long to schedule means no more hedges: the failure is returned at once.
    let start = Instant::now();
    let report = hedger
        .run_report(
            HedgeCall::new(),
            |_: Attempt| async { Err::<u16, Duration>(Duration::MAX) },
            |r: &Result<u16, Duration>| match r {
                Ok(_) => Outcome::Success,
                Err(wait) => Outcome::Overloaded {
                    retry_after: Some(*wait),
                },
            },
        )
        .await;
    assert_eq!((report.sent, report.stop), (1, HedgeStop::AllFailed));
    assert_eq!(start.elapsed(), Duration::ZERO);
}
