//! The success path allocates nothing: a retrier with a shared token bucket, under a task
//! deadline, calling an operation that succeeds at once, makes no heap allocation per call.
//!
//! A counting global allocator counts the allocations of the current thread only, so tests
//! running in parallel do not disturb each other.

// The counting allocator is the one place in the workspace that needs unsafe code.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use stormguard::breaker::{BreakerConfig, CircuitBreaker};
use stormguard::budget::{RatioBudget, RetryBudget, TokenBucket, Withdrawal};
use stormguard::classify::{ByErrorClass, Outcome, classify_http_status};
use stormguard::clock::Clock;
use stormguard::deadline::{self, Deadline};
use stormguard::retry::{Retrier, RetryPolicy};

struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// const-initialised thread local, which never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Polls `fut` once; it must be ready (the operations here never wait).
fn poll_once<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("expected a ready future"),
    }
}

async fn ok(x: u32) -> Result<u32, std::io::Error> {
    Ok(x)
}

#[test]
fn success_path_with_budget_and_deadline_allocates_nothing() {
    let budget = Arc::new(TokenBucket::grpc(10, 0.1).expect("valid"));
    let retrier = Retrier::new(RetryPolicy::new(3))
        .expect("a valid policy")
        .with_budget(budget);
    let deadline = Deadline::after(Duration::from_secs(60), Clock::system());
    let (before, after, sum) = poll_once(deadline::scope(deadline, async {
        // Warm up: first-use initialisation (thread locals, the clock) is not per call.
        let _ = retrier.run(|a| ok(a.number), ByErrorClass).await;
        let before = allocations();
        let mut sum = 0;
        for i in 0..10_000 {
            sum += retrier
                .run(|_| ok(i), ByErrorClass)
                .await
                .expect("succeeds");
        }
        (before, allocations(), sum)
    }));
    assert_eq!(sum, (0..10_000).sum::<u32>());
    assert_eq!(after - before, 0, "allocations in 10 000 successful calls");
}

#[test]
fn success_path_with_an_http_classifier_allocates_nothing() {
    let retrier = Retrier::new(RetryPolicy::new(3))
        .expect("a valid policy")
        .with_budget(Arc::new(TokenBucket::aws_standard()));
    let classify =
        |r: &Result<u16, ()>| r.map_or(Outcome::NeverRetry, |s| classify_http_status(s, None));
    let before = allocations();
    for _ in 0..1_000 {
        let status = poll_once(retrier.run(|_| async { Ok::<u16, ()>(200) }, classify));
        assert_eq!(status.expect("succeeds"), 200);
    }
    assert_eq!(allocations() - before, 0);
}

#[test]
fn budget_decisions_allocate_nothing() {
    let bucket = TokenBucket::spend_per_retry(100, 0.1).expect("valid");
    let ratio = RatioBudget::finagle_default(Clock::system());
    let _ = ratio.withdraw(Withdrawal::Retry);
    let before = allocations();
    for _ in 0..1_000 {
        bucket.record_success(None);
        let _ = bucket.withdraw(Withdrawal::Retry);
        ratio.request_started();
        let _ = ratio.withdraw(Withdrawal::Retry);
    }
    assert_eq!(allocations() - before, 0);
}

#[test]
fn breaker_admit_and_record_allocate_nothing() {
    for config in [
        BreakerConfig::seeds_default(),
        BreakerConfig::resilience4j_default(),
    ] {
        let breaker = Arc::new(CircuitBreaker::new(config, Clock::system()).expect("valid"));
        // Warm up: this thread's shard of the window is made on its first record.
        let record = |i: u64| {
            let permit = breaker.try_acquire().expect("closed");
            permit.record(Outcome::Success, Duration::from_micros(i));
            let owned = breaker.try_acquire_owned().expect("closed");
            owned.record(Outcome::Success, Duration::from_micros(i));
        };
        record(0);
        let before = allocations();
        for i in 0..10_000 {
            record(i);
        }
        assert_eq!(allocations() - before, 0, "{config:?}");
    }
}

#[test]
fn success_path_through_a_breaker_allocates_nothing() {
    let breaker = Arc::new(
        CircuitBreaker::new(BreakerConfig::seeds_default(), Clock::system()).expect("valid"),
    );
    let retrier = Retrier::new(RetryPolicy::new(3))
        .expect("a valid policy")
        .with_budget(Arc::new(TokenBucket::grpc(10, 0.1).expect("valid")))
        .with_breaker(breaker);
    let _ = poll_once(retrier.run(|a| ok(a.number), ByErrorClass));
    let before = allocations();
    for i in 0..10_000 {
        let got = poll_once(retrier.run(|_| ok(i), ByErrorClass));
        assert_eq!(got.expect("succeeds"), i);
    }
    assert_eq!(allocations() - before, 0);
}

#[test]
fn the_counter_sees_allocations() {
    let before = allocations();
    let boxed = std::hint::black_box(Box::new(7u64));
    assert_eq!(*boxed, 7);
    assert_eq!(
        allocations() - before,
        1,
        "the counting allocator must count"
    );
}

#[test]
fn limiter_admit_and_release_allocate_nothing() {
    use stormguard::limit::{Limiter, LimiterConfig, Vegas};
    let clock = Clock::system();
    let limiter = Limiter::new(LimiterConfig::new(Vegas::new()), &clock).expect("valid");
    // Warm up: a thread's first release makes its shard of the window, once per limiter.
    let ticket = limiter.try_acquire(0, clock.now()).expect("room");
    limiter.release(ticket, clock.now(), Outcome::Success);
    let before = allocations();
    // Enough calls, over enough time, to close windows and run the algorithm too.
    for _ in 0..100_000 {
        let ticket = limiter.try_acquire(0, clock.now()).expect("room");
        limiter.release(ticket, clock.now(), Outcome::Success);
    }
    assert_eq!(allocations() - before, 0);
    assert_eq!(limiter.in_flight(), 0);
}
