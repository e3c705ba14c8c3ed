//! What happened when, as the servers and the clients saw it: one shared record, binned.
//!
//! Every instant is an offset from the run's start on tokio's clock, so the same record is
//! written under real time (the demo) and under paused time (the test) and reads the same.
//! Requests are binned by the instant they *started*: a request that began under the old
//! policy and failed after the switch counts where it began, which is what "users see errors
//! only until the switch" means.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How a user's request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The CDN answered.
    Cdn,
    /// The client stack gave up and its fallback answered from the backup source.
    Backup,
    /// The user saw an error.
    Error,
}

/// One request as its instance saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// When it started, from the run's start.
    pub(crate) at: Duration,
    /// The center version the instance was running when it started (`None`: none yet).
    pub(crate) version: Option<u64>,
    /// How it ended.
    pub(crate) answer: Answer,
    /// Attempts the client stack sent for it, the first included.
    pub(crate) attempts: u32,
}

/// Something that happened once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mark {
    /// The CDN stand-in was switched to answer 504.
    CdnFailing,
    /// The CDN stand-in answered its first 504 of the outage.
    First504,
    /// The CDN stand-in was switched back to serving.
    CdnRecovered,
    /// A client instance began to run a center version.
    Applied {
        /// The instance (0-based).
        instance: usize,
        /// The version.
        version: u64,
    },
}

/// The whole record of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Record {
    /// Every user request, in the order they ended.
    pub(crate) requests: Vec<Request>,
    /// Requests the CDN stand-in answered 504, by instant.
    pub(crate) cdn_504s: Vec<Duration>,
    /// Marks, in order.
    pub(crate) marks: Vec<(Duration, Mark)>,
}

/// The shared, growing record of a run; cloned out whole at the end.
#[derive(Debug)]
pub(crate) struct Timeline {
    start: Mutex<Instant>,
    record: Mutex<Record>,
    /// Attempts of the calls that ended, by request id, until their request is recorded.
    attempts: Mutex<HashMap<String, u32>>,
}

impl Timeline {
    /// A record whose offsets count from now.
    pub(crate) fn start_now() -> Timeline {
        Timeline {
            start: Mutex::new(Instant::now()),
            record: Mutex::new(Record::default()),
            attempts: Mutex::new(HashMap::new()),
        }
    }

    /// Starts counting from now: what was recorded so far (the set-up) happened at 0.
    pub(crate) fn restart(&self) {
        *lock(&self.start) = Instant::now();
        self.with(|r| {
            for (at, _) in &mut r.marks {
                *at = Duration::ZERO;
            }
        });
    }

    /// Now, from the run's start.
    pub(crate) fn now(&self) -> Duration {
        lock(&self.start).elapsed()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Record) -> T) -> T {
        f(&mut lock(&self.record))
    }

    /// Records a user request that ended.
    pub(crate) fn request(&self, request: Request) {
        self.with(|r| r.requests.push(request));
    }

    /// Notes that the client stack's call for request `id` ended after `attempts` attempts.
    pub(crate) fn call_ended(&self, id: &str, attempts: u32) {
        lock(&self.attempts).insert(id.to_owned(), attempts);
    }

    /// The attempts noted for request `id` (0: no call was made, or it did not end), and
    /// forgets them.
    pub(crate) fn take_attempts(&self, id: &str) -> u32 {
        lock(&self.attempts).remove(id).unwrap_or(0)
    }

    /// Records a 504 answered by the CDN stand-in (the first of the outage is marked).
    pub(crate) fn cdn_504(&self) {
        let at = self.now();
        self.with(|r| {
            let outage_began = r
                .marks
                .iter()
                .rev()
                .find(|(_, m)| matches!(m, Mark::CdnFailing | Mark::CdnRecovered))
                .map(|(t, _)| *t);
            let first = r.cdn_504s.last().is_none_or(|t| Some(*t) < outage_began);
            if first {
                r.marks.push((at, Mark::First504));
            }
            r.cdn_504s.push(at);
        });
    }

    /// Records a mark now.
    pub(crate) fn mark(&self, mark: Mark) {
        let at = self.now();
        self.with(|r| r.marks.push((at, mark)));
    }

    /// The record so far.
    pub(crate) fn snapshot(&self) -> Record {
        self.with(|r| r.clone())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Record {
    /// The instant of the first mark that `matches`.
    pub(crate) fn first(&self, matches: impl Fn(&Mark) -> bool) -> Option<Duration> {
        self.marks.iter().find(|(_, m)| matches(m)).map(|(t, _)| *t)
    }

    /// The instant by which every one of `instances` ran `version` (`None` if one never did).
    pub(crate) fn all_applied(&self, instances: usize, version: u64) -> Option<Duration> {
        (0..instances)
            .map(|i| {
                self.first(|m| {
                    *m == Mark::Applied {
                        instance: i,
                        version,
                    }
                })
            })
            .try_fold(Duration::ZERO, |latest, t| t.map(|t| latest.max(t)))
    }

    /// The version `instance` ran at `at` (the last applied at or before it).
    pub(crate) fn version_at(&self, instance: usize, at: Duration) -> Option<u64> {
        self.marks
            .iter()
            .take_while(|(t, _)| *t <= at)
            .filter_map(|(_, m)| match m {
                Mark::Applied {
                    instance: i,
                    version,
                } if *i == instance => Some(*version),
                _ => None,
            })
            .last()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn versions_and_switch_instants_are_read_from_the_marks() {
        let record = Record {
            marks: vec![
                (
                    at(1),
                    Mark::Applied {
                        instance: 0,
                        version: 1,
                    },
                ),
                (
                    at(1),
                    Mark::Applied {
                        instance: 1,
                        version: 1,
                    },
                ),
                (
                    at(5),
                    Mark::Applied {
                        instance: 1,
                        version: 2,
                    },
                ),
                (
                    at(6),
                    Mark::Applied {
                        instance: 0,
                        version: 2,
                    },
                ),
            ],
            ..Record::default()
        };
        assert_eq!(record.all_applied(2, 2), Some(at(6)));
        assert_eq!(record.all_applied(2, 3), None);
        assert_eq!(record.all_applied(3, 1), None, "instance 2 never ran it");
        assert_eq!(record.version_at(0, at(5)), Some(1));
        assert_eq!(record.version_at(1, at(5)), Some(2));
        assert_eq!(record.version_at(0, Duration::ZERO), None);
    }
}
