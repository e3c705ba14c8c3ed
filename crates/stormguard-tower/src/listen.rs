//! A server's listening socket, with an accept queue deep enough for a burst of connections.
//!
//! The kernel holds connections that finished their handshake until the server accepts them,
//! up to the socket's backlog; past it, a new connection's handshake is dropped and the
//! client sends its SYN again only after a second (then three, then seven). A server that
//! meets bursts — a thousand instances acknowledging one publish at once, a fleet
//! reconnecting after a restart — with the usual backlog of 1,024 (tokio's, Rust's
//! standard library's is 128) turns a few milliseconds of queueing into whole seconds for
//! the unlucky. [`bind`] asks for [`BACKLOG`], which the kernel caps at
//! `net.core.somaxconn` (4,096 on current Linux), as Go's and nginx's defaults do.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// The accept queue [`bind`] asks for; the kernel takes `min(BACKLOG, net.core.somaxconn)`.
pub const BACKLOG: u32 = 65_535;

/// Binds `addr` (port 0 for any free port) with a [`BACKLOG`]-deep accept queue, and on
/// Unix with address reuse (a restarted server binds its port while the old connections
/// linger in TIME_WAIT; on Windows the same option would let another process take the port).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = stormguard_tower::listen::bind("127.0.0.1:0".parse().unwrap()).await?;
/// assert_ne!(listener.local_addr()?.port(), 0);
/// # Ok(())
/// # }
/// ```
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}
