//! Reading the `Idempotency-Key` header.
//!
//! The draft defines the field as a structured-field Item (RFC 8941/9651) whose value is a
//! String: `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`. A bare token, an integer,
//! an empty string, a string over 255 characters, or the header sent twice are all malformed.
//! Parameters on the item are ignored, as structured fields ask of unknown parameters.

use http::HeaderMap;
use http::header::HeaderName;
use stormguard::retry::IdempotencyKey;

/// The header name, lower case as HTTP/2 and `http` spell it.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The header a replayed response carries.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Why an `Idempotency-Key` header was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The header appeared more than once.
    #[error("the Idempotency-Key header appears {0} times; send it exactly once")]
    Repeated(usize),
    /// The value is not a structured-field Item at all.
    #[error("the Idempotency-Key header is not a structured-field item: {0}")]
    NotStructured(String),
    /// The value is an Item, but not a String (for example a bare token or an integer).
    #[error("the Idempotency-Key header must be a quoted sf-string, like \"a1b2\"")]
    NotString,
    /// The string is empty.
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// The string is longer than 255 characters.
    #[error("the Idempotency-Key is {0} characters long; at most 255 are allowed")]
    TooLong(usize),
}

/// Reads the `Idempotency-Key` header: `Ok(None)` when it is absent.
///
/// ```
/// use http::HeaderMap;
/// use stormguard_idempotency::{KeyError, parse_key_header};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(parse_key_header(&headers), Ok(None));
/// headers.insert("idempotency-key", "\"order-17\"".parse().unwrap());
/// assert_eq!(parse_key_header(&headers).unwrap().unwrap().as_str(), "order-17");
/// headers.insert("idempotency-key", "order-17".parse().unwrap());
/// assert_eq!(parse_key_header(&headers), Err(KeyError::NotString));
/// ```
pub fn parse_key_header(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyError> {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let extra = values.count();
    if extra > 0 {
        return Err(KeyError::Repeated(extra + 1));
    }
    let item: sfv::Item = sfv::Parser::new(value.as_bytes())
        .parse()
        .map_err(|e| KeyError::NotStructured(e.to_string()))?;
    let Some(s) = item.bare_item.as_string() else {
        return Err(KeyError::NotString);
    };
    let s = s.as_str();
    if s.is_empty() {
        return Err(KeyError::Empty);
    }
    if s.len() > IdempotencyKey::MAX_LEN {
        return Err(KeyError::TooLong(s.len()));
    }
    // An sf-string holds only printable ASCII, which is exactly what IdempotencyKey accepts.
    IdempotencyKey::new(s)
        .map(Some)
        .map_err(|_| KeyError::NotString)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn parse(values: &[&[u8]]) -> Result<Option<IdempotencyKey>, KeyError> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(
                IDEMPOTENCY_KEY,
                HeaderValue::from_bytes(v).expect("header value"),
            );
        }
        parse_key_header(&headers)
    }

    #[test]
    fn accepts_sf_strings_and_ignores_parameters() {
        let k = parse(&[b"\"abc\""]).expect("ok").expect("some");
        assert_eq!(k.as_str(), "abc");
        let k = parse(&[br#""a\"b";v=1"#]).expect("ok").expect("some");
        assert_eq!(k.as_str(), "a\"b");
        let long = format!("\"{}\"", "k".repeat(255));
        assert!(parse(&[long.as_bytes()]).is_ok());
    }

    #[test]
    fn rejects_each_malformed_form() {
        assert_eq!(parse(&[b"abc"]), Err(KeyError::NotString));
        assert_eq!(parse(&[b"42"]), Err(KeyError::NotString));
        assert_eq!(parse(&[b"\"\""]), Err(KeyError::Empty));
        let long = format!("\"{}\"", "k".repeat(256));
        assert_eq!(parse(&[long.as_bytes()]), Err(KeyError::TooLong(256)));
        assert!(matches!(
            parse(&[b"\"abc"]),
            Err(KeyError::NotStructured(_))
        ));
        assert!(matches!(parse(&[b""]), Err(KeyError::NotStructured(_))));
        assert_eq!(parse(&[b"\"a\"", b"\"a\""]), Err(KeyError::Repeated(2)));
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                let mut headers = HeaderMap::new();
                headers.insert(IDEMPOTENCY_KEY, value);
                let _ = parse_key_header(&headers);
            }
        }

        #[test]
        fn every_valid_key_round_trips_through_its_header_form(key in "[ -~]{1,255}") {
            let key = IdempotencyKey::new(&key).expect("printable ASCII");
            let header = key.to_header_value();
            let parsed = parse(&[header.as_bytes()]).expect("valid").expect("present");
            prop_assert_eq!(parsed, key);
        }
    }
}
