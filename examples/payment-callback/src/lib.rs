//! The reference service of stormguard: a payment platform's asynchronous callback, made
//! correct under duplicates, crashes, network faults and a failing dependency — and the
//! harness that proves it.
//!
//! A payment callback is the hardest easy endpoint: the caller is outside your control
//! (its network, its retry schedule), every notification may arrive many times, and a payment
//! must be processed exactly once. The design, after the seed's section 5:
//!
//! | concern | here | module |
//! | --- | --- | --- |
//! | authenticity | HMAC-SHA256 over the raw body, checked first, in constant time | [`signature`] |
//! | the platform's 5 s | a 4.5 s business deadline every outgoing call reads | [`service`] |
//! | a flaky dependency | risk check: 2 retries, 300 ms exponential, jittered, token-bucket budget; when exhausted `500` + `X-Retry-Exhausted` and the attempt history logged | [`risk`], [`policy`] |
//! | no retry storms | one policy per dependency in one file; the callback itself is never retried here | [`policy`] |
//! | exactly once | `INSERT` keyed by `out_trade_no` via insert-if-absent; `order.paid` through a transactional outbox, only for a new row | [`store`] |
//! | at-least-once delivery | a relay publishes the outbox to a broker (a table, Redis Streams, RabbitMQ with publisher confirms, or NATS JetStream); the consumer deduplicates by event id | [`outbox`], [`broker`] |
//! | any database | SQLite (embedded default), PostgreSQL, MariaDB behind one enum | [`store`] |
//!
//! The harness ([`harness`]) drives it with a platform simulator ([`platform`]) that redelivers
//! on WeChat Pay's schedule (time-compressed), through a fault proxy ([`proxy`]), a killable
//! child process ([`launcher`]) and a fault-injecting risk service, and checks the invariants:
//! one payment row and one applied event per order, no notification lost, every answer within
//! the deadline.
//!
//! ```text
//! cargo run --release -- demo payment-callback            # from the workspace root
//! cargo run --release -p stormguard-payment-callback -- --quick --database-url postgres://postgres@127.0.0.1:5432/test --fresh
//! ```

pub mod args;
pub mod broker;
pub mod callback;
pub mod harness;
pub mod launcher;
pub mod outbox;
pub mod platform;
pub mod policy;
pub mod proxy;
pub mod risk;
pub mod service;
pub mod signature;
pub mod store;

pub use args::{DemoArgs, DemoError, run};
pub use launcher::Launcher;
