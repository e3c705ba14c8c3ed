//! `AdaptiveThrottleLayer` around in-process tower services: an overloaded HTTP backend
//! (429s) gets throttled, a healthy one never does, the 503 option, and generic services.

#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use stormguard::classify::Outcome;
use stormguard::clock::ManualClock;
use stormguard::throttle::{AdaptiveThrottle, ThrottleConfig};
use stormguard_tower::reject::REJECTED_BY;
use stormguard_tower::throttle::{AdaptiveThrottleLayer, ThrottleError};
use tower::{Layer, Service, ServiceExt};

fn throttle(clock: &ManualClock) -> Arc<AdaptiveThrottle> {
    Arc::new(
        AdaptiveThrottle::new(ThrottleConfig::sre_default(), clock.clock())
            .unwrap()
            .with_seed(11),
    )
}

/// A backend that accepts `capacity` requests per (virtual) second and answers 429 to the
/// rest; counts what it receives.
fn backend(
    clock: ManualClock,
    capacity: u64,
    seen: Arc<AtomicU64>,
) -> impl Service<(), Response = http::Response<String>, Error = Infallible> + Clone {
    let served = Arc::new(std::sync::Mutex::new((0u64, 0u64)));
    tower::service_fn(move |()| {
        let second = clock.elapsed().as_secs();
        let seen = Arc::clone(&seen);
        let served = Arc::clone(&served);
        async move {
            seen.fetch_add(1, Ordering::Relaxed);
            let mut s = served.lock().unwrap();
            if s.0 != second {
                *s = (second, 0);
            }
            let status = if s.1 < capacity {
                s.1 += 1;
                200
            } else {
                429
            };
            Ok(http::Response::builder()
                .status(status)
                .body(String::new())
                .unwrap())
        }
    })
}

#[tokio::test]
async fn an_overloaded_backend_sees_about_twice_its_capacity() {
    let clock = ManualClock::new();
    let seen = Arc::new(AtomicU64::new(0));
    let mut svc = AdaptiveThrottleLayer::new(throttle(&clock)).layer(backend(
        clock.clone(),
        50,
        Arc::clone(&seen),
    ));
    let (mut throttled, mut seen_late) = (0u64, 0u64);
    // 500 requests per second for 6 minutes; measure the last 3.
    for second in 0..360 {
        let before = seen.load(Ordering::Relaxed);
        for _ in 0..500 {
            clock.advance(Duration::from_millis(2));
            match svc.ready().await.unwrap().call(()).await {
                Ok(_) => {}
                Err(ThrottleError::Throttled(t)) => {
                    assert!(t.probability > 0.0);
                    throttled += 1;
                }
                Err(ThrottleError::Service(e)) => match e {},
            }
        }
        if second >= 180 {
            seen_late += seen.load(Ordering::Relaxed) - before;
        }
    }
    let rate = seen_late as f64 / 180.0;
    assert!((rate - 100.0).abs() <= 5.0, "backend saw {rate:.1}/s");
    assert!(throttled > 300 * 360, "{throttled}");
}

#[tokio::test]
async fn a_healthy_backend_is_not_throttled_and_503_is_an_option() {
    let clock = ManualClock::new();
    let seen = Arc::new(AtomicU64::new(0));
    let throttle = throttle(&clock);
    let mut healthy = AdaptiveThrottleLayer::new(Arc::clone(&throttle))
        .with_http_503()
        .layer(backend(clock.clone(), 1_000, Arc::clone(&seen)));
    for _ in 0..1_000 {
        clock.advance(Duration::from_millis(2));
        let response = healthy.ready().await.unwrap().call(()).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(throttle.rejection_probability(), 0.0);

    // Now every answer is 429: the 503 option answers locally once the throttle kicks in.
    let mut overloaded = AdaptiveThrottleLayer::new(Arc::clone(&throttle))
        .with_http_503()
        .layer(backend(clock.clone(), 0, Arc::clone(&seen)));
    let mut local = 0;
    for _ in 0..5_000 {
        let response = overloaded.ready().await.unwrap().call(()).await.unwrap();
        if response.status() == 503 {
            assert_eq!(response.headers()[REJECTED_BY], "throttled");
            local += 1;
        } else {
            assert_eq!(response.status(), 429);
        }
    }
    // The 1000 earlier accepts allow 2000 requests before p rises above 0; after that p
    // climbs towards (6000 − 2000) / 6001 ≈ 0.67.
    assert!(local > 1_000 && local < 4_000, "{local}");
}

#[tokio::test]
async fn generic_services_count_accepts_with_their_classifier() {
    let clock = ManualClock::new();
    let throttle = throttle(&clock);
    let mut svc = AdaptiveThrottleLayer::new(Arc::clone(&throttle))
        .with_classifier(|r: &Result<u8, &'static str>| match r {
            Ok(_) => Outcome::Success,
            Err(_) => Outcome::Overloaded { retry_after: None },
        })
        .layer(tower::service_fn(|x: u8| async move {
            if x == 0 { Err("busy") } else { Ok(x) }
        }));
    assert_eq!(svc.ready().await.unwrap().call(3).await.unwrap(), 3);
    assert!(matches!(
        svc.ready().await.unwrap().call(0).await,
        Err(ThrottleError::Service("busy"))
    ));
    let counts = throttle.counts();
    assert_eq!((counts.requests, counts.accepts), (2, 1));
}
