//! Wall-clock time for leases and retention.
//!
//! Leases and expiry are shared by every instance that uses one store, so they are written as
//! absolute times (milliseconds since the Unix epoch), not as the process-local
//! [`Instant`]s of [`stormguard::clock::Clock`]. The layer reads the time once per store call
//! and passes it into the query; no store asks its database for `NOW()`. That keeps one time
//! base for all stores, and lets tests drive leases and expiry with a
//! [`ManualClock`](stormguard::clock::ManualClock) through [`WallClock::from_clock`].

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use stormguard::clock::Clock;

use crate::store::Millis;

/// A source of wall-clock time in epoch milliseconds.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use stormguard::clock::ManualClock;
/// use stormguard_idempotency::WallClock;
///
/// let manual = ManualClock::new();
/// let wall = WallClock::from_clock(manual.clock());
/// let t0 = wall.now_millis();
/// manual.advance(Duration::from_secs(90));
/// assert_eq!(wall.now_millis() - t0, 90_000);
/// ```
#[derive(Clone, Debug)]
pub struct WallClock {
    source: Source,
}

#[derive(Clone, Debug)]
enum Source {
    System,
    Anchored {
        clock: Clock,
        instant: Instant,
        epoch_millis: Millis,
    },
}

impl WallClock {
    /// The operating system's wall clock (`SystemTime::now`). The default.
    pub const fn system() -> Self {
        WallClock {
            source: Source::System,
        }
    }

    /// A wall clock that reads the system time once, now, and from then on moves with
    /// `clock`: with a [`ManualClock`](stormguard::clock::ManualClock) it moves only when told
    /// to, which is how tests expire leases and keys without sleeping.
    pub fn from_clock(clock: Clock) -> Self {
        let instant = clock.now();
        WallClock {
            source: Source::Anchored {
                clock,
                instant,
                epoch_millis: system_millis(),
            },
        }
    }

    /// The current time in milliseconds since the Unix epoch.
    pub fn now_millis(&self) -> Millis {
        match &self.source {
            Source::System => system_millis(),
            Source::Anchored {
                clock,
                instant,
                epoch_millis,
            } => {
                let since = clock.now().saturating_duration_since(*instant).as_millis();
                epoch_millis.saturating_add(Millis::try_from(since).unwrap_or(Millis::MAX))
            }
        }
    }
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock::system()
    }
}

fn system_millis() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX))
        .unwrap_or(0)
}
