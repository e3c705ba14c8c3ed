//! Opening an upstream's TCP connection within a connect timeout.
//!
//! A host name can stand for several addresses (an IPv6 and an IPv4 one, or the replicas
//! behind a DNS name). They are tried one after another, and each is given a share of what
//! is left of the timeout: the remaining time divided by the addresses not yet tried, but
//! no less than [`MIN_SHARE`] while that much is left (Go's dialer splits its timeout the
//! same way). One outer timeout over the whole connect would let a first address that drops
//! the SYN use all of it, so the next address, which might answer at once, would never be
//! tried; an address that fails fast (refused, unreachable) leaves its share to the ones
//! after it. The floor keeps a host with many addresses from cutting each to less than a
//! distant host's round trip, or than the kernel's first SYN retransmission (1 s): a few
//! addresses are tried properly rather than every one too briefly. Addresses are not raced
//! (no Happy Eyeballs): the proxy's upstreams are services, mostly one address each.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use http::uri::Authority;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Opens the TCP connection to an authority within a connect timeout: [`tcp_connect`] in
/// the proxy. The tests give their own, which connects before it returns or never answers:
/// under paused time, a timer around a real connect that is still in flight fires as soon
/// as the runtime has nothing else to do.
pub(crate) type Connector = fn(&Authority, Duration) -> Connecting;

/// A connect under way.
pub(crate) type Connecting = Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send>>;

/// The least time an address is given while that much of the connect timeout is left.
pub(crate) const MIN_SHARE: Duration = Duration::from_secs(2);

/// The error of a connect given up after `after`.
pub(crate) fn connect_timed_out(after: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no connection within the connect timeout ({after:?})"),
    )
}

/// Resolves the authority's host and connects to the first of its addresses that answers
/// within its share of `within` (see the module docs). The caller keeps its own timeout over
/// the whole future, which bounds the name look-up too.
pub(crate) fn tcp_connect(authority: &Authority, within: Duration) -> Connecting {
    let host = authority.host();
    // `[::1]` is an IPv6 literal; the brackets are URI syntax, not the address.
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .to_owned();
    let port = authority.port_u16().unwrap_or(80);
    Box::pin(async move {
        let deadline = Instant::now() + within;
        let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
            .await?
            .collect();
        first_to_connect(&addresses, deadline, TcpStream::connect).await
    })
}

/// Tries `addresses` in order with `connect`, each within its share of the time left before
/// `deadline` (see the module docs); the first connection made, else the last error (an
/// address not tried for want of time adds none).
async fn first_to_connect<C, F>(
    addresses: &[SocketAddr],
    deadline: Instant,
    connect: C,
) -> io::Result<TcpStream>
where
    C: Fn(SocketAddr) -> F,
    F: Future<Output = io::Result<TcpStream>>,
{
    let mut last_error = io::Error::new(
        io::ErrorKind::NotFound,
        "the host name resolved to no address",
    );
    for (tried, &address) in addresses.iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        // `tried < addresses.len()`, so the divisor is at least 1.
        let untried = u32::try_from(addresses.len() - tried).unwrap_or(u32::MAX);
        let share = (left / untried).max(left.min(MIN_SHARE));
        match tokio::time::timeout(share, connect(address)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(error)) => last_error = error,
            Err(_) => {
                last_error = io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{address}: no connection within its share ({share:?}) of the connect timeout"
                    ),
                )
            }
        }
    }
    Err(last_error)
}

/// A connect already made with a blocking connect (on loopback, done or refused at once), so
/// the future is ready: the tests' connector.
#[cfg(test)]
pub(crate) fn connected_at_once(address: impl std::net::ToSocketAddrs) -> Connecting {
    let stream = std::net::TcpStream::connect(address).and_then(|stream| {
        stream.set_nonblocking(true)?;
        TcpStream::from_std(stream)
    });
    Box::pin(std::future::ready(stream))
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpListener};

    use super::*;

    /// An address nothing listens on at all: refused at once (port 1 of loopback).
    const REFUSED: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 1);

    /// An address that stands for a host dropping the SYN: the fake connect never ends.
    const SILENT: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 2);

    /// What trying `addresses` within `within` (on paused time) came to: the result, each
    /// address tried with when it was tried, and the time it all took. Connects at once,
    /// except to [`SILENT`], which never answers.
    async fn tried_in_turn(
        addresses: &[SocketAddr],
        within: Duration,
    ) -> (io::Result<TcpStream>, Vec<(SocketAddr, Duration)>, Duration) {
        let tried = std::sync::Mutex::new(Vec::new());
        let started = Instant::now();
        let result = first_to_connect(addresses, started + within, |address| {
            tried
                .lock()
                .expect("no test thread panicked")
                .push((address, started.elapsed()));
            if address == SILENT {
                Box::pin(std::future::pending()) as Connecting
            } else {
                connected_at_once(address)
            }
        })
        .await;
        let tried = tried.into_inner().expect("no test thread panicked");
        (result, tried, started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_first_address_leaves_the_next_its_share() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a loopback port");
        let answering = listener.local_addr().expect("bound");
        let (stream, tried, _) = tried_in_turn(&[SILENT, answering], Duration::from_secs(10)).await;
        let stream = stream.expect("the second address answers");
        assert_eq!(stream.peer_addr().expect("connected"), answering);
        assert_eq!(
            tried,
            [
                (SILENT, Duration::ZERO),
                (answering, Duration::from_secs(5))
            ],
            "the first of two addresses gets half of the 10 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_address_leaves_its_share_to_the_rest() {
        let (result, tried, took) =
            tried_in_turn(&[REFUSED, SILENT, SILENT], Duration::from_secs(10)).await;
        let error = result.expect_err("nothing answers");
        // The refusal took no time, so each silent address had half of the 10 s.
        assert_eq!(
            tried,
            [
                (REFUSED, Duration::ZERO),
                (SILENT, Duration::ZERO),
                (SILENT, Duration::from_secs(5))
            ]
        );
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(error.to_string().contains("127.0.0.1:2"), "{error}");
        assert_eq!(took, Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_error_is_the_callers() {
        let (result, _, took) = tried_in_turn(&[SILENT, REFUSED], Duration::from_secs(10)).await;
        let error = result.expect_err("nothing answers");
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused);
        assert_eq!(took, Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn each_address_gets_the_floor_while_it_is_left_and_the_rest_go_untried() {
        let (result, tried, took) =
            tried_in_turn(&[SILENT, SILENT, REFUSED], Duration::from_secs(3)).await;
        let error = result.expect_err("nothing answers");
        // A third of 3 s is under the 2 s floor: the first gets 2 s, the second the 1 s
        // left (over its half of it), the third nothing.
        assert_eq!(
            tried,
            [(SILENT, Duration::ZERO), (SILENT, Duration::from_secs(2))]
        );
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(took, Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn no_address_is_an_error_not_a_hang() {
        let error = first_to_connect(&[], Instant::now() + Duration::from_secs(3), |_| {
            std::future::pending::<io::Result<TcpStream>>()
        })
        .await
        .expect_err("no address");
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }

    /// With real time: under paused time the share's timer could fire while the loopback
    /// connect is still being delivered.
    #[tokio::test]
    async fn a_loopback_name_connects() {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("a loopback port");
        let port = listener.local_addr().expect("bound").port();
        let authority: Authority = format!("127.0.0.1:{port}").parse().expect("an authority");
        let (stream, accepted) = tokio::join!(
            tcp_connect(&authority, Duration::from_secs(3)),
            listener.accept()
        );
        assert_eq!(
            stream.expect("connects").local_addr().expect("bound"),
            accepted.expect("accepts").1
        );
    }
}
