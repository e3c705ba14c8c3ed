//! Network faults between the platform and the service: a TCP proxy on 127.0.0.1 that resets
//! some connections and drops some answers.
//!
//! For each connection the proxy draws (seeded) one fate:
//!
//! - **reset**: the connection is closed with `SO_LINGER` 0, so the client gets a TCP RST and
//!   the request never reaches the service;
//! - **dropped answer**: the request is forwarded and the service's whole answer is read, then
//!   the client's connection is closed without it. The service did the work; the platform saw
//!   a failure and will redeliver — the case that makes idempotency necessary;
//! - **pass**: bytes are copied both ways.
//!
//! The dropped-answer fate relies on the service closing the connection after its answer,
//! which it does for requests sent with `Connection: close` (the platform always sends it).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The longest the proxy waits for the service to finish an answer it will drop.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// Shares of connections that are reset or lose their answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProxyFaults {
    /// Share of connections reset at once (0.0 to 1.0).
    pub reset: f64,
    /// Share of connections whose answer is dropped (0.0 to 1.0).
    pub drop_answer: f64,
}

/// What the proxy did, so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyCounts {
    /// Connections accepted.
    pub connections: u64,
    /// Connections reset.
    pub resets: u64,
    /// Answers dropped.
    pub dropped_answers: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    resets: AtomicU64,
    dropped_answers: AtomicU64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Reset,
    DropAnswer,
    Pass,
}

/// A running fault proxy.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    counters: Arc<Counters>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards to `upstream`.
    pub async fn start(
        upstream: SocketAddr,
        faults: ProxyFaults,
        seed: u64,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let rng = Mutex::new(SmallRng::seed_from_u64(seed));
        let draw = move || -> Fate {
            let Ok(mut rng) = rng.lock() else {
                return Fate::Pass;
            };
            let x: f64 = rng.random();
            if x < faults.reset {
                Fate::Reset
            } else if x < faults.reset + faults.drop_answer {
                Fate::DropAnswer
            } else {
                Fate::Pass
            }
        };
        let counts = counters.clone();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                counts.connections.fetch_add(1, Ordering::Relaxed);
                let fate = draw();
                let counts = counts.clone();
                connections.spawn(async move {
                    let _ = handle(client, upstream, fate, &counts).await;
                });
                // Reap finished connections so the set does not grow.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(FaultProxy {
            addr,
            counters,
            task,
        })
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What it did so far.
    pub fn counts(&self) -> ProxyCounts {
        ProxyCounts {
            connections: self.counters.connections.load(Ordering::Relaxed),
            resets: self.counters.resets.load(Ordering::Relaxed),
            dropped_answers: self.counters.dropped_answers.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting and drops every connection.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn handle(
    mut client: TcpStream,
    upstream: SocketAddr,
    fate: Fate,
    counts: &Counters,
) -> std::io::Result<()> {
    match fate {
        Fate::Reset => {
            counts.resets.fetch_add(1, Ordering::Relaxed);
            client.set_zero_linger()?;
            drop(client);
        }
        Fate::DropAnswer => {
            let service = TcpStream::connect(upstream).await?;
            let (mut from_client, _to_client) = client.split();
            let (mut from_service, mut to_service) = service.into_split();
            let forward = async {
                let _ = tokio::io::copy(&mut from_client, &mut to_service).await;
                let _ = to_service.shutdown().await;
            };
            let swallow = async {
                // The service closes after its answer (Connection: close).
                tokio::time::timeout(
                    ANSWER_WAIT,
                    tokio::io::copy(&mut from_service, &mut tokio::io::sink()),
                )
                .await
            };
            tokio::select! {
                _ = swallow => {}
                () = async { forward.await; std::future::pending::<()>().await } => {}
            }
            counts.dropped_answers.fetch_add(1, Ordering::Relaxed);
            // Dropping `client` closes it without the answer.
        }
        Fate::Pass => {
            let mut service = TcpStream::connect(upstream).await?;
            tokio::io::copy_bidirectional(&mut client, &mut service).await?;
        }
    }
    Ok(())
}
