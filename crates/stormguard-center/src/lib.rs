//! The stormguard policy center: versioned retry policies pushed to every instance.
//!
//! A retry policy changed by hand on forty hosts is changed on thirty-nine. The center keeps
//! every service's policies as a line of immutable versions and pushes the one each
//! instance should run to it, in about the time of a round trip:
//!
//! - **Versions.** Each publish is a new version (a number, the SHA-256 of the canonical
//!   policy text, author, message, and the [changed fields](changed_fields)), validated by
//!   the same rules as a policy file before it exists and linted by `stormguard policy lint`'s
//!   rules (a finding at or above [`CenterConfig::lint_blocks`], errors by default, refuses
//!   it with 422). Publishing is compare-and-set on the
//!   version the editor saw: of two editors on the same base, one wins and the other gets
//!   409. A rollback publishes an old version's policies again, as a new version.
//! - **Push.** Instances watch their service over server-sent events: full snapshots, event
//!   id = version, resumed with `Last-Event-ID`; they ACK what they applied and NACK what
//!   they could not, with the reason. A conditional poll (`ETag`) serves the same snapshot.
//!   `stormguard_tower::client::CenterWatch` is the client: it feeds the live policies of a
//!   client stack and keeps a last-good copy on disk. New watchers are admitted a few at a
//!   time ([`CenterConfig::watch_admissions`]): a reconnect storm after a restart is shed with
//!   503 and `Retry-After`, and the instances come back after their jittered backoff.
//! - **Canary.** A version can be published for a share of instances (a stable hash of the
//!   instance id) or for the instances with some labels, then promoted or aborted; the status
//!   shows which instance should run and runs which version.
//! - **Audit and auth.** Every publish, rollback, canary step, ACK and NACK is an audit
//!   record. Bearer tokens carry one role each ([`Role`]); the center stores their hashes and
//!   denies what no rule allows.
//! - **Rules.** Metric-driven rules ([`stormguard::rules`]) are stored per service and run
//!   by a [`RuleRunner`] on the observations a collector hands it: each firing and revert
//!   is a version published like any other, by `rule:<name>`, with the observed values in
//!   its audit record; a dry-run rule only writes `rule-dry-run` audit records. What a rule
//!   changed is read back from its audit records, so a restarted center reverts a rule that
//!   fired before it, and editing or deleting a fired rule reverts its change first.
//! - **Collection.** A [`Collector`] reads each service's numbers every second — from each
//!   instance's `/metrics` (the instance announces the URL with its watch), or from a
//!   Prometheus server with PromQL — keeps the recent rounds in the [`MetricHistory`]
//!   ([`Center::metric_history`]) and hands them to the [`RuleRunner`] ([`collect`]).
//! - **Store.** SQLite embedded by default; PostgreSQL for several replicas behind a load
//!   balancer, which learn of each other's publishes through LISTEN/NOTIFY ([`Store`]).
//!
//! # HTTP API
//!
//! The API is described by an OpenAPI 3.1 document (`openapi.json` in this crate), which
//! the center serves at `GET /openapi.json` without a token: it tells how to call the
//! center, nothing about its data (a test checks that it lists exactly the router's routes
//! and that real answers validate against it).
//!
//! Every route but `/healthz` and `/openapi.json` needs `Authorization: Bearer <token>`
//! (the scheme's name in any case). Bodies are JSON, at most [`CenterConfig::body_limit`]
//! bytes (413 beyond). Every error, axum's own refusals included (a body that is not JSON,
//! a missing content type, an unknown route or method), is `{"status": …, "error": "…"}`
//! naming what was wrong; a store failure is a 503 naming the store and the id of the log
//! line that holds the cause, never the driver's message.
//!
//! | route | role | what |
//! |-------|------|------|
//! | `POST /v1/services/{s}/versions` | editor | publish `{base, policy, format?, message?, canary?}` → 201 [`Version`], 409 if `base` is not the latest, 422 if invalid |
//! | `GET /v1/services/{s}/versions?limit=` | viewer | history, newest first |
//! | `GET /v1/services/{s}/versions/{n}` | viewer | one version |
//! | `POST /v1/services/{s}/rollback` | editor | `{base, to, message?}` → 201 [`Version`] |
//! | `POST /v1/services/{s}/canary/promote`, `…/canary/abort` | editor | end the canary |
//! | `GET /v1/services/{s}/status` | viewer | [`Status`]: stable, canary, every instance's target and ACK |
//! | `GET /v1/services/{s}/watch?instance=&labels=k=v,…&metrics=` | instance | server-sent events of [`Snapshot`]s; `metrics`, the instance's `/metrics` URL, is scraped while the stream is open |
//! | `GET /v1/services/{s}/policy?instance=&labels=` | instance, viewer | the [`Snapshot`] with `ETag`; 304 on `If-None-Match` |
//! | `POST /v1/services/{s}/acks` | instance | `{instance, version, applied, reason?}` |
//! | `GET /v1/audit?service=&limit=` | viewer | [`AuditRecord`]s, newest first |
//! | `POST /v1/tokens` | admin | `{name, role, service?}` → `{token}` |
//! | `GET /v1/services/{s}/rules` | viewer | the service's metric-driven rules |
//! | `PUT /v1/services/{s}/rules/{name}` | editor | store a rule (the JSON shape of [`stormguard::rules`]) → 204, 422 if invalid; a fired rule edited to change something else is reverted first (409 if that cannot be published) |
//! | `DELETE /v1/services/{s}/rules/{name}` | editor | delete a rule → 204, 404 if none; a fired rule is reverted first (409 if that cannot be published) |
//! | `GET /metrics` | viewer | Prometheus text (see [`metric_names`]) |
//! | `GET /openapi.json` | none | the OpenAPI 3.1 document of this API |
//! | `GET /healthz` | none | `ok` |
//!
//! The same server answers people at `/ui`: the dashboard (sign-in with a token of any role
//! but `instance`; see its module for what it shows and how its forms are protected).
//!
//! # Example
//!
//! ```no_run
//! use stormguard_center::{Center, CenterConfig, Role, Store};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Store::open("sqlite://center.db").await?;
//! let center = Center::new(store, CenterConfig::default()).await?;
//! let admin = center.create_token("ops", Role::Admin, None).await?;
//! println!("admin token: {admin}");
//! // A deep accept queue: a fleet's ACKs arrive as a burst of new connections.
//! let listener = stormguard_tower::listen::bind("127.0.0.1:7450".parse()?).await?;
//! center.serve(listener, std::future::pending()).await?;
//! # Ok(())
//! # }
//! ```

mod api;
mod auth;
pub mod collect;
mod dashboard;
mod error;
pub mod fanout;
mod hub;
pub mod metric_names;
mod rules;
mod server;
mod store;
mod version;

pub use api::admin::{AuditRecord, InstanceStatus, Status};
pub use auth::{Caller, Role, new_token};
pub use collect::{
    CollectConfig, Collected, Collector, EndpointTraffic, MetricHistory, PrometheusSource, Round,
    ScrapeTargets, Source,
};
pub use error::ApiError;
pub use hub::Selector;
pub use rules::{RuleEvent, RuleRunner};
pub use server::{Center, CenterConfig};
pub use store::{ACQUIRE_TIMEOUT, Store, StoreError, StoreKind};
pub use version::{FieldChange, Snapshot, Version, canonical_text, changed_fields, content_hash};
