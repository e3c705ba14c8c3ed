//! stormguard's hot paths beside its peers, in one run.
//!
//! - `success_path`: one call whose operation is ready at once and succeeds — the cost a
//!   retrier adds to every healthy request. stormguard runs with a shared token bucket attached
//!   and a task deadline set. Peers: a bare call, backon's `.retry(ExponentialBuilder)`,
//!   `tower::retry::Retry` with a never-retry policy, and tower-resilience's `RetryLayer`.
//! - `budget_pair`: one retry decision as a budget sees it — a deposit (request or success) and
//!   a withdrawal — single-threaded and with two threads sharing the budget. Peer: tower's
//!   `TpsBudget`.
//!
//! Every future here completes on its first poll, so calls are driven by polling one outer
//! future with a no-op waker: no runtime overhead is measured, for anyone.

use std::future::Future;

use rand::SeedableRng;
use std::hint::black_box;
use std::pin::pin;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use criterion::{Criterion, criterion_group, criterion_main};
use stormguard::budget::{RatioBudget, RetryBudget, TokenBucket, Withdrawal};
use stormguard::classify::ByErrorClass;
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline};
use stormguard::retry::{Retrier, RetryPolicy};
use tower::retry::budget::{Budget, TpsBudget};
use tower::{Service, ServiceExt};

/// Polls `fut` once; everything benchmarked here is ready immediately.
fn poll_once<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("benchmarked future was not ready"),
    }
}

#[derive(Debug, Clone)]
struct Fail;

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fail")
    }
}

impl std::error::Error for Fail {}

impl stormguard::classify::Classify for Fail {
    fn classify(&self) -> stormguard::classify::Outcome {
        stormguard::classify::Outcome::Retryable
    }
}

async fn op(x: u64) -> Result<u64, Fail> {
    Ok(black_box(x))
}

/// A tower retry policy that never retries (the peer figure quoted in the issue).
#[derive(Clone)]
struct NeverRetry;

impl tower::retry::Policy<u64, u64, Fail> for NeverRetry {
    type Future = std::future::Ready<()>;
    fn retry(&mut self, _: &mut u64, _: &mut Result<u64, Fail>) -> Option<Self::Future> {
        None
    }
    fn clone_request(&mut self, req: &u64) -> Option<u64> {
        Some(*req)
    }
}

/// Runs `iters` sequential calls of `call` inside one polled future.
fn timed<F, Fut>(iters: u64, mut call: F) -> Duration
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = u64>,
{
    poll_once(async {
        let start = Instant::now();
        for i in 0..iters {
            black_box(call(i).await);
        }
        start.elapsed()
    })
}

/// Runs `iters` sequential `ready` + `call`s of a tower service inside one polled future.
fn service_calls<S>(mut svc: S, iters: u64) -> Duration
where
    S: Service<u64, Response = u64, Error = Fail>,
{
    poll_once(async {
        let start = Instant::now();
        for i in 0..iters {
            let ready = svc.ready().await.expect("ready");
            black_box(ready.call(i).await.unwrap_or(0));
        }
        start.elapsed()
    })
}

fn success_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("success_path");

    group.bench_function("bare_call", |b| {
        b.iter_custom(|iters| timed(iters, |i| async move { op(i).await.unwrap_or(0) }))
    });

    let budget = Arc::new(TokenBucket::grpc(100, 0.1).expect("valid"));
    let retrier = Retrier::new(RetryPolicy::new(3))
        .expect("a valid policy")
        .with_budget(Arc::clone(&budget));
    group.bench_function("stormguard_token_bucket_and_deadline", |b| {
        b.iter_custom(|iters| {
            let deadline = Deadline::after(Duration::from_secs(3600), Clock::system());
            poll_once(deadline::scope(deadline, async {
                let start = Instant::now();
                for i in 0..iters {
                    let out = retrier.run(|_| op(i), ByErrorClass).await;
                    black_box(out.unwrap_or(0));
                }
                start.elapsed()
            }))
        })
    });

    let plain = Retrier::new(RetryPolicy::new(3)).expect("a valid policy");
    group.bench_function("stormguard_no_budget_no_deadline", |b| {
        b.iter_custom(|iters| {
            timed(iters, |i| {
                let plain = &plain;
                async move { plain.run(|_| op(i), ByErrorClass).await.unwrap_or(0) }
            })
        })
    });

    let policy = RetryPolicy::new(3);
    group.bench_function("stormguard_retry_run_only", |b| {
        b.iter_custom(|iters| {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
            poll_once(async {
                let start = Instant::now();
                for i in 0..iters {
                    let mut run = stormguard::retry::RetryRun::start(&policy, &*budget, false);
                    let r = op(i).await;
                    let outcome = stormguard::classify::Classifier::classify(&ByErrorClass, &r);
                    black_box(run.finish_attempt(outcome.into(), || None, &mut rng));
                    black_box(r.unwrap_or(0));
                }
                start.elapsed()
            })
        })
    });

    group.bench_function("backon_exponential", |b| {
        b.iter_custom(|iters| {
            timed(iters, |i| async move {
                (move || op(i))
                    .retry(ExponentialBuilder::default())
                    .await
                    .unwrap_or(0)
            })
        })
    });

    let bare_service = tower::service_fn(op);
    group.bench_function("tower_bare_service", |b| {
        b.iter_custom(|iters| {
            let mut svc = bare_service;
            timed(iters, |i| {
                let call = svc.call(i);
                async move { call.await.unwrap_or(0) }
            })
        })
    });

    let tower_retry = tower::retry::Retry::new(NeverRetry, tower::service_fn(op));
    group.bench_function("tower_retry_never_retry_policy", |b| {
        b.iter_custom(|iters| service_calls(tower_retry.clone(), iters))
    });

    let resilience = tower::Layer::layer(
        &tower_resilience::retry::RetryLayer::<u64, u64, Fail>::builder()
            .max_attempts(3)
            .exponential_backoff(Duration::from_millis(100))
            .build(),
        tower::service_fn(op),
    );
    group.bench_function("tower_resilience_retry_layer", |b| {
        b.iter_custom(|iters| service_calls(resilience.clone(), iters))
    });
    group.finish();
}

/// Runs `pair` `iters` times on each of `threads` threads at once; returns the wall time, so
/// the figure is the time per pair per thread.
fn contended<P: Fn() + Sync>(threads: usize, iters: u64, pair: P) -> Duration {
    let barrier = Barrier::new(threads);
    let elapsed: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        pair();
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    elapsed.into_iter().max().unwrap_or_default()
}

fn budget_pairs(c: &mut Criterion) {
    let grpc = TokenBucket::grpc(1000, 0.1).expect("valid");
    let spend = TokenBucket::spend_per_retry(1000, 0.1).expect("valid");
    let ratio = RatioBudget::new(0.2, Duration::from_secs(10), 10, Clock::system()).expect("valid");
    let tps = TpsBudget::new(Duration::from_secs(10), 10, 0.2);

    let pairs: [(&str, &(dyn Fn() + Sync)); 4] = [
        ("stormguard_token_bucket_grpc", &|| {
            grpc.record_success(None);
            black_box(grpc.withdraw(Withdrawal::Retry).is_ok());
        }),
        ("stormguard_token_bucket_spend_per_retry", &|| {
            spend.record_success(None);
            black_box(spend.withdraw(Withdrawal::Retry).is_ok());
        }),
        ("stormguard_ratio_budget", &|| {
            ratio.request_started();
            black_box(ratio.withdraw(Withdrawal::Retry).is_ok());
        }),
        ("tower_tps_budget", &|| {
            tps.deposit();
            black_box(tps.withdraw());
        }),
    ];

    for threads in [1, 2] {
        let mut group = c.benchmark_group(format!("budget_pair_{threads}_threads"));
        for (name, pair) in pairs {
            group.bench_function(name, |b| {
                b.iter_custom(|iters| contended(threads, iters, pair))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, success_path, budget_pairs);
criterion_main!(benches);
