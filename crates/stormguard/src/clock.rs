//! Where "now" comes from.
//!
//! Every decision stormguard makes is a question about time: is there room for another attempt
//! before the deadline, which slot of a ratio window does this request fall in, how long until
//! the breaker may probe. Reading the time through one injectable [`Clock`] is what lets the
//! same policy objects run in production, in tests under tokio's paused time, and in the
//! simulator on a virtual clock, without a second implementation of any policy.
//!
//! A [`Clock`] is a small handle, cheap to clone, that hands out [`std::time::Instant`]s:
//!
//! - [`Clock::system`] reads the operating system's monotonic clock;
//! - [`Clock::tokio`] reads tokio's clock, which follows `tokio::time::pause` and `advance`;
//! - [`ManualClock`] only moves when told to, for deterministic tests and the simulator.
//!
//! # Coarse readings
//!
//! A precise reading costs about 20 ns on a virtual machine, which is more than a whole retry
//! budget decision should cost. Windows measured in hundreds of milliseconds do not need that
//! precision, so [`Clock::coarse_now`] may lag the precise clock by a few milliseconds. For the
//! system clock it is one relaxed atomic load of a value that a background thread
//! (`stormguard-clock`, started on first use, like `quanta`'s upkeep thread) refreshes every
//! millisecond.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A source of monotonic time, cheap to clone and share.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use stormguard::clock::{Clock, ManualClock};
///
/// let manual = ManualClock::new();
/// let clock: Clock = manual.clock();
/// let start = clock.now();
/// manual.advance(Duration::from_millis(250));
/// assert_eq!(clock.now() - start, Duration::from_millis(250));
/// ```
#[derive(Clone, Debug)]
pub struct Clock {
    source: Source,
}

#[derive(Clone, Debug)]
enum Source {
    System,
    #[cfg(feature = "tokio")]
    Tokio,
    Manual(Arc<ManualState>),
}

impl Clock {
    /// The operating system's monotonic clock.
    pub const fn system() -> Self {
        Clock {
            source: Source::System,
        }
    }

    /// tokio's clock: the same as the system clock, except that it stands still under
    /// `tokio::time::pause` and jumps on `tokio::time::advance` (and auto-advance in paused
    /// tests). Use it wherever sleeps and timeouts run on tokio's timer.
    #[cfg(feature = "tokio")]
    pub const fn tokio() -> Self {
        Clock {
            source: Source::Tokio,
        }
    }

    /// The current instant.
    pub fn now(&self) -> Instant {
        match &self.source {
            Source::System => Instant::now(),
            #[cfg(feature = "tokio")]
            Source::Tokio => tokio::time::Instant::now().into_std(),
            Source::Manual(state) => state.now(),
        }
    }

    /// The current instant, possibly a few milliseconds behind [`Clock::now`] but much cheaper
    /// to read. Suitable for windows of 100 ms and more; never goes backwards.
    pub fn coarse_now(&self) -> Instant {
        match &self.source {
            Source::System => coarse_system_now(),
            _ => self.now(),
        }
    }
}

impl Default for Clock {
    /// [`Clock::tokio`] when the `tokio` feature is on (so paused-time tests see the time their
    /// sleeps see), else [`Clock::system`].
    fn default() -> Self {
        #[cfg(feature = "tokio")]
        {
            Clock::tokio()
        }
        #[cfg(not(feature = "tokio"))]
        {
            Clock::system()
        }
    }
}

/// A clock that moves only when told to: for deterministic tests and the simulator.
///
/// Cloning a `ManualClock` gives another handle to the same time.
#[derive(Clone, Debug)]
pub struct ManualClock {
    state: Arc<ManualState>,
}

#[derive(Debug)]
struct ManualState {
    origin: Instant,
    elapsed_nanos: AtomicU64,
}

impl ManualState {
    fn now(&self) -> Instant {
        self.origin + Duration::from_nanos(self.elapsed_nanos.load(Ordering::Acquire))
    }
}

impl ManualClock {
    /// A clock standing at an arbitrary origin.
    pub fn new() -> Self {
        ManualClock {
            state: Arc::new(ManualState {
                origin: Instant::now(),
                elapsed_nanos: AtomicU64::new(0),
            }),
        }
    }

    /// A [`Clock`] handle that reads this manual time.
    pub fn clock(&self) -> Clock {
        Clock {
            source: Source::Manual(Arc::clone(&self.state)),
        }
    }

    /// Moves time forward by `by` (saturating after about 584 years).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // fetch_update never fails with a closure that always returns Some.
        let _ = self
            .state
            .elapsed_nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                Some(cur.saturating_add(by))
            });
    }

    /// Time elapsed since this clock's origin.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.state.elapsed_nanos.load(Ordering::Acquire))
    }

    /// The instant this clock started at; `origin() + elapsed()` is [`Clock::now`].
    pub fn origin(&self) -> Instant {
        self.state.origin
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

/// A cheap millisecond counter on a [`Clock`], zero when created: the time base of windows
/// measured in hundreds of milliseconds (ratio budgets, breaker windows).
///
/// On the system clock a reading is one relaxed atomic load (see [coarse
/// readings](self#coarse-readings)); on other clocks it is a precise reading.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use stormguard::clock::{CoarseMillis, ManualClock};
///
/// let manual = ManualClock::new();
/// let millis = CoarseMillis::new(manual.clock());
/// manual.advance(Duration::from_millis(1500));
/// assert_eq!(millis.now(), 1500);
/// ```
#[derive(Clone, Debug)]
pub struct CoarseMillis {
    clock: Clock,
    origin: Instant,
    /// For the system clock with its upkeep thread running: the coarse reading at creation.
    upkept_base: Option<u64>,
    /// For a manual clock: its elapsed milliseconds at creation.
    manual_base: u64,
}

impl CoarseMillis {
    /// A counter starting at zero now.
    pub fn new(clock: Clock) -> Self {
        let upkept_base = match clock.source {
            Source::System => coarse_upkeep_running().then(coarse_millis),
            _ => None,
        };
        let manual_base = match &clock.source {
            Source::Manual(state) => state.elapsed_nanos.load(Ordering::Acquire) / 1_000_000,
            _ => 0,
        };
        CoarseMillis {
            origin: clock.now(),
            clock,
            upkept_base,
            manual_base,
        }
    }

    /// Milliseconds since this counter was created (saturating, never decreasing).
    #[inline]
    pub fn now(&self) -> u64 {
        if let Some(base) = self.upkept_base {
            return coarse_millis().saturating_sub(base);
        }
        match &self.clock.source {
            Source::Manual(state) => {
                let millis = state.elapsed_nanos.load(Ordering::Acquire) / 1_000_000;
                millis.saturating_sub(self.manual_base)
            }
            _ => u64::try_from(
                self.clock
                    .now()
                    .saturating_duration_since(self.origin)
                    .as_millis(),
            )
            .unwrap_or(u64::MAX),
        }
    }

    /// The clock this counter reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }
}

/// Process-wide coarse time: milliseconds since `COARSE_ORIGIN`, refreshed every millisecond
/// by the `stormguard-clock` thread.
static COARSE_ORIGIN: OnceLock<Instant> = OnceLock::new();
static COARSE_MILLIS: AtomicU64 = AtomicU64::new(0);
static COARSE_UPKEEP: OnceLock<bool> = OnceLock::new();
const COARSE_TICK: Duration = Duration::from_millis(1);

fn coarse_system_now() -> Instant {
    if coarse_upkeep_running() {
        *COARSE_ORIGIN.get_or_init(Instant::now) + Duration::from_millis(coarse_millis())
    } else {
        Instant::now()
    }
}

#[inline]
fn coarse_millis() -> u64 {
    COARSE_MILLIS.load(Ordering::Relaxed)
}

/// Starts the upkeep thread on first use; false if it could not be started (readings then
/// fall back to the precise clock).
fn coarse_upkeep_running() -> bool {
    *COARSE_UPKEEP.get_or_init(|| {
        let origin = *COARSE_ORIGIN.get_or_init(Instant::now);
        refresh_coarse(origin);
        std::thread::Builder::new()
            .name("stormguard-clock".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(COARSE_TICK);
                    refresh_coarse(origin);
                }
            })
            .is_ok()
    })
}

fn refresh_coarse(origin: Instant) {
    let millis = u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX);
    COARSE_MILLIS.fetch_max(millis, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let manual = ManualClock::new();
        let clock = manual.clock();
        let t0 = clock.now();
        assert_eq!(clock.now(), t0);
        manual.advance(Duration::from_millis(7));
        assert_eq!(clock.now() - t0, Duration::from_millis(7));
        assert_eq!(manual.elapsed(), Duration::from_millis(7));
        assert_eq!(clock.coarse_now(), clock.now());
    }

    #[test]
    fn manual_clock_saturates_instead_of_wrapping() {
        let manual = ManualClock::new();
        manual.advance(Duration::MAX);
        manual.advance(Duration::from_secs(1));
        assert_eq!(manual.elapsed(), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn coarse_system_time_never_runs_ahead_of_precise_time() {
        let clock = Clock::system();
        let coarse = clock.coarse_now();
        assert!(coarse <= clock.now());
        assert!(clock.coarse_now() >= coarse, "coarse time went backwards");
    }

    #[cfg(feature = "tokio")]
    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = Clock::tokio();
        let t0 = clock.now();
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(clock.now() - t0, Duration::from_secs(3));
    }
}
