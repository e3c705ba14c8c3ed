//! What a retrier is allowed to do: attempts, backoff, per-try timeout, minimum call time.

use std::time::Duration;

use crate::backoff::{Backoff, InvalidBackoff};

/// The static part of a retry policy, shared by every call that uses it.
///
/// # Default
///
/// [`RetryPolicy::new`] starts with [`Backoff::exponential`] from 100 ms (full jitter, cap
/// 30 s), no per-try timeout, no minimum call time, and operations treated as *not*
/// idempotent (an in-doubt failure is then not retried unless the call carries an
/// idempotency key).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use stormguard::backoff::Backoff;
/// use stormguard::retry::RetryPolicy;
///
/// let policy = RetryPolicy::new(5)
///     .with_backoff(Backoff::exponential(Duration::from_millis(20)).with_cap(Duration::from_millis(200)))
///     .with_min_call(Duration::from_millis(60));
/// policy.validate()?;
/// assert_eq!(policy.max_attempts(), 5);
/// # Ok::<(), stormguard::retry::InvalidPolicy>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    max_attempts: u32,
    backoff: Backoff,
    per_try_timeout: Option<Duration>,
    min_call: Duration,
    idempotent: bool,
}

/// Why a [`RetryPolicy`] was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InvalidPolicy {
    /// `max_attempts` counts the first attempt too, so it must be at least 1.
    #[error("max_attempts must be at least 1 (it counts the first attempt)")]
    MaxAttempts,
    /// A per-try timeout of zero would fail every attempt before it starts.
    #[error("per_try_timeout must be above zero")]
    ZeroPerTryTimeout,
    /// The backoff is invalid.
    #[error("invalid backoff: {0}")]
    Backoff(#[from] InvalidBackoff),
}

impl RetryPolicy {
    /// At most `max_attempts` attempts in all (gRPC's `maxAttempts`: 1 means no retry).
    pub const fn new(max_attempts: u32) -> Self {
        RetryPolicy {
            max_attempts,
            backoff: Backoff::exponential(Duration::from_millis(100)),
            per_try_timeout: None,
            min_call: Duration::ZERO,
            idempotent: false,
        }
    }

    /// Sets the backoff between attempts.
    pub const fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Bounds every attempt by `min(per_try_timeout, remaining deadline)`. Without it the
    /// retrier arms no timer and reads no clock on the success path.
    pub const fn with_per_try_timeout(mut self, timeout: Duration) -> Self {
        self.per_try_timeout = Some(timeout);
        self
    }

    /// The shortest time an attempt needs to be useful: a retry is not started when the
    /// deadline leaves less than `backoff delay + min_call`.
    pub const fn with_min_call(mut self, min_call: Duration) -> Self {
        self.min_call = min_call;
        self
    }

    /// Declares the operation idempotent, so in-doubt failures (a timeout or reset after the
    /// request was sent) may be retried without an idempotency key.
    pub const fn with_idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = idempotent;
        self
    }

    /// Checks every field; see [`InvalidPolicy`].
    pub fn validate(&self) -> Result<(), InvalidPolicy> {
        if self.max_attempts == 0 {
            return Err(InvalidPolicy::MaxAttempts);
        }
        if self.per_try_timeout == Some(Duration::ZERO) {
            return Err(InvalidPolicy::ZeroPerTryTimeout);
        }
        self.backoff.validate()?;
        Ok(())
    }

    /// Attempts in all, the first included.
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The backoff between attempts.
    pub const fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// The per-try timeout, if any.
    pub const fn per_try_timeout(&self) -> Option<Duration> {
        self.per_try_timeout
    }

    /// The time one attempt may take: `min(per_try_timeout, remaining)`, or `None` when no
    /// per-try timeout is set (the attempt is then bounded only by whoever enforces the
    /// deadline). `remaining` is the time left before the deadline, if there is one.
    pub fn attempt_timeout(&self, remaining: Option<Duration>) -> Option<Duration> {
        self.per_try_timeout
            .map(|per_try| remaining.map_or(per_try, |left| left.min(per_try)))
    }

    /// The minimum useful call time.
    pub const fn min_call(&self) -> Duration {
        self.min_call
    }

    /// Whether operations under this policy are idempotent by default.
    pub const fn idempotent(&self) -> bool {
        self.idempotent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_each_rule() {
        assert_eq!(
            RetryPolicy::new(0).validate(),
            Err(InvalidPolicy::MaxAttempts)
        );
        assert_eq!(
            RetryPolicy::new(3)
                .with_per_try_timeout(Duration::ZERO)
                .validate(),
            Err(InvalidPolicy::ZeroPerTryTimeout)
        );
        assert!(matches!(
            RetryPolicy::new(3)
                .with_backoff(
                    Backoff::fixed(Duration::from_secs(2)).with_cap(Duration::from_secs(1))
                )
                .validate(),
            Err(InvalidPolicy::Backoff(InvalidBackoff::CapBelowBase { .. }))
        ));
        assert!(RetryPolicy::new(1).validate().is_ok());
    }

    #[test]
    fn attempt_timeout_is_the_smaller_of_per_try_and_remaining() {
        let ms = Duration::from_millis;
        let policy = RetryPolicy::new(3).with_per_try_timeout(ms(300));
        assert_eq!(policy.attempt_timeout(None), Some(ms(300)));
        assert_eq!(policy.attempt_timeout(Some(ms(200))), Some(ms(200)));
        assert_eq!(policy.attempt_timeout(Some(ms(900))), Some(ms(300)));
        assert_eq!(RetryPolicy::new(3).attempt_timeout(Some(ms(5))), None);
    }
}
