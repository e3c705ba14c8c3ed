//! What the server layer counts: refusals, cancellations and bad headers, read with
//! [`DeadlineLayer::stats`](crate::deadline::DeadlineLayer::stats), and the same events as metrics.

use std::sync::atomic::{AtomicU64, Ordering};

use stormguard::deadline::{DeadlineHeader, DeadlineHeaders};

/// Counters of the server layer, read with [`DeadlineLayer::stats`](crate::deadline::DeadlineLayer::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerStats {
    /// Requests refused on arrival because their deadline had already passed, or left less
    /// than the minimum time ([`DeadlineLayer::with_min_remaining`](crate::deadline::DeadlineLayer::with_min_remaining)).
    pub refused_expired: u64,
    /// Handlers cancelled because the deadline passed while they ran.
    pub cancelled: u64,
    /// Requests refused because of a malformed deadline header ([`MalformedPolicy::Reject`](crate::deadline::MalformedPolicy::Reject)).
    pub rejected_malformed: u64,
    /// Malformed or repeated deadline headers seen, whatever the policy.
    pub malformed_headers: u64,
    /// Per header, in [`DeadlineHeaders::ALL`] order.
    malformed_by_header: [u64; 4],
}

/// The position of `header` in [`DeadlineHeaders::ALL`]: the index of its counter.
fn slot(header: DeadlineHeader) -> Option<usize> {
    DeadlineHeaders::ALL.iter().position(|h| h == header)
}

impl ServerStats {
    /// Malformed or repeated values of `header` seen.
    pub fn malformed(&self, header: DeadlineHeader) -> u64 {
        slot(header)
            .and_then(|i| self.malformed_by_header.get(i))
            .copied()
            .unwrap_or(0)
    }
}

/// The live counters behind [`ServerStats`], shared by a layer and every service it made.
#[derive(Debug, Default)]
pub(super) struct ServerCounters {
    refused_expired: AtomicU64,
    cancelled: AtomicU64,
    rejected_malformed: AtomicU64,
    malformed: [AtomicU64; 4],
}

impl ServerCounters {
    /// A malformed or repeated `header` was seen.
    pub(super) fn header_error(&self, header: DeadlineHeader) {
        if let Some(counter) = slot(header).and_then(|i| self.malformed.get(i)) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        metrics::counter!(crate::metric_names::DEADLINE_HEADER_ERRORS, "header" => header.name())
            .increment(1);
    }

    /// A request was refused on arrival: expired, or below the minimum time left.
    pub(super) fn refused_expired(&self) {
        Self::dropped(&self.refused_expired);
    }

    /// A handler was cancelled when the deadline passed.
    pub(super) fn cancelled(&self) {
        Self::dropped(&self.cancelled);
    }

    /// A request was refused for a malformed deadline header.
    pub(super) fn rejected_malformed(&self) {
        self.rejected_malformed.fetch_add(1, Ordering::Relaxed);
    }

    fn dropped(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(crate::metric_names::DEADLINE_DROPS, "side" => "server").increment(1);
    }

    /// The counts so far.
    pub(super) fn snapshot(&self) -> ServerStats {
        let malformed_by_header = [0, 1, 2, 3].map(|i| {
            self.malformed
                .get(i)
                .map_or(0, |c| c.load(Ordering::Relaxed))
        });
        ServerStats {
            refused_expired: self.refused_expired.load(Ordering::Relaxed),
            cancelled: self.cancelled.load(Ordering::Relaxed),
            rejected_malformed: self.rejected_malformed.load(Ordering::Relaxed),
            malformed_headers: malformed_by_header.iter().sum(),
            malformed_by_header,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_slots_follow_the_header_list() {
        let headers = [
            DeadlineHeader::GrpcTimeout,
            DeadlineHeader::ConnectTimeoutMs,
            DeadlineHeader::EnvoyExpectedRqTimeoutMs,
            DeadlineHeader::RequestDeadline,
        ];
        let slots: Vec<_> = headers.iter().map(|&h| slot(h)).collect();
        assert_eq!(slots, [Some(0), Some(1), Some(2), Some(3)]);
    }
}
