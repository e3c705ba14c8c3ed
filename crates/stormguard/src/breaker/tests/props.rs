//! Property tests of the breaker: random calls against a model kept by the test (the last
//! calls of a count window, or the buckets of a time window), checked after every call.

use super::*;

fn outcome(i: u8) -> Outcome {
    match i % 5 {
        0 => Outcome::Success,
        1 => Outcome::Retryable,
        2 => Outcome::Overloaded { retry_after: None },
        3 => Outcome::InDoubt,
        _ => Outcome::NeverRetry,
    }
}

proptest! {
    /// Feeds random calls to a closed breaker and checks, after each one, that it is open
    /// exactly when the last `size` calls (kept by the test) cross a threshold.
    #[test]
    fn opens_exactly_when_the_thresholds_say(
        size in 1u32..30,
        min_frac in 0.0f64..=1.0,
        failure_ratio in 0.0f64..=1.0,
        slow_ratio in 0.0f64..=1.0,
        above: bool,
        calls in prop::collection::vec((0u8..5, any::<bool>()), 1..150),
    ) {
        let minimum = ((f64::from(size) * min_frac) as u32).max(1);
        let comparison = if above { Comparison::Above } else { Comparison::AtLeast };
        let config = BreakerConfig::new(
            HealthConfig::count(size).with_slow_call_threshold(Duration::from_secs(1)),
        )
        .with_minimum_throughput(minimum)
        .with_failure_ratio(failure_ratio)
        .with_slow_call_ratio(slow_ratio)
        .with_comparison(comparison);
        let clock = ManualClock::new();
        let (b, _e) = breaker(config, &clock);
        let mut last: VecDeque<(bool, bool)> = VecDeque::new();
        for (o, slow) in calls {
            let o = outcome(o);
            let elapsed = if slow { Duration::from_secs(2) } else { MS };
            b.try_acquire().expect("must succeed").record(o, elapsed);
            last.push_back((!matches!(o, Outcome::Success | Outcome::NeverRetry), slow));
            if last.len() > size as usize {
                last.pop_front();
            }
            let n = last.len() as f64;
            let failures = last.iter().filter(|c| c.0).count() as f64;
            let slows = last.iter().filter(|c| c.1).count() as f64;
            let cross = |r: f64, t: f64| if above { r > t } else { r >= t };
            let expect_open = last.len() >= minimum as usize
                && (cross(failures / n, failure_ratio) || cross(slows / n, slow_ratio));
            let state = b.state();
            prop_assert_eq!(state == BreakerState::Open, expect_open);
            if expect_open {
                break;
            }
        }
    }

    /// The same over a time-based window: the test keeps every call with its time and counts
    /// those in the live buckets (the current one and the `buckets - 1` before it).
    #[test]
    fn time_window_opens_exactly_when_the_thresholds_say(
        minimum in 1u32..20,
        failure_ratio in 0.0f64..=1.0,
        steps in prop::collection::vec((0u8..5, 0u64..400), 1..150),
    ) {
        let (length_ms, buckets) = (1_000u64, 4u32);
        let bucket_ms = length_ms / u64::from(buckets);
        let config = BreakerConfig::new(HealthConfig::time(Duration::from_millis(length_ms), buckets))
            .with_minimum_throughput(minimum)
            .with_failure_ratio(failure_ratio)
            .with_comparison(Comparison::Above);
        let clock = ManualClock::new();
        let (b, _e) = breaker(config, &clock);
        let mut seen: Vec<(u64, bool)> = Vec::new();
        for (o, advance) in steps {
            clock.advance(Duration::from_millis(advance));
            let o = outcome(o);
            b.try_acquire().expect("closed").record(o, MS);
            let now = clock.elapsed().as_millis() as u64;
            seen.push((now, !matches!(o, Outcome::Success | Outcome::NeverRetry)));
            let live: Vec<bool> = seen
                .iter()
                .filter(|(t, _)| now / bucket_ms - t / bucket_ms < u64::from(buckets))
                .map(|(_, failed)| *failed)
                .collect();
            let failures = live.iter().filter(|f| **f).count() as f64;
            let expect_open = live.len() >= minimum as usize
                && failures / live.len() as f64 > failure_ratio;
            prop_assert_eq!(b.state() == BreakerState::Open, expect_open);
            if expect_open {
                break;
            }
        }
    }

    /// The time-window fast path (healthy calls skip the totals while the window's version is
    /// unchanged) against a model that looks at every call: slow calls, both comparisons,
    /// thresholds at 0 and 1, any minimum throughput.
    #[test]
    fn time_window_fast_path_opens_exactly_when_the_model_says(
        minimum in 1u32..30,
        failure_ratio in prop_oneof![Just(0.0), Just(1.0), 0.0f64..=1.0],
        slow_ratio in prop_oneof![Just(0.0), Just(1.0), 0.0f64..=1.0],
        above: bool,
        steps in prop::collection::vec((0u8..8, any::<bool>(), 0u64..300), 1..200),
    ) {
        let (length_ms, buckets) = (1_000u64, 4u32);
        let bucket_ms = length_ms / u64::from(buckets);
        let comparison = if above { Comparison::Above } else { Comparison::AtLeast };
        let window = HealthConfig::time(Duration::from_millis(length_ms), buckets)
            .with_slow_call_threshold(Duration::from_secs(1));
        let config = BreakerConfig::new(window)
            .with_minimum_throughput(minimum)
            .with_failure_ratio(failure_ratio)
            .with_slow_call_ratio(slow_ratio)
            .with_comparison(comparison);
        let clock = ManualClock::new();
        let (b, _e) = breaker(config, &clock);
        let mut seen: Vec<(u64, bool, bool)> = Vec::new();
        for (o, slow, advance) in steps {
            clock.advance(Duration::from_millis(advance));
            // Mostly successes, so the fast path is taken often.
            let o = if o >= 5 { Outcome::Success } else { outcome(o) };
            let elapsed = if slow { Duration::from_secs(2) } else { MS };
            b.try_acquire().expect("closed").record(o, elapsed);
            let now = clock.elapsed().as_millis() as u64;
            seen.push((now, !matches!(o, Outcome::Success | Outcome::NeverRetry), slow));
            let live: Vec<_> = seen
                .iter()
                .filter(|(t, _, _)| now / bucket_ms - t / bucket_ms < u64::from(buckets))
                .collect();
            let n = live.len() as f64;
            let failures = live.iter().filter(|c| c.1).count() as f64;
            let slows = live.iter().filter(|c| c.2).count() as f64;
            let cross = |r: f64, t: f64| if above { r > t } else { r >= t };
            let expect_open = live.len() >= minimum as usize
                && (cross(failures / n, failure_ratio) || cross(slows / n, slow_ratio));
            prop_assert_eq!(b.state() == BreakerState::Open, expect_open);
            if expect_open {
                break;
            }
        }
    }

    /// Random acquire / record / abandon / advance sequences: within one half-open period the
    /// breaker never admits more than `permitted_probes` probes, and never more than that are
    /// in flight.
    #[test]
    fn never_more_than_the_permitted_probes(
        probes in 1u32..5,
        ops in prop::collection::vec((0u8..4, 0u8..5, 0usize..8), 1..300),
    ) {
        let clock = ManualClock::new();
        let config = small(4).with_permitted_probes(probes).with_open_duration(Duration::from_millis(100));
        let (b, events) = breaker(config, &clock);
        // Each held permit, tagged with the half-open period it probes (if it is a probe).
        let mut held: Vec<(Permit<'_, Arc<Events>>, Option<usize>)> = Vec::new();
        let mut admitted_this_period = 0u32;
        let mut period = 0usize;
        for (op, o, idx) in ops {
            match op {
                0 => {
                    if let Ok(p) = b.try_acquire() {
                        let half_opens = events
                            .changes()
                            .iter()
                            .filter(|c| c.to == BreakerState::HalfOpen)
                            .count();
                        if half_opens != period {
                            period = half_opens;
                            admitted_this_period = 0;
                        }
                        let tag = p.is_probe().then_some(period);
                        if p.is_probe() {
                            admitted_this_period += 1;
                            prop_assert!(admitted_this_period <= probes);
                        }
                        held.push((p, tag));
                    }
                }
                1 if !held.is_empty() => {
                    let (p, _) = held.swap_remove(idx % held.len());
                    p.record(outcome(o), MS);
                }
                2 if !held.is_empty() => {
                    // Abandoning a current probe gives its slot back.
                    let (p, tag) = held.swap_remove(idx % held.len());
                    if tag == Some(period) && b.state() == BreakerState::HalfOpen {
                        admitted_this_period -= 1;
                    }
                    drop(p);
                }
                _ => clock.advance(Duration::from_millis(40)),
            }
            if b.state() == BreakerState::HalfOpen {
                let in_flight = held.iter().filter(|(_, t)| *t == Some(period)).count();
                prop_assert!(in_flight as u32 <= probes);
            }
        }
    }
}
