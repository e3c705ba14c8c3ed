//! The one `Idempotency-Key` parser (`stormguard_tower::wire`, used by the client stack and
//! by the idempotency server) against an independent RFC 9651 sf-string model: the same
//! values are keys, with the same text; a header sent twice is never a key; the client's
//! quick check (`has_idempotency_key`) agrees with the full parse.
#![no_main]

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use stormguard_fuzz::sf;
use stormguard_tower::wire::{IDEMPOTENCY_KEY, KeyError, has_idempotency_key, idempotency_key};

fuzz_target!(|data: &[u8]| {
    let (repeat, value) = match data.split_first() {
        Some((&b, rest)) => (b == b'\n', rest),
        None => (false, data),
    };
    let Ok(header) = HeaderValue::from_bytes(value) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.append(IDEMPOTENCY_KEY, header.clone());
    if repeat {
        headers.append(IDEMPOTENCY_KEY, header);
    }
    let ours = idempotency_key(&headers);
    assert_eq!(has_idempotency_key(&headers), matches!(ours, Ok(Some(_))));
    if repeat {
        assert_eq!(ours, Err(KeyError::Repeated(2)));
        return;
    }
    let model = match sf::item_string(value) {
        Err(sf::NotAnItem) => Err("not an item"),
        Ok(None) => Err("not a string"),
        Ok(Some(s)) if s.is_empty() => Err("empty"),
        Ok(Some(s)) if s.len() > 255 => Err("too long"),
        Ok(Some(s)) => Ok(s),
    };
    match (&ours, &model) {
        (Ok(Some(key)), Ok(text)) => assert_eq!(key.as_str(), text),
        (Err(KeyError::NotStructured(_)), Err("not an item"))
        | (Err(KeyError::NotString), Err("not a string"))
        | (Err(KeyError::Empty), Err("empty"))
        | (Err(KeyError::TooLong(_)), Err("too long")) => {}
        _ => panic!("{value:?}: parser {ours:?}, model {model:?}"),
    }
    // A key written back as a header value reads back as itself.
    if let Ok(Some(key)) = ours {
        let mut again = HeaderMap::new();
        let value = HeaderValue::from_str(&key.to_header_value()).expect("a key is a header value");
        again.insert(IDEMPOTENCY_KEY, value);
        assert_eq!(idempotency_key(&again), Ok(Some(key)));
    }
});
