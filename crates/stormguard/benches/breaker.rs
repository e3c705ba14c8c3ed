//! The circuit breaker's healthy path beside its peers, in one run.
//!
//! Each figure is one call admitted by a closed breaker whose operation succeeds at once,
//! and the recording of its outcome: the cost a breaker adds to every healthy request.
//!
//! - stormguard: `try_acquire` + `Permit::record` (and the `Arc`-owning `try_acquire_owned`)
//!   over a time-based window (`BreakerConfig::seeds_default`: 10 s in 10 buckets) and a
//!   count-based one (`resilience4j_default`: the last 100 calls), on `Clock::system`. The
//!   elapsed time is handed in, as a caller that already measures it would; the
//!   `..._with_clock_reads` variant also reads `Instant::now` twice per call, as the retrier
//!   and the tower layer do.
//! - recloser 1.4: `Recloser::call` (a ring of 100 calls) and `AsyncRecloser::call`.
//! - failsafe 1.3: `StateMachine::call` with its default policy.
//! - tower-resilience 0.13: its `CircuitBreakerLayer` (a window of 100 calls) around a
//!   `service_fn`, `ready` + `call`.
//!
//! Every group runs single-threaded and with two threads calling the same breaker at once
//! (the figure is then the time per call per thread). Async variants are driven by
//! `futures::executor::block_on` around the whole loop, so no runtime cost is measured.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use failsafe::CircuitBreaker as _;
use futures::executor::block_on;
use stormguard::breaker::{BreakerConfig, CircuitBreaker};
use stormguard::classify::Outcome;
use stormguard::clock::Clock;
use tower::{Service, ServiceExt};

/// One benchmark: runs the given number of calls.
type Body<'a> = Box<dyn Fn(u64) + Sync + 'a>;

const ELAPSED: Duration = Duration::from_micros(150);

/// Runs `body(iters)` on each of `threads` threads at once and returns the slowest thread's
/// time, so the figure is the time per call per thread.
fn on_threads<F: Fn(u64) + Sync>(threads: usize, iters: u64, body: &F) -> Duration {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    // Warm up outside the timing: a thread's first record makes its shard.
                    body(1);
                    barrier.wait();
                    let start = Instant::now();
                    body(iters);
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .max()
            .unwrap_or_default()
    })
}

async fn ok(x: u64) -> Result<u64, std::io::Error> {
    Ok(black_box(x))
}

/// Drives `iters` calls of a tower service in one `block_on`.
fn tower_calls<S>(svc: &S, iters: u64)
where
    S: Service<u64, Response = u64> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut svc = svc.clone();
    block_on(async {
        for i in 0..iters {
            let ready = svc.ready().await.expect("ready");
            black_box(ready.call(i).await.expect("ok"));
        }
    })
}

fn success_path(c: &mut Criterion) {
    let time_window = Arc::new(
        CircuitBreaker::new(BreakerConfig::seeds_default(), Clock::system()).expect("valid"),
    );
    let count_window = Arc::new(
        CircuitBreaker::new(BreakerConfig::resilience4j_default(), Clock::system()).expect("valid"),
    );
    let recloser = recloser::Recloser::default();
    let async_recloser = recloser::AsyncRecloser::from(recloser::Recloser::default());
    let failsafe = failsafe::Config::new().build();
    let resilience = tower::Layer::layer(
        &tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
            .build()
            .expect("valid"),
        tower::service_fn(ok),
    );

    let bodies: Vec<(&str, Body<'_>)> = vec![
        (
            "bare_call",
            Box::new(|iters| {
                for i in 0..iters {
                    black_box(i);
                }
            }),
        ),
        (
            "stormguard_time_window",
            Box::new(|iters| {
                for i in 0..iters {
                    let permit = time_window.try_acquire().expect("closed");
                    black_box(i);
                    permit.record(Outcome::Success, ELAPSED);
                }
            }),
        ),
        (
            "stormguard_time_window_owned_permit",
            Box::new(|iters| {
                for i in 0..iters {
                    let permit = time_window.try_acquire_owned().expect("closed");
                    black_box(i);
                    permit.record(Outcome::Success, ELAPSED);
                }
            }),
        ),
        (
            "stormguard_time_window_with_clock_reads",
            Box::new(|iters| {
                for i in 0..iters {
                    let permit = time_window.try_acquire().expect("closed");
                    let start = Instant::now();
                    black_box(i);
                    permit.record(Outcome::Success, start.elapsed());
                }
            }),
        ),
        (
            "stormguard_count_window",
            Box::new(|iters| {
                for i in 0..iters {
                    let permit = count_window.try_acquire().expect("closed");
                    black_box(i);
                    permit.record(Outcome::Success, ELAPSED);
                }
            }),
        ),
        (
            "recloser_call",
            Box::new(|iters| {
                for i in 0..iters {
                    black_box(recloser.call(|| Ok::<u64, ()>(black_box(i))).unwrap_or(0));
                }
            }),
        ),
        (
            "recloser_async_call",
            Box::new(|iters| {
                block_on(async {
                    for i in 0..iters {
                        black_box(async_recloser.call(ok(i)).await.unwrap_or(0));
                    }
                })
            }),
        ),
        (
            "failsafe_call",
            Box::new(|iters| {
                for i in 0..iters {
                    black_box(failsafe.call(|| Ok::<u64, ()>(black_box(i))).unwrap_or(0));
                }
            }),
        ),
        (
            "tower_resilience_circuit_breaker_layer",
            Box::new(|iters| tower_calls(&resilience, iters)),
        ),
    ];

    for threads in [1, 2] {
        let mut group = c.benchmark_group(format!("breaker_success_path_{threads}_threads"));
        for (name, body) in &bodies {
            group.bench_function(*name, |b| {
                b.iter_custom(|iters| on_threads(threads, iters, body))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, success_path);
criterion_main!(benches);
