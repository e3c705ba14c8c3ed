//! `grpc-hop`: one tonic hop of a deadline-propagating chain.
//!
//! ```sh
//! # In-process demo on 127.0.0.1: a client gives hop B 600 ms, B keeps 300 ms, C gets the rest.
//! cargo run -p grpc-hop
//! # One hop as a server, calling the next one:
//! cargo run -p grpc-hop -- serve --listen 127.0.0.1:50051 --name B \
//!     --next http://127.0.0.1:50052 --reserve-ms 300
//! ```

use std::time::Duration;

use clap::{Parser, Subcommand};
use grpc_hop::pb::HopRequest;
use grpc_hop::pb::relay_client::RelayClient;
use grpc_hop::{Hop, client, serve};
use stormguard::deadline::Reserve;
use stormguard_tower::deadline::{DeadlineLayer, PropagateDeadlineLayer};
use stormguard_tower::wire::BoxError;
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(about = "One tonic hop of a deadline-propagating gRPC chain")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the in-process demo (the default): client -> B -> C on 127.0.0.1.
    Demo,
    /// Serves one hop.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:50051")]
        listen: String,
        /// The hop's name, as reported in replies.
        #[arg(long, default_value = "hop")]
        name: String,
        /// The next hop's URI (e.g. http://127.0.0.1:50052); none: this is the last hop.
        #[arg(long)]
        next: Option<String>,
        /// Fixed reserve this hop keeps for itself, in milliseconds.
        #[arg(long, default_value_t = 0)]
        reserve_ms: u64,
        /// Fraction of the remaining time this hop keeps for itself (0.0 to 1.0).
        #[arg(long, default_value_t = 0.0)]
        reserve_fraction: f64,
        /// Do not call the next hop with less than this many milliseconds left.
        #[arg(long, default_value_t = 0)]
        min_call_ms: u64,
        /// Never let a request run longer than this many milliseconds.
        #[arg(long)]
        max_ms: Option<u64>,
    },
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    match Cli::parse().command.unwrap_or(Command::Demo) {
        Command::Demo => demo().await,
        Command::Serve {
            listen,
            name,
            next,
            reserve_ms,
            reserve_fraction,
            min_call_ms,
            max_ms,
        } => {
            let reserve =
                Reserve::fraction(reserve_fraction)?.with_fixed(Duration::from_millis(reserve_ms));
            let propagate = PropagateDeadlineLayer::new()
                .with_reserve(reserve)
                .with_min_call(Duration::from_millis(min_call_ms))
                .validate()?;
            let next = next.map(|uri| client(&uri, &propagate)).transpose()?;
            let mut deadlines = DeadlineLayer::new();
            if let Some(max) = max_ms {
                deadlines = deadlines.with_max(Duration::from_millis(max));
            }
            let listener = TcpListener::bind(&listen).await?;
            println!("{name} listening on {}", listener.local_addr()?);
            serve(listener, Hop::new(name, next), deadlines.validate()?).await
        }
    }
}

/// Client -> B (keeps 300 ms) -> C, all on 127.0.0.1, the client giving B 600 ms: the seeds'
/// rows for services B and C.
async fn demo() -> Result<(), BoxError> {
    let c_listener = TcpListener::bind("127.0.0.1:0").await?;
    let c_uri = format!("http://{}", c_listener.local_addr()?);
    tokio::spawn(serve(c_listener, Hop::new("C", None), DeadlineLayer::new()));

    let reserve = Reserve::fixed(Duration::from_millis(300));
    let to_c = client(&c_uri, &PropagateDeadlineLayer::new().with_reserve(reserve))?;
    let b_listener = TcpListener::bind("127.0.0.1:0").await?;
    let b_uri = format!("http://{}", b_listener.local_addr()?);
    tokio::spawn(serve(
        b_listener,
        Hop::new("B", Some(to_c)),
        DeadlineLayer::new(),
    ));

    // A plain tonic client with tonic's own per-call timeout (it sends `grpc-timeout`).
    let mut to_b = RelayClient::connect(b_uri).await?;
    let mut request = tonic::Request::new(HopRequest { work_ms: 0 });
    request.set_timeout(Duration::from_millis(600));
    println!("client   gives B 600 ms (grpc-timeout)");
    let mut reply = Some(to_b.hop(request).await?.into_inner());
    while let Some(hop) = reply {
        println!(
            "{:<8} received {:6.1} ms via {}",
            hop.hop, hop.budget_ms, hop.via
        );
        reply = hop.downstream.map(|d| *d);
    }
    println!("B keeps 300 ms for itself, so C gets what B had minus 300 ms.");
    Ok(())
}
