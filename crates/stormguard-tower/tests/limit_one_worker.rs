//! One worker behind the limit layer with its defaults, driven at three times its capacity by
//! callers that retry a shed request once, at once: the two goals of a server limit together,
//! the worker kept busy and the admitted requests answered about as fast as without load.
//!
//! In process under paused tokio time, so every figure is exact and the run repeats: the
//! worker is a semaphore of one; a request reaches it `HANDOFF` after its handler starts and
//! its response is ready `HANDOFF` after the work ends (the task wake-ups of a real server,
//! during which a worker without a request waiting idles); the work varies from 2.0 to
//! 2.4 ms. The real-HTTP version of this run is the `limit_load` example.
//!
//! Tokio's timers count whole milliseconds, so the run is the real one slowed down `SCALE`
//! times: every duration (the work, the hand-overs, the limiter's window, the queue's CoDel
//! times, the callers' timeout) is `SCALE` times the real one and every rate `SCALE` times
//! lower; the figures below are scaled back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use http::{Request, Response, StatusCode};
use stormguard::limit::LimiterConfig;
use stormguard_tower::limit::AdaptiveLimitLayer;
use tokio::sync::{Mutex, Semaphore};
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tower::{Layer, ServiceExt, service_fn};

/// How many times slower than real time the run goes.
const SCALE: u32 = 100;
/// A real duration of `micros`, slowed down.
fn us(micros: u64) -> Duration {
    Duration::from_micros(micros) * SCALE
}
/// Between a handler starting and its work starting, and between the work ending and the
/// response being ready: 150 us.
fn handoff() -> Duration {
    us(150)
}
/// Offered requests: three times the worker's 455/s, one every 733 us.
const EVERY_US: u64 = 733;
/// Real seconds run.
const SECONDS: u64 = 10;

/// The `k`-th request's work: 2.0 to 2.4 ms, 2.2 ms on average.
fn work(k: u64) -> Duration {
    us(2_000 + k * 7_919 % 401)
}

/// The layer with its defaults, slowed down: Vegas in 100 ms windows, a queue of 32 with a
/// CoDel target of 5 ms and interval of 100 ms.
fn layer() -> AdaptiveLimitLayer {
    let limiter = LimiterConfig::default().with_window(us(100_000), 10);
    AdaptiveLimitLayer::builder(limiter)
        .with_queue(32, us(5_000), us(100_000))
        .build()
        .expect("valid")
}

/// What the run saw after its first second (slow start).
struct Run {
    /// The worker's share of the time working.
    busy: f64,
    /// Requests answered 200 per real second.
    goodput: f64,
    /// The callers' latency of the attempts answered 200, in microseconds.
    admitted: Histogram<u64>,
}

/// The worker behind `layer`, offered a request every `EVERY_US`; each retries a shed answer
/// once, at once, and gives up on an attempt after 1 s.
async fn run(layer: AdaptiveLimitLayer) -> Run {
    let worker = Arc::new(Semaphore::new(1));
    let started = Arc::new(AtomicU64::new(0));
    let worked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let warm = start + us(1_000_000);
    let handler = {
        let worked = Arc::clone(&worked);
        service_fn(move |_: Request<()>| {
            let (worker, started, worked) = (
                Arc::clone(&worker),
                Arc::clone(&started),
                Arc::clone(&worked),
            );
            async move {
                sleep(handoff()).await;
                let permit = worker.acquire().await.expect("open");
                let took = work(started.fetch_add(1, Ordering::Relaxed));
                sleep(took).await;
                if Instant::now() >= warm {
                    let nanos = u64::try_from(took.as_nanos()).expect("short") / u64::from(SCALE);
                    worked.fetch_add(nanos, Ordering::Relaxed);
                }
                drop(permit);
                sleep(handoff()).await;
                Ok::<_, Infallible>(Response::new(()))
            }
        })
    };
    let service = layer.layer(handler);
    let admitted = Arc::new(Mutex::new(Histogram::<u64>::new(3).expect("histogram")));
    let good = Arc::new(AtomicU64::new(0));
    let mut callers = Vec::new();
    for k in 0..SECONDS * 1_000_000 / EVERY_US {
        sleep_until(start + us(k * EVERY_US)).await;
        let (service, admitted, good) = (service.clone(), Arc::clone(&admitted), Arc::clone(&good));
        callers.push(tokio::spawn(async move {
            for _ in 0..2 {
                let sent = Instant::now();
                let answer = timeout(us(1_000_000), service.clone().oneshot(Request::new(())));
                let Ok(Ok(response)) = answer.await else {
                    continue;
                };
                if response.status() == StatusCode::OK {
                    if sent >= warm {
                        good.fetch_add(1, Ordering::Relaxed);
                        let micros = sent.elapsed().as_micros() / u128::from(SCALE);
                        let micros = u64::try_from(micros).expect("short");
                        admitted.lock().await.record(micros).expect("in range");
                    }
                    return;
                }
            }
        }));
    }
    for caller in callers {
        caller.await.expect("caller");
    }
    let measured = (SECONDS - 1) as f64;
    let admitted = admitted.lock().await.clone();
    Run {
        busy: worked.load(Ordering::Relaxed) as f64 / 1e9 / measured,
        goodput: good.load(Ordering::Relaxed) as f64 / measured,
        admitted,
    }
}

/// Unloaded, a request takes its work and two hand-overs: 2.3 to 2.7 ms. A limit that keeps
/// one request waiting in front of the worker (Vegas's queue of one) keeps the worker busy,
/// but each admitted request then waits a whole service time there: 4.5 ms at the median.
/// With the freed slot held and given to the newest waiter shortly before the worker frees
/// (late binding), the worker stays as busy and a request waits about a quarter of a
/// service time.
#[tokio::test(start_paused = true)]
async fn one_worker_stays_busy_and_its_admitted_requests_wait_a_fraction_of_a_service_time() {
    let layer = layer();
    let run = run(layer.clone()).await;
    let [p50, p95, p99] = [0.5, 0.95, 0.99].map(|q| run.admitted.value_at_quantile(q));
    eprintln!(
        "busy {:.3}, goodput {:.0}/s, admitted p50 {p50} us p95 {p95} us p99 {p99} us, limit {}, \
         {:?}",
        run.busy,
        run.goodput,
        layer.limiter().limit(),
        layer.stats()
    );
    assert!(run.busy >= 0.95, "busy {:.3}", run.busy);
    assert!(run.goodput >= 0.95 * 455.0, "goodput {:.0}/s", run.goodput);
    // A request waiting a whole service time in front of the worker takes 4.5 ms; one bound
    // late, about 3.
    assert!(p50 <= 3_400, "admitted p50 {p50} us");
    assert!(p95 <= 3_900, "admitted p95 {p95} us");
    // The goal is at most twice the unloaded p99 (2.7 ms); the window after each
    // probe of the no-load round trip, its slots handed out at once, made it 4.4 ms.
    assert!(p99 <= 4_200, "admitted p99 {p99} us");
}
