//! Which of the handler's response headers are stored and replayed.
//!
//! A replay should be the first answer again, so by default every *end-to-end* header comes
//! back (an application's `x-request-id`, `x-exec`, `retry-after`, `content-type`, …). Three
//! kinds never do:
//!
//! - **hop-by-hop** headers (RFC 9110 §7.6.1: `connection`, `keep-alive`, `proxy-connection`,
//!   `te`, `transfer-encoding`, `upgrade`, and the RFC 2616 list's `trailer`,
//!   `proxy-authenticate`, `proxy-authorization`, plus any header the response's `connection`
//!   names): they describe one connection, not the response;
//! - `content-length`: the replayed body sets it again;
//! - `set-cookie`, by default: whoever holds the key would receive the first caller's session.
//!   [`ReplayedHeaders::end_to_end`] leaves it out; list it in [`ReplayedHeaders::only`] to
//!   replay it anyway.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one connection; never stored.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

/// Which response headers a completed key stores and replays.
///
/// # Default
///
/// [`ReplayedHeaders::end_to_end`]: every header but the hop-by-hop ones,
/// `content-length` and `set-cookie`.
///
/// ```
/// use http::{HeaderMap, HeaderName};
/// use stormguard_idempotency::ReplayedHeaders;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-exec", "7".parse().unwrap());
/// headers.insert("set-cookie", "session=secret".parse().unwrap());
/// headers.insert("connection", "close".parse().unwrap());
/// let kept = ReplayedHeaders::end_to_end().select(&headers);
/// assert_eq!(kept.len(), 1);
/// assert_eq!(kept[0].0, "x-exec");
///
/// let without = ReplayedHeaders::end_to_end().without(HeaderName::from_static("x-exec"));
/// assert!(without.select(&headers).is_empty());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayedHeaders {
    mode: Mode,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Mode {
    EndToEnd { except: Vec<HeaderName> },
    Only(Vec<HeaderName>),
}

impl ReplayedHeaders {
    /// Every end-to-end header except `set-cookie` (and `content-length`, which the body
    /// sets).
    pub fn end_to_end() -> Self {
        ReplayedHeaders {
            mode: Mode::EndToEnd {
                except: vec![header::SET_COOKIE],
            },
        }
    }

    /// Only these headers (an allow-list; hop-by-hop headers and `content-length` are left
    /// out even if listed).
    pub fn only(names: impl IntoIterator<Item = HeaderName>) -> Self {
        ReplayedHeaders {
            mode: Mode::Only(names.into_iter().collect()),
        }
    }

    /// Leaves `name` out as well.
    pub fn without(mut self, name: HeaderName) -> Self {
        match &mut self.mode {
            Mode::EndToEnd { except } => except.push(name),
            Mode::Only(names) => names.retain(|n| *n != name),
        }
        self
    }

    /// Whether `name` is stored (before looking at the response's own `connection` header).
    pub fn replays(&self, name: &HeaderName) -> bool {
        if *name == header::CONTENT_LENGTH || HOP_BY_HOP.contains(name) {
            return false;
        }
        match &self.mode {
            Mode::EndToEnd { except } => !except.contains(name),
            Mode::Only(names) => names.contains(name),
        }
    }

    /// The headers of `headers` to store, in order, repeated values included.
    pub fn select(&self, headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
        // Headers the response names in `connection` are hop-by-hop for this response.
        let named_by_connection = |name: &HeaderName| {
            headers.get_all(header::CONNECTION).iter().any(|v| {
                v.to_str().is_ok_and(|list| {
                    list.split(',')
                        .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
                })
            })
        };
        headers
            .iter()
            .filter(|(name, _)| self.replays(name) && !named_by_connection(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    }
}

impl Default for ReplayedHeaders {
    fn default() -> Self {
        ReplayedHeaders::end_to_end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_never_replayed() {
        let mut h = HeaderMap::new();
        h.insert("connection", "x-hop, close".parse().expect("value"));
        h.insert("x-hop", "1".parse().expect("value"));
        h.insert("keep-alive", "timeout=5".parse().expect("value"));
        h.insert("transfer-encoding", "chunked".parse().expect("value"));
        h.insert("content-length", "3".parse().expect("value"));
        h.append("x-multi", "a".parse().expect("value"));
        h.append("x-multi", "b".parse().expect("value"));
        let kept = ReplayedHeaders::end_to_end().select(&h);
        let names: Vec<&str> = kept.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x-multi", "x-multi"]);
        let only = ReplayedHeaders::only([
            HeaderName::from_static("x-hop"),
            header::TRANSFER_ENCODING,
            HeaderName::from_static("x-multi"),
        ]);
        assert_eq!(only.select(&h).len(), 2);
        assert!(ReplayedHeaders::only([header::SET_COOKIE]).replays(&header::SET_COOKIE));
        assert!(!ReplayedHeaders::end_to_end().replays(&header::SET_COOKIE));
    }
}
