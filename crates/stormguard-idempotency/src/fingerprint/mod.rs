//! Request fingerprints: is this the *same* request, or the same key reused for another one?
//!
//! The draft asks the server to answer `422` when a key is reused with a different request
//! payload. The [`DefaultFingerprinter`] hashes the method, the path and query, and the
//! SHA-256 of the *canonical* body: a JSON body (`application/json` or `*+json`) is re-encoded
//! by [`canonical_json`] with object keys sorted and no insignificant whitespace, so
//! `{"a":1, "b":2}` and `{"b":2,"a":1}` are the same request; any other body, and a JSON body
//! that does not parse, is hashed as sent. Applications add fields (a header, a route
//! parameter) with [`DefaultFingerprinter::with_header`] or replace the whole scheme with any
//! `Fn(&Parts, &[u8]) -> Fingerprint`.
//!
//! # Why not `serde_json::Value`
//!
//! Parsing into a `Value` and writing it back loses what an `f64` cannot hold:
//! `{"amount":100000000000000000001}` and `…002`, or `0.1` and `0.10000000000000001`, would
//! become the same request, and the second would be answered with the first one's stored
//! response instead of `422`. [`canonical_json`] keeps every number's text exactly as sent
//! (so `1.0` and `1` are different requests too: a false `422` is safe, a false replay is
//! not) and only normalises what cannot change the meaning: whitespace, object key order,
//! and string escapes (`"\u00e9"` and `"é"` are one string).

use std::fmt;

use http::HeaderName;
use http::request::Parts;
use sha2::{Digest, Sha256};

mod canonical;

pub use canonical::canonical_json;

/// A 32-byte request fingerprint (SHA-256).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint as 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Reads a fingerprint from exactly 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(bytes).ok().map(Fingerprint)
    }

    /// A builder that hashes length-prefixed fields, so `("ab", "c")` and `("a", "bc")`
    /// differ.
    pub fn builder() -> FingerprintBuilder {
        FingerprintBuilder {
            hasher: Sha256::new(),
        }
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// Hashes a sequence of fields into a [`Fingerprint`].
///
/// ```
/// use stormguard_idempotency::Fingerprint;
///
/// let a = Fingerprint::builder().field(b"ab").field(b"c").finish();
/// let b = Fingerprint::builder().field(b"a").field(b"bc").finish();
/// assert_ne!(a, b);
/// ```
#[derive(Clone, Debug)]
pub struct FingerprintBuilder {
    hasher: Sha256,
}

impl FingerprintBuilder {
    /// Adds one field (its length, then its bytes).
    pub fn field(mut self, bytes: &[u8]) -> Self {
        self.hasher.update((bytes.len() as u64).to_be_bytes());
        self.hasher.update(bytes);
        self
    }

    /// The fingerprint of the fields added so far.
    pub fn finish(self) -> Fingerprint {
        Fingerprint(self.hasher.finalize().into())
    }
}

/// Computes the fingerprint of a request from its head and its whole body.
pub trait Fingerprinter: Send + Sync + 'static {
    /// The fingerprint of this request.
    fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Fingerprint;
}

impl<F> Fingerprinter for F
where
    F: Fn(&Parts, &[u8]) -> Fingerprint + Send + Sync + 'static,
{
    fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Fingerprint {
        self(parts, body)
    }
}

/// Method, path and query, SHA-256 of the canonical body, and any headers named with
/// [`with_header`](Self::with_header).
///
/// # Default
///
/// No headers.
#[derive(Clone, Debug, Default)]
pub struct DefaultFingerprinter {
    headers: Vec<HeaderName>,
}

impl DefaultFingerprinter {
    /// The default fingerprinter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also hashes the values of header `name` (for example `content-type` or an API
    /// version header).
    pub fn with_header(mut self, name: HeaderName) -> Self {
        self.headers.push(name);
        self
    }

    /// The SHA-256 of the canonical form of `body` for a request with these headers.
    pub fn body_hash(parts: &Parts, body: &[u8]) -> [u8; 32] {
        let is_json = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|ct| {
                let essence = ct.split(';').next().unwrap_or("").trim();
                essence.eq_ignore_ascii_case("application/json")
                    || essence.to_ascii_lowercase().ends_with("+json")
            })
            .unwrap_or(false);
        if is_json {
            if let Some(canonical) = canonical_json(body) {
                return Sha256::digest(&canonical).into();
            }
        }
        Sha256::digest(body).into()
    }
}

impl Fingerprinter for DefaultFingerprinter {
    fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Fingerprint {
        let target = parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/");
        let mut b = Fingerprint::builder()
            .field(parts.method.as_str().as_bytes())
            .field(target.as_bytes())
            .field(&Self::body_hash(parts, body));
        for name in &self.headers {
            b = b.field(name.as_str().as_bytes());
            for value in parts.headers.get_all(name) {
                b = b.field(value.as_bytes());
            }
        }
        b.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(method: &str, uri: &str, ct: Option<&str>) -> Parts {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(ct) = ct {
            b = b.header("content-type", ct);
        }
        b.body(()).expect("request").into_parts().0
    }

    #[test]
    fn json_bodies_are_canonical() {
        let f = DefaultFingerprinter::new();
        let p = parts("POST", "/pay", Some("application/json; charset=utf-8"));
        let a = f.fingerprint(&p, br#"{"a":1, "b":{"y":[1,2],"x":"s"}}"#);
        let b = f.fingerprint(&p, br#"{ "b":{"x":"s","y":[1,2]},"a":1 }"#);
        assert_eq!(a, b);
        let c = f.fingerprint(&p, br#"{"a":2,"b":{"x":"s","y":[1,2]}}"#);
        assert_ne!(a, c);
    }

    #[test]
    fn method_path_query_and_headers_count() {
        let f = DefaultFingerprinter::new().with_header(HeaderName::from_static("x-v"));
        let body = b"x";
        let base = f.fingerprint(&parts("POST", "/a", None), body);
        assert_ne!(base, f.fingerprint(&parts("PATCH", "/a", None), body));
        assert_ne!(base, f.fingerprint(&parts("POST", "/b", None), body));
        assert_ne!(base, f.fingerprint(&parts("POST", "/a?x=1", None), body));
        let mut p = parts("POST", "/a", None);
        p.headers.insert("x-v", "2".parse().expect("value"));
        assert_ne!(base, f.fingerprint(&p, body));
        // Non-JSON bodies are hashed as sent.
        assert_ne!(
            f.fingerprint(&parts("POST", "/a", Some("text/plain")), b"{\"a\":1}"),
            f.fingerprint(&parts("POST", "/a", Some("text/plain")), b"{ \"a\":1}")
        );
    }
}
