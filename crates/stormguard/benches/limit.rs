//! Admit + release on the success path: stormguard's adaptive `Limiter` beside tower's static
//! `ConcurrencyLimit`, in the same run.
//!
//! - `stormguard_limiter/given_now`: `try_acquire` + `release` with the time passed in (as the
//!   tower layer and the simulator do, having read their clock anyway): the limiter's own cost,
//!   atomics only;
//! - `stormguard_limiter/reading_the_clock`: the same with two `Instant::now()` readings, the
//!   RTT measurement a caller without a clock reading of its own pays;
//! - `tower_concurrency_limit`: `poll_ready` (takes a semaphore permit) + `call` + the
//!   response future polled to completion (gives it back), around a service that is ready at
//!   once.
//!
//! `cargo bench -p stormguard --bench limit`

use std::hint::black_box;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use stormguard::classify::Outcome;
use stormguard::clock::Clock;
use stormguard::limit::{Limiter, LimiterConfig, Vegas};
use tower::Service;
use tower::limit::ConcurrencyLimit;

fn admit_release(c: &mut Criterion) {
    let mut group = c.benchmark_group("admit_release");
    let clock = Clock::system();
    let limiter = Limiter::new(LimiterConfig::new(Vegas::new()), &clock).expect("valid");
    let now = Instant::now();
    group.bench_function("stormguard_limiter/given_now", |b| {
        b.iter(|| {
            let ticket = limiter.try_acquire(0, black_box(now)).expect("room");
            limiter.release(ticket, black_box(now), Outcome::Success);
        })
    });
    group.bench_function("stormguard_limiter/reading_the_clock", |b| {
        b.iter(|| {
            let ticket = limiter.try_acquire(0, Instant::now()).expect("room");
            limiter.release(ticket, Instant::now(), Outcome::Success);
        })
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let _guard = runtime.enter();
    let mut tower_limit = ConcurrencyLimit::new(
        tower::service_fn(|x: u64| std::future::ready(Ok::<_, ()>(x))),
        20,
    );
    let mut cx = Context::from_waker(Waker::noop());
    group.bench_function("tower_concurrency_limit", |b| {
        b.iter(|| {
            assert!(matches!(
                tower_limit.poll_ready(&mut cx),
                Poll::Ready(Ok(()))
            ));
            let mut future = std::pin::pin!(tower_limit.call(black_box(7)));
            assert!(matches!(future.as_mut().poll(&mut cx), Poll::Ready(Ok(7))));
        })
    });
    group.finish();
}

criterion_group!(benches, admit_release);
criterion_main!(benches);
