//! Loop detection: an egress proxy with no fixed upstream forwards each request to the host
//! it names, so a request that names the proxy itself (its own listen address, or a name
//! that resolves to it) would be forwarded to itself, again and again, until file
//! descriptors run out.
//!
//! Two checks stop it, both before the client stack runs (a loop is not retried):
//!
//! - a request whose host is the proxy's own listen address is refused at once;
//! - every forwarded request carries a `Via` entry naming this proxy instance
//!   (`1.1 stormguard-<random>`, RFC 9110 §7.6.3), and a request that arrives with that
//!   entry already in its `Via` header has been here before: a loop through a name, a second
//!   proxy or the upstream itself.
//!
//! Either way the answer is `508 Loop Detected` (gRPC: `FAILED_PRECONDITION`).

use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, SocketAddr};

use http::header::VIA;
use http::{HeaderMap, HeaderValue, Request};

use crate::upstream::named_authority;

/// This proxy instance's `Via` entry: `1.1 stormguard-` and 16 random hex digits, drawn per
/// [`Proxy`](crate::Proxy).
pub(crate) fn entry() -> HeaderValue {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    let text = format!("1.1 stormguard-{:016x}", hasher.finish());
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("1.1 stormguard"))
}

/// Whether `headers` carry `entry` in a `Via` header (the request passed here before).
pub(crate) fn passed_here(headers: &HeaderMap, entry: &HeaderValue) -> bool {
    let ours = entry.as_bytes();
    headers.get_all(VIA).iter().any(|value| {
        value
            .as_bytes()
            .split(|&b| b == b',')
            .any(|item| trim(item) == ours)
    })
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &bytes[start..end]
}

/// Whether `request` names `listen` as its host: the same port, and the same address (an
/// unspecified listen address stands for every local one), or `localhost`.
pub(crate) fn names_self<B>(request: &Request<B>, listen: SocketAddr) -> bool {
    let Some(authority) = named_authority(request) else {
        return false;
    };
    let port = authority.port_u16().unwrap_or(80);
    if port != listen.port() {
        return false;
    }
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(ip) if listen.ip().is_unspecified() => ip.is_loopback() || ip.is_unspecified(),
        Ok(ip) => ip == listen.ip(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(host: &str) -> Request<()> {
        Request::get(format!("http://{host}/x"))
            .body(())
            .expect("request")
    }

    #[test]
    fn the_own_address_is_recognised() {
        let listen: SocketAddr = "127.0.0.1:15001".parse().expect("addr");
        assert!(names_self(&request("127.0.0.1:15001"), listen));
        assert!(names_self(&request("localhost:15001"), listen));
        assert!(!names_self(&request("127.0.0.1:15002"), listen));
        assert!(!names_self(&request("10.0.0.1:15001"), listen));
        assert!(!names_self(&request("users:15001"), listen));
        let any: SocketAddr = "0.0.0.0:80".parse().expect("addr");
        assert!(names_self(&request("127.0.0.2"), any));
        assert!(names_self(&request("[::1]:80"), any));
    }

    #[test]
    fn only_this_instance_entry_counts() {
        let (ours, theirs) = (entry(), entry());
        assert_ne!(ours, theirs, "each proxy draws its own");
        let mut headers = HeaderMap::new();
        headers.append(VIA, theirs);
        assert!(!passed_here(&headers, &ours));
        let both = format!(
            "1.0 fred, {} , 1.1 p.example",
            ours.to_str().expect("ascii")
        );
        headers.append(VIA, both.parse().expect("value"));
        assert!(passed_here(&headers, &ours));
    }
}
