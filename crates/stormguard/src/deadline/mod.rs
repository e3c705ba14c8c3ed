//! Deadlines: one instant shared by every hop of a request, instead of a timeout per hop.
//!
//! # Why an instant, not a timeout
//!
//! Per-hop timeouts do not compose. If a gateway gives up after 1 s but the service behind it
//! allows itself 1 s for each of three retries, the service keeps working (and keeps loading its
//! own dependencies) long after nobody is waiting for the answer. Retries make this worse: that
//! wasted work is exactly what turns a slow dependency into an outage.
//!
//! A [`Deadline`] is the instant by which the *original caller* stops caring. Every hop reads
//! how much of it is left ([`Deadline::remaining`]), keeps a [`Reserve`] for its own work (say
//! 10–20 %, or a fixed amount to write the response and log), and hands the rest downstream
//! ([`Deadline::child`]). So a downstream timeout never exceeds the upstream remaining time
//! minus the reserve, and a retrier can tell that another attempt no longer fits.
//!
//! ```
//! use std::time::Duration;
//! use stormguard::clock::ManualClock;
//! use stormguard::deadline::{Deadline, Reserve};
//!
//! let clock = ManualClock::new().clock();
//! // The gateway's budget for the whole request.
//! let gateway = Deadline::after(Duration::from_millis(1000), clock);
//! // It keeps 10 % and hands 900 ms to service A...
//! let a = gateway.child(Reserve::fraction(0.1)?);
//! assert_eq!(a.remaining(), Duration::from_millis(900));
//! // ...which keeps a fixed 300 ms for its own work and hands 600 ms to service B.
//! let b = a.child(Reserve::fixed(Duration::from_millis(300)));
//! assert_eq!(b.remaining(), Duration::from_millis(600));
//! # Ok::<(), stormguard::deadline::InvalidReserve>(())
//! ```
//!
//! # Crossing process boundaries
//!
//! An [`Instant`] means nothing on another host, so on the wire a deadline travels either as a
//! relative timeout (`grpc-timeout`, `connect-timeout-ms`, `x-envoy-expected-rq-timeout-ms`),
//! which ignores network delay but needs no clock agreement, or as an absolute wall-clock time
//! (`X-Request-Deadline`), which counts network delay but trusts both hosts' clocks to agree.
//! The [`codec`] module parses and encodes these headers; malformed values are rejected with a
//! [`HeaderError`] that names the header and the rule, never with a panic. [`DeadlineHeader`]
//! names the four headers, [`read_deadline`] picks one when a request carries several, and
//! [`WallClock`] is the wall time the absolute one is read and written with.
//!
//! # The current deadline
//!
//! With the `tokio` feature a server can make a deadline *current* for the task handling a
//! request ([`scope`]) and any client code running in that task can read it ([`current`],
//! [`with_current`]) without threading it through every signature. Nested scopes can only
//! shorten the deadline. The deadline does **not** follow `tokio::spawn`: a spawned task must be
//! given it explicitly (wrap the spawned future in [`scope`]), because a background task often
//! legitimately outlives the request that started it.

use std::time::{Duration, Instant, SystemTime};

use crate::clock::Clock;

pub mod codec;
mod header;
mod wall;

pub use codec::{
    CONNECT_TIMEOUT_MS, ENVOY_EXPECTED_RQ_TIMEOUT_MS, GRPC_TIMEOUT, GrpcTimeout, HeaderError,
    HeaderErrorKind, REQUEST_DEADLINE, encode_grpc_timeout, encode_request_deadline,
    parse_connect_timeout_ms, parse_envoy_expected_timeout_ms, parse_grpc_timeout,
    parse_millis_header, parse_request_deadline,
};
pub use header::{
    DeadlineHeader, DeadlineHeaderError, DeadlineHeaders, EncodedDeadline, Found,
    InvalidHeaderList, Reading, Selection, read_deadline,
};
pub use wall::WallClock;

/// How far ahead [`Deadline::after`] places a deadline whose timeout does not fit in an
/// [`Instant`]: 100 years, which no request outlives.
pub const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The instant by which a request must be finished, read through a [`Clock`].
///
/// Cloning is cheap (an instant and a clock handle).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use stormguard::clock::ManualClock;
/// use stormguard::deadline::Deadline;
///
/// let manual = ManualClock::new();
/// let deadline = Deadline::after(Duration::from_secs(2), manual.clock());
/// manual.advance(Duration::from_millis(500));
/// assert_eq!(deadline.remaining(), Duration::from_millis(1500));
/// manual.advance(Duration::from_secs(5));
/// assert!(deadline.is_expired());
/// assert_eq!(deadline.remaining(), Duration::ZERO);
/// ```
#[derive(Clone, Debug)]
pub struct Deadline {
    at: Instant,
    clock: Clock,
}

impl Deadline {
    /// A deadline at the instant `at`, as read by `clock`.
    pub fn at(at: Instant, clock: Clock) -> Self {
        Deadline { at, clock }
    }

    /// A deadline `timeout` from now.
    ///
    /// If `now + timeout` does not fit in an [`Instant`] (for example `Duration::MAX`), the
    /// deadline is [`FAR_FUTURE`] from now instead: effectively no deadline, and no panic.
    pub fn after(timeout: Duration, clock: Clock) -> Self {
        let now = clock.now();
        let at = now.checked_add(timeout).unwrap_or_else(|| far_future(now));
        Deadline { at, clock }
    }

    /// The instant of this deadline.
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// The clock this deadline is read with.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Time left until the deadline; zero once it has passed.
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(self.clock.now())
    }

    /// Whether the deadline has been reached (no time is left).
    pub fn is_expired(&self) -> bool {
        self.clock.now() >= self.at
    }

    /// The time left at `now`, for callers that already hold a reading of this deadline's
    /// clock (a simulator, or a loop checking many deadlines against one reading).
    pub fn remaining_at(&self, now: Instant) -> Duration {
        self.at.saturating_duration_since(now)
    }

    /// Whether the deadline has been reached at `now`.
    pub fn is_expired_at(&self, now: Instant) -> bool {
        now >= self.at
    }

    /// The deadline to hand downstream: the remaining time minus what `reserve` keeps for this
    /// hop's own work.
    ///
    /// The child is never later than `self`. While `self` has time left the child is never
    /// before now: if the reserve takes all the remaining time the child expires now. If `self`
    /// has already expired the child is `self`'s own instant.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::clock::ManualClock;
    /// use stormguard::deadline::{Deadline, Reserve};
    ///
    /// let parent = Deadline::after(Duration::from_millis(100), ManualClock::new().clock());
    /// let child = parent.child(Reserve::fixed(Duration::from_millis(30)));
    /// assert_eq!(child.remaining(), Duration::from_millis(70));
    /// // A reserve larger than what is left leaves nothing for downstream.
    /// assert!(parent.child(Reserve::fixed(Duration::from_secs(1))).is_expired());
    /// ```
    pub fn child(&self, reserve: Reserve) -> Deadline {
        let now = self.clock.now();
        let remaining = self.at.saturating_duration_since(now);
        let handed = remaining.saturating_sub(reserve.kept_from(remaining));
        let at = now.checked_add(handed).unwrap_or(self.at).min(self.at);
        Deadline {
            at,
            clock: self.clock.clone(),
        }
    }

    /// The earlier of the two deadlines (`self` when they are equal), with its clock.
    pub fn min(self, other: Deadline) -> Deadline {
        if other.at < self.at { other } else { self }
    }

    /// The local deadline for an absolute wall-clock `deadline` (as carried by
    /// `X-Request-Deadline`), given the local wall-clock time `wall_now`.
    ///
    /// Only the difference `deadline - wall_now` is used, so the result is as accurate as the
    /// agreement between the sender's clock and this host's: clock skew between hosts shifts it
    /// one-for-one. A `deadline` at or before `wall_now` gives an already-expired deadline.
    pub fn from_epoch_millis(deadline: SystemTime, wall_now: SystemTime, clock: Clock) -> Deadline {
        match deadline.duration_since(wall_now) {
            Ok(left) => Deadline::after(left, clock),
            Err(past) => {
                let now = clock.now();
                let at = now.checked_sub(past.duration()).unwrap_or(now);
                Deadline { at, clock }
            }
        }
    }

    /// This deadline as a wall-clock time, given the local wall-clock time `wall_now` (for
    /// encoding `X-Request-Deadline`). Saturates instead of overflowing.
    pub fn to_system_time(&self, wall_now: SystemTime) -> SystemTime {
        let now = self.clock.now();
        match self.at.checked_duration_since(now) {
            Some(left) => wall_now
                .checked_add(left)
                .or_else(|| wall_now.checked_add(FAR_FUTURE))
                .unwrap_or(wall_now),
            None => wall_now
                .checked_sub(now.saturating_duration_since(self.at))
                .unwrap_or(wall_now),
        }
    }
}

/// `now + FAR_FUTURE`, or the largest of a few shorter horizons that fits.
fn far_future(now: Instant) -> Instant {
    const DAY: u64 = 24 * 60 * 60;
    [
        FAR_FUTURE,
        Duration::from_secs(365 * DAY),
        Duration::from_secs(DAY),
    ]
    .into_iter()
    .find_map(|d| now.checked_add(d))
    .unwrap_or(now)
}

/// What a hop keeps for its own work before handing the rest of a deadline downstream: a
/// fraction of the remaining time, a fixed amount, or both added together.
///
/// The fraction is stored in parts per million, so the arithmetic is exact integer arithmetic
/// on nanoseconds; the kept fraction is rounded *up* to the nanosecond, so downstream never
/// gets more than it should.
///
/// ```
/// use std::time::Duration;
/// use stormguard::deadline::Reserve;
///
/// let reserve = Reserve::fraction(0.1)?.with_fixed(Duration::from_millis(5));
/// assert_eq!(reserve.kept_from(Duration::from_millis(200)), Duration::from_millis(25));
/// # Ok::<(), stormguard::deadline::InvalidReserve>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Reserve {
    fraction_ppm: u32,
    fixed: Duration,
}

/// [`Reserve::fraction`] was given something other than a number in `0.0..=1.0`.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("invalid reserve fraction {0}: must be a number between 0.0 and 1.0")]
pub struct InvalidReserve(pub f64);

const PPM: u32 = 1_000_000;

impl Reserve {
    /// Keep nothing: hand all the remaining time downstream.
    pub const NONE: Reserve = Reserve {
        fraction_ppm: 0,
        fixed: Duration::ZERO,
    };

    /// Keep the fraction `f` (0.0 to 1.0) of the remaining time, to the nearest millionth.
    ///
    /// NaN, negative values and values above 1.0 are rejected.
    pub fn fraction(f: f64) -> Result<Reserve, InvalidReserve> {
        if !(0.0..=1.0).contains(&f) {
            return Err(InvalidReserve(f));
        }
        // In range: f * 1e6 is in 0.0..=1e6, so the cast is exact after rounding.
        #[allow(clippy::cast_possible_truncation, reason = "value is within 0..=1e6")]
        let fraction_ppm = (f * f64::from(PPM)).round() as u32;
        Ok(Reserve {
            fraction_ppm: fraction_ppm.min(PPM),
            fixed: Duration::ZERO,
        })
    }

    /// Keep a fixed amount of the remaining time.
    pub const fn fixed(d: Duration) -> Reserve {
        Reserve {
            fraction_ppm: 0,
            fixed: d,
        }
    }

    /// This reserve plus a fixed amount `d` (replacing any fixed amount it had): it keeps
    /// `fraction × remaining + d`, saturating.
    pub fn with_fixed(self, d: Duration) -> Reserve {
        Reserve { fixed: d, ..self }
    }

    /// The fraction of the remaining time kept, in `0.0..=1.0`.
    pub fn fraction_kept(&self) -> f64 {
        f64::from(self.fraction_ppm) / f64::from(PPM)
    }

    /// The fixed amount kept.
    pub const fn fixed_kept(&self) -> Duration {
        self.fixed
    }

    /// Whether this reserve keeps all of any remaining time (a fraction of 1, or a fixed
    /// hour or more), so that nothing would ever be handed downstream.
    pub fn keeps_everything(&self) -> bool {
        const PROBE: Duration = Duration::from_secs(3600);
        self.kept_from(PROBE) >= PROBE
    }

    /// How much of `remaining` this reserve keeps: `fraction × remaining` (rounded up to the
    /// nanosecond) plus the fixed amount, saturating at [`Duration::MAX`]. May exceed
    /// `remaining`, in which case nothing is left for downstream.
    pub fn kept_from(&self, remaining: Duration) -> Duration {
        let nanos = remaining.as_nanos() * u128::from(self.fraction_ppm);
        let fraction = duration_from_nanos(nanos.div_ceil(u128::from(PPM)));
        fraction.saturating_add(self.fixed)
    }
}

/// A `Duration` from a nanosecond count, saturating at [`Duration::MAX`].
fn duration_from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let subsec = u32::try_from(nanos % NANOS_PER_SEC).unwrap_or(0);
    match u64::try_from(nanos / NANOS_PER_SEC) {
        Ok(secs) => Duration::new(secs, subsec),
        Err(_) => Duration::MAX,
    }
}

#[cfg(feature = "tokio")]
pub use current::{current, scope, with_current};

#[cfg(feature = "tokio")]
mod current {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::Deadline;

    tokio::task_local! {
        static CURRENT: Deadline;
    }

    /// Runs `fut` with `deadline` as the task's current deadline (see [`current`]).
    ///
    /// If an enclosing scope's deadline is earlier, that one stays current: a nested scope can
    /// only shorten the deadline, never extend it.
    /// The enclosing scope is the one the returned future is first polled in, not the one it
    /// was built in.
    ///
    /// The deadline is not inherited by tasks spawned inside `fut`; pass it explicitly by
    /// wrapping the spawned future in `scope(deadline.clone(), ...)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::clock::Clock;
    /// use stormguard::deadline::{self, Deadline};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let request = Deadline::after(Duration::from_secs(1), Clock::tokio());
    /// let left = deadline::scope(request, async {
    ///     // Deep inside a client: how long may this call take?
    ///     deadline::current().map(|d| d.remaining())
    /// })
    /// .await;
    /// assert!(left.is_some_and(|d| d <= Duration::from_secs(1)));
    /// assert!(deadline::current().is_none());
    /// # }
    /// ```
    pub fn scope<F: Future>(deadline: Deadline, fut: F) -> impl Future<Output = F::Output> {
        Scope::Entering { deadline, fut }
    }

    pin_project_lite::pin_project! {
        /// The future of [`scope`]. The enclosing deadline is read when it is first polled,
        /// where it runs (a scope built outside another and awaited inside it is still
        /// shortened by it), and `fut` is held once: moved, not yet pinned, into tokio's
        /// task-local scope then.
        #[project = ScopeProj]
        #[project_replace = ScopeTaken]
        enum Scope<F: Future> {
            Entering { deadline: Deadline, fut: F },
            Entered { #[pin] scoped: tokio::task::futures::TaskLocalFuture<Deadline, F> },
            Moving,
        }
    }

    impl<F: Future> Future for Scope<F> {
        type Output = F::Output;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            if let ScopeProj::Entering { .. } = self.as_mut().project() {
                if let ScopeTaken::Entering { deadline, fut } =
                    self.as_mut().project_replace(Scope::Moving)
                {
                    let effective = with_current(|outer| match outer {
                        Some(outer) if outer.at < deadline.at => outer.clone(),
                        _ => deadline,
                    });
                    self.set(Scope::Entered {
                        scoped: CURRENT.scope(effective, fut),
                    });
                }
            }
            match self.project() {
                ScopeProj::Entered { scoped } => scoped.poll(cx),
                // `Moving` lasts only inside the block above, which always leaves `Entered`.
                ScopeProj::Entering { .. } | ScopeProj::Moving => {
                    unreachable!("deadline scope polled while entering")
                }
            }
        }
    }

    /// The current task's deadline, or `None` outside any [`scope`].
    pub fn current() -> Option<Deadline> {
        CURRENT.try_with(Deadline::clone).ok()
    }

    /// Calls `f` with the current task's deadline (`None` outside any [`scope`]) without
    /// cloning it: the cheap path for hot code.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::deadline;
    ///
    /// // Outside any scope there is no deadline, so no cap on the timeout.
    /// let timeout = deadline::with_current(|d| d.map(|d| d.remaining()));
    /// assert_eq!(timeout, None);
    /// ```
    pub fn with_current<R>(f: impl FnOnce(Option<&Deadline>) -> R) -> R {
        let mut f = Some(f);
        let inside = CURRENT.try_with(|d| f.take().map(|f| f(Some(d))));
        match (inside, f) {
            (Ok(Some(result)), _) => result,
            (_, Some(f)) => f(None),
            // `f` is taken only by the closure above, which then returns `Some`.
            (_, None) => unreachable!("with_current: callback consumed without a result"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use proptest::prelude::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn gateway_to_a_to_b_arithmetic() {
        let clock = ManualClock::new().clock();
        let gateway = Deadline::after(MS(1000), clock);
        let ten_percent = Reserve::fraction(0.1).expect("0.1 is a valid fraction");
        // 1000 ms - 10 % of 1000 ms = 900 ms for A.
        assert_eq!(ten_percent.kept_from(MS(1000)), MS(100));
        let a = gateway.child(ten_percent);
        assert_eq!(a.remaining(), MS(900));
        // 900 ms - fixed 300 ms = 600 ms for B.
        let b = a.child(Reserve::fixed(MS(300)));
        assert_eq!(b.remaining(), MS(600));
        assert!(b.instant() <= a.instant() && a.instant() <= gateway.instant());
    }

    #[test]
    fn fraction_and_fixed_add_up() {
        let r = Reserve::fraction(0.2).expect("valid").with_fixed(MS(50));
        assert_eq!(r.kept_from(MS(1000)), MS(250));
        let all = Reserve::fraction(1.0).expect("valid").with_fixed(MS(1));
        assert_eq!(all.kept_from(Duration::MAX), Duration::MAX);
        assert_eq!(Reserve::NONE.kept_from(MS(7)), Duration::ZERO);
        assert_eq!(Reserve::default(), Reserve::NONE);
    }

    #[test]
    fn fraction_rejects_nan_negative_and_above_one() {
        for bad in [f64::NAN, -0.1, 1.01, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(Reserve::fraction(bad).is_err(), "{bad} accepted");
        }
        assert!(Reserve::fraction(0.0).is_ok());
        assert_eq!(
            Reserve::fraction(1.0).expect("valid").kept_from(MS(3)),
            MS(3)
        );
        let msg = Reserve::fraction(2.0).expect_err("invalid").to_string();
        assert!(msg.contains('2') && msg.contains("0.0 and 1.0"), "{msg}");
    }

    #[test]
    fn fraction_rounds_kept_time_up() {
        // 1/3 of 10 ns is 3.33 ns: keep 4, hand 6 downstream.
        let third = Reserve::fraction(1.0 / 3.0).expect("valid");
        assert_eq!(
            third.kept_from(Duration::from_nanos(10)),
            Duration::from_nanos(4)
        );
    }

    #[test]
    fn after_saturates_far_in_the_future() {
        let manual = ManualClock::new();
        let d = Deadline::after(Duration::MAX, manual.clock());
        assert_eq!(d.remaining(), FAR_FUTURE);
        assert!(!d.is_expired());
    }

    #[test]
    fn expiry_and_remaining_follow_the_clock() {
        let manual = ManualClock::new();
        let d = Deadline::after(MS(10), manual.clock());
        assert!(!d.is_expired());
        manual.advance(MS(10));
        assert!(d.is_expired());
        assert_eq!(d.remaining(), Duration::ZERO);
        let d0 = Deadline::at(manual.clock().now(), manual.clock());
        assert!(d0.is_expired());
    }

    #[test]
    fn child_of_expired_deadline_is_not_later() {
        let manual = ManualClock::new();
        let parent = Deadline::after(MS(5), manual.clock());
        manual.advance(MS(20));
        let child = parent.child(Reserve::NONE);
        assert_eq!(child.instant(), parent.instant());
        assert!(child.is_expired());
    }

    #[test]
    fn min_picks_the_earlier() {
        let clock = ManualClock::new().clock();
        let a = Deadline::after(MS(10), clock.clone());
        let b = Deadline::after(MS(20), clock);
        assert_eq!(a.clone().min(b.clone()).instant(), a.instant());
        assert_eq!(b.min(a.clone()).instant(), a.instant());
    }

    #[test]
    fn wall_clock_conversions() {
        let manual = ManualClock::new();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let d = Deadline::from_epoch_millis(wall + MS(250), wall, manual.clock());
        assert_eq!(d.remaining(), MS(250));
        assert_eq!(d.to_system_time(wall), wall + MS(250));
        // A deadline in the past is valid but already expired, and converts back.
        let past = Deadline::from_epoch_millis(wall - MS(40), wall, manual.clock());
        assert!(past.is_expired());
        assert_eq!(past.to_system_time(wall), wall - MS(40));
        // Skew: a receiver whose clock runs 100 ms ahead sees 100 ms less.
        let skewed = Deadline::from_epoch_millis(wall + MS(250), wall + MS(100), manual.clock());
        assert_eq!(skewed.remaining(), MS(150));
    }

    #[cfg(feature = "tokio")]
    mod current_deadline {
        use super::*;
        use crate::deadline::{current, scope, with_current};

        #[test]
        fn a_scope_holds_the_future_it_wraps_once() {
            // An `async fn` around tokio's scope held the wrapped future twice: a client's
            // attempt paid for every byte of it two times over, at every call.
            let big = async {
                let buffer = [7u8; 4096];
                std::future::ready(()).await;
                buffer.len()
            };
            let wrapped = std::mem::size_of_val(&big);
            let deadline = Deadline::after(MS(100), ManualClock::new().clock());
            let scoped = scope(deadline, big);
            assert!(
                std::mem::size_of_val(&scoped) < wrapped + 128,
                "scope({wrapped} bytes) is {} bytes",
                std::mem::size_of_val(&scoped)
            );
        }

        #[tokio::test(start_paused = true)]
        async fn none_outside_any_scope() {
            assert!(current().is_none());
            assert!(with_current(|d| d.is_none()));
        }

        #[tokio::test(start_paused = true)]
        async fn remaining_decreases_as_time_advances() {
            let d = Deadline::after(MS(1000), Clock::tokio());
            scope(d, async {
                tokio::time::advance(MS(300)).await;
                assert_eq!(current().map(|d| d.remaining()), Some(MS(700)));
                tokio::time::sleep(MS(200)).await;
                assert_eq!(with_current(|d| d.map(Deadline::remaining)), Some(MS(500)));
            })
            .await;
            assert!(current().is_none());
        }

        #[tokio::test(start_paused = true)]
        async fn nested_scopes_only_shorten() {
            let clock = Clock::tokio();
            let outer = Deadline::after(MS(500), clock.clone());
            scope(outer, async {
                // A later inner deadline does not extend the outer one.
                scope(Deadline::after(MS(5000), clock.clone()), async {
                    assert_eq!(current().map(|d| d.remaining()), Some(MS(500)));
                })
                .await;
                // An earlier inner deadline wins, and only inside its scope.
                scope(Deadline::after(MS(100), clock.clone()), async {
                    assert_eq!(current().map(|d| d.remaining()), Some(MS(100)));
                })
                .await;
                assert_eq!(current().map(|d| d.remaining()), Some(MS(500)));
            })
            .await;
        }

        #[tokio::test(start_paused = true)]
        async fn spawned_tasks_do_not_inherit() {
            let d = Deadline::after(MS(100), Clock::tokio());
            scope(d.clone(), async move {
                let plain = tokio::spawn(async { current().is_none() });
                assert!(plain.await.expect("task ran"));
                let passed = tokio::spawn(scope(d, async { current().is_some() }));
                assert!(passed.await.expect("task ran"));
            })
            .await;
        }
    }

    fn reserve() -> impl Strategy<Value = Reserve> {
        (0u32..=PPM, 0u64..10_000_000_000).prop_map(|(ppm, fixed)| {
            Reserve::fraction(f64::from(ppm) / f64::from(PPM))
                .unwrap_or(Reserve::NONE)
                .with_fixed(Duration::from_nanos(fixed))
        })
    }

    proptest! {
        #[test]
        fn child_never_exceeds_parent(
            timeout in 0u64..u64::MAX,
            elapsed in 0u64..20_000_000_000,
            reserve in reserve(),
        ) {
            let manual = ManualClock::new();
            let parent = Deadline::after(Duration::from_nanos(timeout), manual.clock());
            manual.advance(Duration::from_nanos(elapsed));
            let child = parent.child(reserve);
            let left = parent.remaining();
            prop_assert!(child.remaining() <= left);
            prop_assert!(child.instant() <= parent.instant());
            prop_assert_eq!(child.remaining(), left.saturating_sub(reserve.kept_from(left)));
        }

        #[test]
        fn kept_is_at_least_the_fixed_part_and_monotonic(
            a in 0u64..u64::MAX,
            b in 0u64..u64::MAX,
            reserve in reserve(),
        ) {
            let (lo, hi) = (Duration::from_nanos(a.min(b)), Duration::from_nanos(a.max(b)));
            prop_assert!(reserve.kept_from(lo) <= reserve.kept_from(hi));
            prop_assert!(reserve.kept_from(lo) >= reserve.with_fixed(Duration::ZERO).kept_from(lo));
        }
    }
}
