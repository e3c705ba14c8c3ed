//! Reading the `Idempotency-Key` request header.
//!
//! The header carries an RFC 8941 sf-string (`"order-8812"`); many clients send the bare key
//! (`order-8812`), so both are read. A value that is neither gives no key: the request is
//! then retried only if its method is idempotent, and the server will refuse the key anyway.

use http::HeaderValue;
use stormguard::retry::IdempotencyKey;

pub use crate::retry::IDEMPOTENCY_KEY;

/// The key carried by an `Idempotency-Key` header value, quoted or bare.
///
/// Returns `None` for an empty value, an sf-string with a stray quote or an escape other than
/// `\"` and `\\`, or a key the core's [`IdempotencyKey::new`] rejects (longer than 255
/// characters, or not printable ASCII).
///
/// ```
/// use http::HeaderValue;
/// use stormguard_tower::reqwest::idempotency_key;
///
/// let quoted = idempotency_key(&HeaderValue::from_static(r#""order-8812""#));
/// assert_eq!(quoted.map(|k| k.as_str().to_owned()).as_deref(), Some("order-8812"));
/// let bare = idempotency_key(&HeaderValue::from_static("order-8812"));
/// assert_eq!(bare.map(|k| k.as_str().to_owned()).as_deref(), Some("order-8812"));
/// assert!(idempotency_key(&HeaderValue::from_static(r#""unterminated"#)).is_none());
/// ```
pub fn idempotency_key(value: &HeaderValue) -> Option<IdempotencyKey> {
    crate::retry::parse_idempotency_key(value.as_bytes())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn parse(s: &str) -> Option<String> {
        idempotency_key(&HeaderValue::from_str(s).unwrap()).map(|k| k.as_str().to_owned())
    }

    #[test]
    fn reads_quoted_and_bare_keys() {
        assert_eq!(parse(r#""a\"b\\c""#).as_deref(), Some(r#"a"b\c"#));
        assert_eq!(parse("abc").as_deref(), Some("abc"));
        assert_eq!(parse(r#""""#), None, "empty sf-string");
        assert_eq!(parse(r#""a"b""#), None, "stray quote");
        assert_eq!(parse(r#""a\nb""#), None, "unknown escape");
        assert_eq!(parse(r#""abc\""#), None, "escaped closing quote");
        assert_eq!(parse(&"k".repeat(256)), None, "too long");
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                let _ = idempotency_key(&value);
            }
        }

        #[test]
        fn round_trips_the_core_encoding(s in "[ -~]{1,255}") {
            let key = IdempotencyKey::new(&s).unwrap();
            let value = HeaderValue::from_str(&key.to_header_value()).unwrap();
            prop_assert_eq!(idempotency_key(&value), Some(key));
        }
    }
}
