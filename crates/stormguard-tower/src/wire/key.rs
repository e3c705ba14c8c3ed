//! The `Idempotency-Key` header, read the same way by the client stack and the server.
//!
//! The IETF httpapi draft defines the field as a structured-field Item (RFC 8941/9651) whose
//! value is a String: `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`. This is the
//! one parser of the project: the retrying client decides with it whether a request is keyed
//! (and so safe to repeat), and `stormguard-idempotency` decides with it whether to accept the
//! request. A bare token (`order-1`), an integer, an empty string, a string over 255
//! characters, or the header sent twice are all malformed: the server answers 400, and the
//! client treats the request as unkeyed (it is then repeated only if its method is
//! idempotent), so the two never disagree. Parameters on the item are ignored, as structured
//! fields ask of unknown parameters. There is no leniency on either side.

use http::HeaderMap;
use http::header::HeaderName;
use stormguard::retry::IdempotencyKey;

/// The header name, lower case as HTTP/2 and `http` spell it.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The header a replayed response carries (`Idempotent-Replayed: true`).
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
/// use stormguard_tower::wire::{KeyError, idempotency_key};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(idempotency_key(&headers), Ok(None));
/// headers.insert("idempotency-key", "\"order-17\"".parse().unwrap());
/// assert_eq!(idempotency_key(&headers).unwrap().unwrap().as_str(), "order-17");
/// headers.insert("idempotency-key", "order-17".parse().unwrap());
/// assert_eq!(idempotency_key(&headers), Err(KeyError::NotString));
/// ```
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyError> {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let extra = values.count();
    if extra > 0 {
        return Err(KeyError::Repeated(extra + 1));
    }
    let bytes = value.as_bytes();
    // The usual key: a quoted string without escapes or parameters. Read it without the
    // structured-field parser's allocations.
    if let Some(inner) = bytes
        .strip_prefix(b"\"")
        .and_then(|rest| rest.strip_suffix(b"\""))
    {
        if inner
            .iter()
            .all(|&b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
        {
            return checked(inner.len(), || std::str::from_utf8(inner).ok());
        }
    }
    let item: sfv::Item = sfv::Parser::new(bytes)
        .parse()
        .map_err(|e| KeyError::NotStructured(e.to_string()))?;
    let Some(s) = item.bare_item.as_string() else {
        return Err(KeyError::NotString);
    };
    let s = s.as_str();
    checked(s.len(), || Some(s))
}

/// Whether `headers` carry one valid `Idempotency-Key` (the same rule as
/// [`idempotency_key`]), without making the key: what a retrier needs to know to decide that
/// a request is safe to repeat (the header itself goes out unchanged on every attempt).
///
/// ```
/// use http::HeaderMap;
/// use stormguard_tower::wire::has_idempotency_key;
///
/// let mut headers = HeaderMap::new();
/// assert!(!has_idempotency_key(&headers));
/// headers.insert("idempotency-key", "\"order-17\"".parse().unwrap());
/// assert!(has_idempotency_key(&headers));
/// headers.insert("idempotency-key", "order-17".parse().unwrap());
/// assert!(!has_idempotency_key(&headers));
/// ```
pub fn has_idempotency_key(headers: &HeaderMap) -> bool {
    if !super::carries(headers, &IDEMPOTENCY_KEY) {
        return false;
    }
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let bytes = value.as_bytes();
    if let Some(inner) = bytes
        .strip_prefix(b"\"")
        .and_then(|rest| rest.strip_suffix(b"\""))
    {
        if inner
            .iter()
            .all(|&b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
        {
            return (1..=IdempotencyKey::MAX_LEN).contains(&inner.len());
        }
    }
    idempotency_key(headers).is_ok_and(|key| key.is_some())
}

/// The key of `len` characters that `text` yields, or why it is not one.
fn checked<'a>(
    len: usize,
    text: impl FnOnce() -> Option<&'a str>,
) -> Result<Option<IdempotencyKey>, KeyError> {
    if len == 0 {
        return Err(KeyError::Empty);
    }
    if len > IdempotencyKey::MAX_LEN {
        return Err(KeyError::TooLong(len));
    }
    // An sf-string holds only printable ASCII, which is exactly what IdempotencyKey accepts.
    text()
        .and_then(|s| IdempotencyKey::new(s).ok())
        .map(Some)
        .ok_or(KeyError::NotString)
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
        idempotency_key(&headers)
    }

    /// The structured-field parser alone: the model the fast path must agree with.
    fn by_sfv(value: &[u8]) -> Option<String> {
        let item: sfv::Item = sfv::Parser::new(value).parse().ok()?;
        let s = item.bare_item.as_string()?.as_str().to_owned();
        (!s.is_empty() && s.len() <= IdempotencyKey::MAX_LEN).then_some(s)
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
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn agrees_with_the_structured_field_parser(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                let mut headers = HeaderMap::new();
                headers.insert(IDEMPOTENCY_KEY, value);
                let ours = idempotency_key(&headers).ok().flatten().map(|k| k.as_str().to_owned());
                prop_assert_eq!(ours, by_sfv(&bytes));
            }
        }

        #[test]
        fn agrees_on_quoted_strings(s in "\"[ -~]{0,260}\"(;[a-z]=[0-9])?") {
            let ours = parse(&[s.as_bytes()]).ok().flatten().map(|k| k.as_str().to_owned());
            prop_assert_eq!(&ours, &by_sfv(s.as_bytes()));
            let mut headers = HeaderMap::new();
            headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_bytes(s.as_bytes()).expect("value"));
            prop_assert_eq!(has_idempotency_key(&headers), ours.is_some());
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
