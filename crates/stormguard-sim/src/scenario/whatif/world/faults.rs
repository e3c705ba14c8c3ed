//! The faults in force at one service, read when a request arrives (a request that gets a
//! worker at once starts work with what was read then; one that waited reads them again).
//!
//! A service's injections change what is in force only at their starts and ends, and the
//! event loop's time never goes back, so the faults in force are worked out once per change
//! and kept until the next change point: a read is one comparison, however many injections
//! the service has (most have none, and then the first read covers the whole run).

use super::super::inject::{Fault, Injection};
use crate::time::{Nanos, nanos};

/// The faults in force at a service at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Active {
    pub(super) outage: bool,
    pub(super) p503: f64,
    pub(super) added: Nanos,
    pub(super) scale: f64,
}

impl Active {
    const NONE: Active = Active {
        outage: false,
        p503: 0.0,
        added: 0,
        scale: 1.0,
    };
}

/// One service's injections, and those in force until the next change.
pub(super) struct Faults {
    /// `(start, end, fault)`, in the order given.
    windows: Vec<(Nanos, Nanos, Fault)>,
    /// What is in force from the last instant read until `until` (exclusive).
    active: Active,
    until: Nanos,
}

impl Faults {
    /// The injections of `injections` that hit `service`.
    pub(super) fn of(service: &str, injections: &[Injection]) -> Faults {
        Faults {
            windows: injections
                .iter()
                .filter(|i| i.service == service)
                .map(|i| {
                    let (start, end) = i.window();
                    (start, end, i.fault)
                })
                .collect(),
            active: Active::NONE,
            // Nothing read yet: the first read works it out.
            until: 0,
        }
    }

    /// The faults in force at `now`; `now` never goes back between calls.
    #[inline]
    pub(super) fn at(&mut self, now: Nanos) -> Active {
        if now >= self.until {
            self.refresh(now);
        }
        self.active
    }

    #[cold]
    fn refresh(&mut self, now: Nanos) {
        let mut active = Active::NONE;
        let mut until = Nanos::MAX;
        for &(start, end, fault) in &self.windows {
            if start <= now && now < end {
                match fault {
                    Fault::Outage => active.outage = true,
                    Fault::Errors503(p) => active.p503 = active.p503.max(p),
                    Fault::AddLatency(d) => active.added = active.added.saturating_add(nanos(d)),
                    Fault::ScaleLatency(x) => active.scale *= x,
                }
            }
            for change in [start, end] {
                if change > now {
                    until = until.min(change);
                }
            }
        }
        self.active = active;
        self.until = until;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_between_change_points_sees_what_a_fresh_scan_sees() {
        let injections: Vec<Injection> =
            ["outage:db@2s+1s", "latency*3:db@1s+3s", "503=0.5:x@0s+9s"]
                .iter()
                .map(|i| Injection::parse(i).expect("injection"))
                .collect();
        let mut cached = Faults::of("db", &injections);
        for ms in (0..6000).step_by(250) {
            let now = ms * 1_000_000;
            let mut fresh = Faults::of("db", &injections);
            fresh.refresh(now);
            assert_eq!(cached.at(now), fresh.active, "at {ms} ms");
        }
        assert_eq!(cached.at(Nanos::MAX - 1), Active::NONE);
    }
}
