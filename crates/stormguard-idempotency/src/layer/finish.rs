//! Bounding store calls in time, and finishing a key after the handler ran.
//!
//! # Why the finishing writes are retried
//!
//! Once the handler has run, the client gets its answer whatever the store does; what is at
//! stake is the *next* request with the key. If `complete` fails, the key stays in flight until
//! its lease expires: duplicates get `409`, and after the lease a retry takes the key over and
//! runs the handler again. If `release` fails, retries get `409` until then. Both writes are
//! compare-and-set on the lease token, so repeating them is safe, and a broken pooled
//! connection or a dropped Redis connection usually succeeds on the next try. So they get up
//! to three attempts (10 ms, then 20 ms apart, jittered) with stormguard's own [`Retrier`],
//! all within one store timeout. `begin` is not retried here: it fails closed (`503`), and the
//! client's retry is the retry.

use std::time::Duration;

use stormguard::backoff::{Backoff, Jitter};
use stormguard::classify::Outcome;
use stormguard::retry::{Failure, Retrier, RetryPolicy};

use super::Config;
use super::service::{Shared, millis};
use crate::store::{Completion, Finish, LeaseToken, ScopedKey, StoreError, StoreFuture};

/// The retrier of the finishing writes.
pub(super) struct Finisher {
    retrier: Retrier,
}

impl Finisher {
    pub(super) fn new() -> Self {
        let backoff = Backoff::exponential(Duration::from_millis(10))
            .with_cap(Duration::from_millis(40))
            .with_jitter(Jitter::Equal);
        Finisher {
            retrier: Retrier::new(
                RetryPolicy::new(3)
                    .with_backoff(backoff)
                    .with_idempotent(true)
                    .with_min_call(Duration::ZERO),
            )
            .expect("three attempts with an equal-jitter backoff of 10..=40 ms is a valid policy"),
        }
    }

    /// `f`, or [`StoreError::Timeout`] after the configured store timeout.
    pub(super) async fn timed<T>(
        &self,
        config: &Config,
        f: StoreFuture<'_, T>,
    ) -> Result<T, StoreError> {
        let limit = config.store_timeout;
        match tokio::time::timeout(limit, f).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(limit)),
        }
    }

    /// Runs a fenced write with retries, all within one store timeout.
    async fn write<'a>(
        &self,
        config: &Config,
        mut op: impl FnMut() -> StoreFuture<'a, Finish>,
    ) -> Result<Finish, StoreError> {
        let retried = self.retrier.run(
            |_| op(),
            |r: &Result<Finish, StoreError>| match r {
                Ok(_) => Outcome::Success,
                Err(StoreError::Backend(_) | StoreError::Contention(_)) => Outcome::InDoubt,
                Err(_) => Outcome::NeverRetry,
            },
        );
        let limit = config.store_timeout;
        match tokio::time::timeout(limit, retried).await {
            Ok(Ok(finish)) => Ok(finish),
            Ok(Err(e)) => Err(match e.into_last() {
                Failure::Error(e) => e,
                Failure::TimedOut(_) | Failure::Refused(_) => StoreError::Timeout(limit),
            }),
            Err(_) => Err(StoreError::Timeout(limit)),
        }
    }
}

impl Shared {
    pub(super) async fn complete(
        &self,
        key: &ScopedKey,
        token: LeaseToken,
        completion: &Completion,
    ) {
        let cfg = &self.config;
        let done = self
            .finisher
            .write(cfg, || {
                let now = cfg.clock.now_millis();
                let expires_at = now.saturating_add(millis(cfg.retention.max(cfg.lease)));
                self.store.complete(key, token, completion, now, expires_at)
            })
            .await;
        match done {
            Ok(Finish::Done) => {}
            Ok(Finish::LeaseLost) => tracing::warn!(
                key = key.key().as_str(),
                "idempotency lease was taken over before this request completed; \
                 its response is returned but not stored (the other holder's record stands)"
            ),
            Err(e) => tracing::error!(
                error = %e,
                key = key.key().as_str(),
                "could not store the idempotent response; the key stays in flight until its lease expires"
            ),
        }
    }

    pub(super) async fn release(&self, key: &ScopedKey, token: LeaseToken, why: &str) {
        let done = self
            .finisher
            .write(&self.config, || self.store.release(key, token))
            .await;
        match done {
            Ok(Finish::Done) => {
                tracing::debug!(key = key.key().as_str(), why, "idempotency key released")
            }
            Ok(Finish::LeaseLost) => tracing::warn!(
                key = key.key().as_str(),
                why,
                "idempotency lease was taken over before release"
            ),
            Err(e) => tracing::error!(
                error = %e,
                key = key.key().as_str(),
                why,
                "could not release the idempotency key; it stays in flight until its lease expires"
            ),
        }
    }
}
