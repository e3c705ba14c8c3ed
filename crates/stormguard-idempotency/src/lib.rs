//! Server-side `Idempotency-Key` middleware for tower and axum, and the exactly-once helpers a
//! payment-style endpoint needs behind it.
//!
//! A client retry after a timeout is only safe when the server recognises the repeat. This crate
//! implements the IETF httpapi *Idempotency-Key* draft as a tower [`Layer`](tower_layer::Layer)
//! ([`IdempotencyLayer`]) over one [`Store`] trait with four real stores:
//!
//! | feature | store | for |
//! | --- | --- | --- |
//! | `sqlite` (default) | [`SqliteStore`](store::sqlite::SqliteStore) | one instance; embedded, WAL, file or memory |
// A store's name links to it only when its feature compiles it (a link to an item that is not
// there breaks `cargo doc` without that feature).
#![cfg_attr(
    feature = "postgres",
    doc = "| `postgres` | [`PostgresStore`](store::postgres::PostgresStore) | several instances |"
)]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "| `postgres` | `PostgresStore` | several instances |"
)]
#![cfg_attr(
    feature = "mysql",
    doc = "| `mysql` | [`MySqlStore`](store::mysql::MySqlStore) | several instances (MySQL and MariaDB) |"
)]
#![cfg_attr(
    not(feature = "mysql"),
    doc = "| `mysql` | `MySqlStore` | several instances (MySQL and MariaDB) |"
)]
#![cfg_attr(
    feature = "redis",
    doc = "| `redis` | [`RedisStore`](store::redis::RedisStore) | several instances; `SET NX PX` + Lua compare-and-complete |"
)]
#![cfg_attr(
    not(feature = "redis"),
    doc = "| `redis` | `RedisStore` | several instances; `SET NX PX` + Lua compare-and-complete |"
)]
//!
//! # What the layer does
//!
//! For each request whose method it covers (`POST` and `PATCH` by default):
//!
//! 1. a missing key → `400` (problem+json) when the key is required (the default); a malformed
//!    key (not an sf-string, empty, over 255 characters, or the header repeated) → `400`. The
//!    key is read by [`stormguard_tower::wire::idempotency_key`], the same parser the retrying
//!    client decides with, so a key our client treats as valid is one this server accepts;
//! 2. the key is scoped by the tenant/principal that an application closure extracts
//!    ([`IdempotencyLayer::with_tenant`]), and the request gets a [`Fingerprint`]: method,
//!    path and query, and the SHA-256 of the canonical body (JSON with sorted keys), extensible
//!    with [`Fingerprinter`];
//! 3. the store *begins* the key: a new key takes a lease with a fresh random fencing token and
//!    the handler runs (the lease follows the request's deadline when it has one: see
//!    [`LeaseDeadline`]); a completed key is replayed byte for byte (status, body, every
//!    end-to-end header but `Set-Cookie`: see [`ReplayedHeaders`]) with
//!    `Idempotent-Replayed: true`; a key in flight → `409` with `Retry-After: 1` (or, with
//!    [`InFlight::Wait`], wait for the result and replay it); the same key with another
//!    fingerprint → `422`; a key whose lease has expired (its holder crashed) is taken over;
//! 4. the handler that took the key runs in a task of its own, to its end even when its client
//!    goes away (a per-try timeout, a dropped connection): it may already have taken effect,
//!    so its answer must be stored for the client's retry instead of running it again;
//! 5. the handler's response is stored when the [`StorePolicy`] says so (2xx by default) and it
//!    fits the size cap; completion is fenced by the lease token, so a stale holder whose lease
//!    was taken over cannot overwrite the new holder's record. Responses that are not stored
//!    release the key so a retry runs again.
//!
//! A store failure fails closed: `503` and the handler does not run
//! ([`FailureMode::Open`] is an explicit, logged alternative). After the handler ran, its
//! answer always reaches the client: a failed completion is retried, and if the store stays
//! down the key stays in flight until its lease ends (duplicates get `503` or `409`, never a
//! second run within the lease). A response body that fails is answered `502`, and the key is
//! completed without a response, so a retry gets `409` instead of running the handler again.
//!
//! # Choices where the draft is silent
//!
//! - **Time** comes from a [`WallClock`](stormguard::deadline::WallClock) (epoch milliseconds) owned by the layer and passed to
//!   every store call, never the database's `NOW()`: the same code runs under a
//!   [`ManualClock`](stormguard::clock::ManualClock) in tests, and instances must keep their
//!   wall clocks in sync (NTP) for leases to mean the same thing everywhere.
//! - **Lease tokens** are random 63-bit integers, new for every acquisition (also after a
//!   record was deleted and created again), so a stale holder can never match a later lease.
//! - **Completion after the lease expired but before anybody took over succeeds**: the work was
//!   done once, and keeping its result is better than throwing it away.
//! - **Oversized responses** ([`Oversize`]): by default the key is *marked* completed without a
//!   body, and duplicates get `409` problem+json of type
//!   [`problem::RESPONSE_NOT_STORED`]; [`Oversize::Release`] deletes the key instead, so a retry
//!   runs the handler again. The response is never truncated.
//! - **A response that the handler refused before doing anything** is not stored: statuses
//!   401, 403 and 429 never are, nor any response carrying the [`DoNotStore`] extension, nor
//!   4xx/5xx unless the [`StorePolicy`] enables them. Authentication and rate limiting placed
//!   *outside* this layer never reach it at all, which is the recommended order.
//! - **A tenant extractor that returns `None`** makes the layer answer `401` problem+json: a key
//!   without a scope is never looked up.
//! - **Tenants longer than 255 bytes**, and tenants that start with `sha256:` or contain a
//!   NUL byte, are stored as `sha256:<hex>` of the tenant, so that no tenant can name another
//!   one's scope ([`ScopedKey::new`]).
//! - **JSON bodies** are compared with every number exactly as sent
//!   ([`fingerprint::canonical_json`]): `1.0` and `1` are different requests.
//! - **The client disconnecting** cancels the handler like a crash: the lease stays until it
//!   expires, then a retry takes over.
//!
//! # Example
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{Router, routing::post};
//! use stormguard_idempotency::{IdempotencyLayer, store::sqlite::SqliteStore};
//!
//! let store = SqliteStore::open("idempotency.db").await?;
//! store.migrate().await?;
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "paid" }))
//!     .route_layer(
//!         IdempotencyLayer::new(store)
//!             .with_tenant(|parts| parts.headers.get("x-tenant")?.to_str().ok().map(str::to_owned)),
//!     );
//! # let _ = app; Ok(()) }
//! ```

#[cfg(feature = "sql")]
pub mod exactly_once;
pub mod fingerprint;
pub mod layer;
pub mod problem;
pub mod reaper;
pub mod store;

pub use fingerprint::{DefaultFingerprinter, Fingerprint, FingerprintBuilder, Fingerprinter};
pub use layer::{
    DoNotStore, FailureMode, IdempotencyLayer, IdempotencyService, InFlight, LeaseDeadline,
    Oversize, ReplayedHeaders, StorePolicy,
};
pub use reaper::Reaper;
pub use store::{
    Begin, BeginRequest, Completion, Finish, LeaseToken, Millis, Reaped, ScopedKey, Store,
    StoreError, StoredResponse,
};
