//! One hop of a deadline-propagating gRPC call chain, on tonic.
//!
//! The hop runs behind [`DeadlineLayer`], so its handler runs under the deadline its caller
//! sent (`grpc-timeout`, or any other deadline header) and is cancelled with
//! `DEADLINE_EXCEEDED` when that passes. It calls the next hop through a tonic client wrapped
//! in [`PropagateDeadlineLayer`], which hands on the remaining time minus this hop's reserve,
//! and refuses to call at all when too little would be left. The `Relay.Hop` reply reports
//! the budget each hop saw, so a chain of hops (in any language) prints the budget table.

use std::time::Duration;

use stormguard::admission::DeadlineTooClose;
use stormguard::deadline;
use stormguard_tower::deadline::{
    DeadlineLayer, IncomingDeadline, PropagateDeadline, PropagateDeadlineLayer,
};
use stormguard_tower::wire::BoxError;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};
use tower::Layer;

/// The code generated from `proto/relay.proto`.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod pb {
    tonic::include_proto!("stormguard.relay");
}

use pb::relay_client::RelayClient;
use pb::relay_server::{Relay, RelayServer};
use pb::{HopReply, HopRequest};

/// A `Relay` client whose calls carry the current deadline minus the hop reserve.
pub type PropagatingClient = RelayClient<PropagateDeadline<Channel>>;

/// A client for `uri` (e.g. `http://127.0.0.1:50051`) behind `propagate`. Connects lazily, on
/// the first call.
pub fn client(
    uri: &str,
    propagate: &PropagateDeadlineLayer,
) -> Result<PropagatingClient, tonic::transport::Error> {
    let channel = Endpoint::from_shared(uri.to_owned())?.connect_lazy();
    Ok(RelayClient::new(propagate.layer(channel)))
}

/// The hop's `Relay` service: reports the budget it received, does the requested work, and
/// calls the next hop if it has one.
#[derive(Clone, Debug)]
pub struct Hop {
    name: String,
    next: Option<PropagatingClient>,
}

impl Hop {
    /// A hop called `name` that calls `next`, if any.
    pub fn new(name: impl Into<String>, next: Option<PropagatingClient>) -> Hop {
        Hop {
            name: name.into(),
            next,
        }
    }
}

/// The `Status` for a failed call to the next hop: a call not sent for lack of time is
/// `DEADLINE_EXCEEDED`; anything else keeps the status tonic made of it.
pub fn next_hop_status(status: Status) -> Status {
    let too_close = std::error::Error::source(&status)
        .and_then(|e| e.downcast_ref::<DeadlineTooClose>())
        .copied();
    match too_close {
        Some(err) => Status::deadline_exceeded(err.to_string()),
        None => status,
    }
}

#[tonic::async_trait]
impl Relay for Hop {
    async fn hop(&self, request: Request<HopRequest>) -> Result<Response<HopReply>, Status> {
        let budget = deadline::current().map_or(Duration::ZERO, |d| d.remaining());
        let via = request
            .extensions()
            .get::<IncomingDeadline>()
            .and_then(|incoming| incoming.header)
            .map_or("", |header| header.name());
        let header_value = match via {
            "" => String::new(),
            name => request
                .metadata()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
        };
        let work = Duration::from_millis(u64::from(request.get_ref().work_ms));
        tokio::time::sleep(work).await;
        let downstream = match &self.next {
            Some(next) => {
                let reply = next
                    .clone()
                    .hop(HopRequest { work_ms: 0 })
                    .await
                    .map_err(next_hop_status)?;
                Some(Box::new(reply.into_inner()))
            }
            None => None,
        };
        Ok(Response::new(HopReply {
            hop: self.name.clone(),
            budget_ms: budget.as_secs_f64() * 1e3,
            via: via.to_owned(),
            downstream,
            header_value,
        }))
    }
}

/// Serves `relay` on `listener` behind `deadlines` until the process ends.
pub async fn serve<R: Relay>(
    listener: TcpListener,
    relay: R,
    deadlines: DeadlineLayer,
) -> Result<(), BoxError> {
    Server::builder()
        .layer(deadlines)
        .add_service(RelayServer::new(relay))
        .serve_with_incoming(TcpIncoming::from(listener))
        .await?;
    Ok(())
}
