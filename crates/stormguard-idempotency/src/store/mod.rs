//! The one [`Store`] trait every backend implements, and the records it keeps.
//!
//! # The record and its life
//!
//! A record is keyed by `(tenant, key)` ([`ScopedKey`]) and is in one of two states:
//!
//! - **in flight**: a holder has taken a lease until `lease_until` with a fencing
//!   [`LeaseToken`]; it keeps the request [`Fingerprint`];
//! - **completed**: it keeps the response to replay ([`Completion`]).
//!
//! [`Store::begin`] atomically either creates an in-flight record (the caller runs the handler)
//! or reports what is there. A record whose lease has expired is *taken over*: it gets the new
//! caller's token, which is what makes the old holder's [`Store::complete`] fail with
//! [`Finish::LeaseLost`]. A record whose retention has passed is treated as absent and
//! replaced, and [`Store::reap`] deletes such records in bounded batches.
//!
//! All times are epoch milliseconds chosen by the caller (see [`WallClock`](stormguard::deadline::WallClock)); no store reads
//! its server's clock for a decision.
//!
//! # Pools
//!
//! The SQL stores' own pools (`connect`, `open`) do not ping a connection before handing it out
//! (sqlx's `test_before_acquire`, on by default, would double the round trips of every
//! statement); a connection that died while idle fails its next statement instead, which
//! `begin` reports as a store failure (`503`, the client retries) and the finishing writes
//! retry up to three times.
//!
//! # Implementing a store
//!
//! Every store must make `begin`, `complete` and `release` atomic with respect to each other
//! for one key, across processes. The conformance suite in `tests/conformance` runs every
//! behaviour of the layer against each store; a new store should be added there.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use sha2::{Digest, Sha256};
use stormguard::retry::IdempotencyKey;

use crate::fingerprint::Fingerprint;

#[doc(hidden)]
pub mod codec;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sql")]
pub(crate) mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// The future a [`Store`] method returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// An idempotency key within the scope of one tenant or principal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScopedKey {
    tenant: Arc<str>,
    key: IdempotencyKey,
}

impl ScopedKey {
    /// The longest tenant stored as is; longer tenants are stored hashed.
    pub const MAX_TENANT_LEN: usize = 255;

    /// What a hashed tenant starts with: `sha256:` and 64 hex digits follow.
    pub const HASHED_TENANT_PREFIX: &'static str = "sha256:";

    /// `key` in the scope of `tenant` (use `""` for an application without tenants).
    ///
    /// The stored form of the tenant is one-to-one (up to SHA-256 collisions): a tenant is
    /// kept as is unless it is longer than [`MAX_TENANT_LEN`](Self::MAX_TENANT_LEN), starts
    /// with [`HASHED_TENANT_PREFIX`](Self::HASHED_TENANT_PREFIX) or contains a NUL byte
    /// (which PostgreSQL's `TEXT` cannot hold); those are stored as `sha256:<hex>` of the
    /// tenant. A tenant that *spells* a hash is itself hashed, so it can never share a scope
    /// with the long tenant whose hash it spells.
    ///
    /// ```
    /// use stormguard::retry::IdempotencyKey;
    /// use stormguard_idempotency::ScopedKey;
    ///
    /// let key = IdempotencyKey::new("order-17").unwrap();
    /// let long = "t".repeat(300);
    /// let hashed = ScopedKey::new(&long, key.clone());
    /// assert!(hashed.tenant().starts_with("sha256:"));
    /// // A short tenant that is literally that string gets a scope of its own.
    /// let spoof = ScopedKey::new(hashed.tenant(), key.clone());
    /// assert_ne!(spoof.tenant(), hashed.tenant());
    /// assert_eq!(ScopedKey::new("acme", key).tenant(), "acme");
    /// ```
    pub fn new(tenant: &str, key: IdempotencyKey) -> Self {
        ScopedKey {
            tenant: Self::stored_tenant(tenant),
            key,
        }
    }

    fn stored_tenant(tenant: &str) -> Arc<str> {
        let as_is = tenant.len() <= Self::MAX_TENANT_LEN
            && !tenant.starts_with(Self::HASHED_TENANT_PREFIX)
            && !tenant.contains('\0');
        if as_is {
            return Arc::from(tenant);
        }
        Arc::from(format!(
            "{}{}",
            Self::HASHED_TENANT_PREFIX,
            crate::fingerprint::hex(&Sha256::digest(tenant.as_bytes()))
        ))
    }

    /// The tenant as stored (at most 255 bytes).
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }
}

/// A fencing token: proof of holding the lease on one in-flight record.
///
/// Tokens are random and new for every acquisition, so a holder whose lease was taken over (or
/// whose record was released and created again) never matches the record any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseToken(pub i64);

impl LeaseToken {
    /// A fresh random token (positive, never zero).
    pub fn random() -> Self {
        let v: i64 = rand::random::<i64>() & i64::MAX;
        LeaseToken(v.max(1))
    }
}

/// The arguments of [`Store::begin`].
#[derive(Clone, Copy, Debug)]
pub struct BeginRequest<'a> {
    /// The key.
    pub key: &'a ScopedKey,
    /// The fingerprint of this request.
    pub fingerprint: &'a Fingerprint,
    /// The token to hold the lease with if this call acquires it.
    pub token: LeaseToken,
    /// The current time.
    pub now: Millis,
    /// When the lease taken by this call expires.
    pub lease_until: Millis,
    /// When the record expires (retention), counted from now; completion sets it again.
    pub expires_at: Millis,
}

/// What [`Store::begin`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// The caller holds the lease and runs the handler.
    Acquired {
        /// Whether an earlier holder's lease had expired and was taken over.
        took_over: bool,
    },
    /// Another holder's lease is live.
    InFlight {
        /// When that lease expires.
        lease_until: Millis,
    },
    /// The key is in use (in flight or completed) with another request fingerprint.
    Mismatch,
    /// The key has completed: replay this.
    Completed(Completion),
}

/// How a key completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The response, to replay byte for byte.
    Response(StoredResponse),
    /// The handler answered `status`, but the response was over the size cap and was not
    /// kept ([`Oversize::Mark`](crate::Oversize::Mark)).
    TooLarge {
        /// The status the handler answered.
        status: StatusCode,
    },
    /// The handler answered `status`, but its response body failed before it was stored; the
    /// request was processed and is not processed again.
    BodyFailed {
        /// The status the handler answered.
        status: StatusCode,
    },
}

/// A response as stored for replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// The status code.
    pub status: StatusCode,
    /// The allow-listed headers, in order.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The whole body.
    pub body: Bytes,
}

/// What [`Store::complete`] and [`Store::release`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The caller still held the lease; the record was completed (or released).
    Done,
    /// The caller's token no longer matches: its lease was taken over, or the record was
    /// released or reaped. Nothing was written.
    LeaseLost,
}

impl Finish {
    /// The result of a write fenced by a lease token: `matched` is how many records the
    /// token matched (rows affected, or a script's count) — one means the caller held it.
    /// Only the database stores fence by count; the in-memory store compares tokens itself.
    #[cfg(any(feature = "sql", feature = "redis"))]
    pub(crate) fn fenced(matched: u64) -> Self {
        if matched == 1 {
            Finish::Done
        } else {
            Finish::LeaseLost
        }
    }
}

/// What one [`Store::reap`] call removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Records deleted.
    pub removed: u64,
    /// Whether more expired records may remain (the batch was full, or a scan is not done).
    pub more: bool,
}

/// A store operation failed; the layer answers `503` (fail closed) unless told otherwise.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend failed (connection, query, protocol).
    #[error("idempotency store backend error: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The operation did not finish within the layer's store timeout.
    #[error("idempotency store did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// An operation kept losing races for one key (or kept deadlocking) and gave up.
    #[error("idempotency store gave up after repeated contention: {0}")]
    Contention(String),
    /// A record could not be decoded.
    #[error("idempotency store holds a record it cannot decode: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Wraps a backend error.
    pub fn backend(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Backend(Box::new(e))
    }
}

#[cfg(feature = "sql")]
impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::backend(e)
    }
}

/// Where idempotency records live.
///
/// The methods return boxed futures so that `Arc<dyn Store>` works: the layer holds its store
/// that way, and one binary can pick its store from configuration.
pub trait Store: Send + Sync + 'static {
    /// Atomically: create an in-flight record held with `req.token` if there is none (or the
    /// one there has passed its retention, or its lease has expired and the fingerprint
    /// matches), else report what is there.
    fn begin<'a>(&'a self, req: BeginRequest<'a>) -> StoreFuture<'a, Begin>;

    /// Completes an in-flight record held with `token`: stores `completion` and keeps the
    /// record until `expires_at`. [`Finish::LeaseLost`] if the token no longer matches.
    fn complete<'a>(
        &'a self,
        key: &'a ScopedKey,
        token: LeaseToken,
        completion: &'a Completion,
        now: Millis,
        expires_at: Millis,
    ) -> StoreFuture<'a, Finish>;

    /// Deletes an in-flight record held with `token`, so the next request with the key runs
    /// again. [`Finish::LeaseLost`] if the token no longer matches.
    fn release<'a>(&'a self, key: &'a ScopedKey, token: LeaseToken) -> StoreFuture<'a, Finish>;

    /// Deletes at most `limit` records whose retention ended at or before `now`.
    fn reap(&self, now: Millis, limit: u32) -> StoreFuture<'_, Reaped>;
}

impl<S: Store + ?Sized> Store for Arc<S> {
    fn begin<'a>(&'a self, req: BeginRequest<'a>) -> StoreFuture<'a, Begin> {
        (**self).begin(req)
    }

    fn complete<'a>(
        &'a self,
        key: &'a ScopedKey,
        token: LeaseToken,
        completion: &'a Completion,
        now: Millis,
        expires_at: Millis,
    ) -> StoreFuture<'a, Finish> {
        (**self).complete(key, token, completion, now, expires_at)
    }

    fn release<'a>(&'a self, key: &'a ScopedKey, token: LeaseToken) -> StoreFuture<'a, Finish> {
        (**self).release(key, token)
    }

    fn reap(&self, now: Millis, limit: u32) -> StoreFuture<'_, Reaped> {
        (**self).reap(now, limit)
    }
}
