//! The wall clock: what the absolute `x-request-deadline` header and anything else that must
//! agree with other hosts (leases, retention in a shared store) read, injectable so that tests
//! under paused time move wall-clock and monotonic time together.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Where this host's wall-clock time comes from: for the absolute `x-request-deadline`
/// header, and for anything else that must agree with other hosts (leases and retention in a
/// shared store). Cheap to clone.
///
/// # Default
///
/// [`WallClock::system`]. Tests under paused tokio time use [`WallClock::fixed`],
/// [`WallClock::from_clock`] or [`WallClock::from_fn`] so that wall-clock and monotonic time
/// move together.
#[derive(Clone)]
pub struct WallClock {
    source: WallSource,
}

#[derive(Clone)]
enum WallSource {
    System,
    Fixed(SystemTime),
    Custom(Arc<dyn Fn() -> SystemTime + Send + Sync>),
}

impl WallClock {
    /// The operating system's wall clock.
    pub const fn system() -> WallClock {
        WallClock {
            source: WallSource::System,
        }
    }

    /// A wall clock that always reads `at`.
    pub const fn fixed(at: SystemTime) -> WallClock {
        WallClock {
            source: WallSource::Fixed(at),
        }
    }

    /// A wall clock read by calling `now`.
    pub fn from_fn(now: impl Fn() -> SystemTime + Send + Sync + 'static) -> WallClock {
        WallClock {
            source: WallSource::Custom(Arc::new(now)),
        }
    }

    /// A wall clock that moves with `clock`: the system's wall time when it was made, plus
    /// however far `clock` has moved since. With a [`ManualClock`](crate::clock::ManualClock)
    /// or tokio's paused clock, wall time then advances exactly as the test advances time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard::clock::ManualClock;
    /// use stormguard::deadline::WallClock;
    ///
    /// let manual = ManualClock::new();
    /// let wall = WallClock::from_clock(manual.clock());
    /// let before = wall.now();
    /// manual.advance(Duration::from_secs(3));
    /// assert_eq!(wall.now().duration_since(before).unwrap(), Duration::from_secs(3));
    /// ```
    pub fn from_clock(clock: crate::clock::Clock) -> WallClock {
        let origin_wall = SystemTime::now();
        let origin = clock.now();
        WallClock::from_fn(move || {
            let moved = clock.now().saturating_duration_since(origin);
            origin_wall.checked_add(moved).unwrap_or(origin_wall)
        })
    }

    /// The current wall-clock time.
    pub fn now(&self) -> SystemTime {
        match &self.source {
            WallSource::System => SystemTime::now(),
            WallSource::Fixed(at) => *at,
            WallSource::Custom(now) => now(),
        }
    }

    /// The current wall-clock time in milliseconds since the Unix epoch (0 before it), as
    /// the `BIGINT` a store keeps.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use stormguard::deadline::WallClock;
    ///
    /// let wall = WallClock::fixed(SystemTime::UNIX_EPOCH + Duration::from_millis(1_500));
    /// assert_eq!(wall.now_millis(), 1_500);
    /// ```
    pub fn now_millis(&self) -> i64 {
        let since = self
            .now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    }
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock::system()
    }
}

impl fmt::Debug for WallClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            WallSource::System => f.write_str("WallClock::system"),
            WallSource::Fixed(at) => f.debug_tuple("WallClock::fixed").field(at).finish(),
            WallSource::Custom(_) => f.write_str("WallClock::from_fn"),
        }
    }
}
