//! The virtual clock that time-windowed budgets read.
//!
//! The core's [`RatioBudget`](stormguard::budget::RatioBudget) reads time through a
//! [`Clock`]; the simulator hands it a [`ManualClock`] and moves that clock to each event's
//! instant before the event is handled. So the budget sees exactly the simulated time, and the
//! same budget code that runs in production decides here.

use stormguard::clock::{Clock, ManualClock};

use crate::time::{Nanos, duration};

/// A [`ManualClock`] that follows the event loop's `now`.
///
/// Moving a [`ManualClock`] is an atomic read-modify-write; a run in which nothing reads the
/// clock (no ratio budget) makes its clock with [`VirtualClock::unread`] and saves it on
/// every event.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use stormguard_sim::vclock::VirtualClock;
///
/// let mut vc = VirtualClock::new();
/// let clock = vc.clock();
/// let t0 = clock.now();
/// vc.advance_to(1_500_000_000);
/// assert_eq!(clock.now() - t0, Duration::from_millis(1500));
/// vc.advance_to(10); // time never goes back
/// assert_eq!(vc.now(), 1_500_000_000);
/// ```
#[derive(Debug)]
pub struct VirtualClock {
    manual: ManualClock,
    now: Nanos,
    read: bool,
}

impl Default for VirtualClock {
    fn default() -> Self {
        VirtualClock {
            manual: ManualClock::new(),
            now: 0,
            read: true,
        }
    }
}

impl VirtualClock {
    /// A clock at virtual time zero.
    pub fn new() -> Self {
        VirtualClock::default()
    }

    /// A clock at virtual time zero that nothing will read: [`advance_to`] only records
    /// `now`, and the [`Clock`] handles it gives out stay at zero.
    ///
    /// [`advance_to`]: VirtualClock::advance_to
    pub fn unread() -> Self {
        VirtualClock {
            read: false,
            ..VirtualClock::default()
        }
    }

    /// A clock that budgets will read if `read`, else [`VirtualClock::unread`].
    pub fn read_if(read: bool) -> Self {
        if read {
            VirtualClock::new()
        } else {
            VirtualClock::unread()
        }
    }

    /// A [`Clock`] handle for budgets.
    pub fn clock(&self) -> Clock {
        self.manual.clock()
    }

    /// Moves to `t` if `t` is later than now.
    #[inline]
    pub fn advance_to(&mut self, t: Nanos) {
        if t > self.now {
            if self.read {
                self.manual.advance(duration(t - self.now));
            }
            self.now = t;
        }
    }

    /// The current virtual time.
    pub fn now(&self) -> Nanos {
        self.now
    }
}
