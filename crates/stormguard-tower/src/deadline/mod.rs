//! Deadline propagation across HTTP and gRPC hops: one deadline for the whole call chain.
//!
//! # Why propagate deadlines
//!
//! Per-hop timeouts do not compose. A gateway that gives up after 1 s, in front of a service
//! that allows itself 1 s for each of three attempts at its own dependency, leaves that service
//! working for two more seconds on an answer nobody will read, and its dependency with it.
//! Under overload this wasted work is what keeps the overload going. The fix is to carry one
//! deadline (the instant the original caller stops waiting) along the chain: each hop reads what
//! is left, keeps a reserve for its own work, hands the rest downstream, and stops when time is
//! up.
//!
//! Two layers do that at the edges of a service:
//!
//! - [`DeadlineLayer`] (server side) reads the deadline a request announces, refuses a request
//!   that has expired (or has less than a millisecond left) without running the handler, runs the handler with the deadline
//!   as its task's *current* deadline ([`stormguard::deadline::scope`]), and cancels it when
//!   the deadline passes: HTTP 504, or gRPC `DEADLINE_EXCEEDED`.
//! - [`PropagateDeadlineLayer`] (client side) takes the current deadline, subtracts the hop
//!   reserve ([`Reserve`](stormguard::deadline::Reserve)), writes the rest into the outgoing
//!   request's headers, and does not send a call that would get less than the minimum useful
//!   call time (the core's [`DeadlineTooClose`](stormguard::admission::DeadlineTooClose), a
//!   refusal that stops any retrier above it).
//!
//! Between the two, the core's retrier (`stormguard::retry::Retrier`) reads the same current
//! deadline to decide whether another attempt still fits.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use std::time::Duration;
//! use http::{Request, Response};
//! use http_body_util::BodyExt;
//! use stormguard::deadline::Reserve;
//! use stormguard_tower::deadline::{DeadlineLayer, PropagateDeadlineLayer};
//! use tower::{Layer, ServiceExt, service_fn};
//!
//! // The downstream service: reports the grpc-timeout it was given.
//! let downstream = service_fn(|req: Request<()>| async move {
//!     let t = req.headers().get("grpc-timeout").cloned();
//!     Ok::<_, std::convert::Infallible>(Response::new(format!("{t:?}")))
//! });
//! let client = PropagateDeadlineLayer::new()
//!     .with_reserve(Reserve::fixed(Duration::from_millis(300)))
//!     .validate()?
//!     .layer(downstream);
//!
//! // This hop's handler calls downstream under the deadline its caller sent.
//! let server = DeadlineLayer::new().layer(service_fn(move |_req: Request<()>| {
//!     let client = client.clone();
//!     async move { client.oneshot(Request::new(())).await }
//! }));
//!
//! let request = Request::builder().header("grpc-timeout", "900m").body(())?;
//! let response = server.oneshot(request).await?;
//! let body = response.into_body().collect().await?.to_bytes();
//! assert_eq!(body, r#"Some("600000u")"#); // 900 ms − 300 ms reserve
//! # Ok(()) }
//! ```
//!
//! # Wire formats
//!
//! The deadline vocabulary is the core's, so every HTTP stack reads and writes it the same way:
//! [`DeadlineHeader`](stormguard::deadline::DeadlineHeader) names the four formats
//! (`grpc-timeout` for gRPC, `connect-timeout-ms` for Connect, `x-envoy-expected-rq-timeout-ms`
//! for Envoy, and `x-request-deadline` in absolute Unix epoch milliseconds);
//! [`read_deadline`](stormguard::deadline::read_deadline) says which one wins when a request
//! carries several, what happens to a repeated or malformed one, and what clock skew does to
//! the absolute one; [`WallClock`](stormguard::deadline::WallClock) is the wall time that one is
//! read and written with. [`crate::wire`] applies them to an `http::HeaderMap`.

mod error;
mod propagate;
pub(crate) mod reply;
mod server;

pub use error::InvalidDeadlineConfig;
pub use propagate::{
    ClientStats, PropagateDeadline, PropagateDeadlineLayer,
    ResponseFuture as PropagateResponseFuture,
};
pub use reply::DeadlineBody;
pub use server::{
    Deadline, DeadlineLayer, IncomingDeadline, MalformedPolicy, ResponseFuture, ServerStats,
};
