//! The idempotency stores' byte codec (stored header lists, the Redis record payload):
//! arbitrary bytes decode or are `Corrupt`, never a panic; whatever decodes encodes back to
//! bytes that decode to the same completion.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stormguard_idempotency::store::codec::{
    completion_columns, completion_from_columns, decode_headers, decode_payload, encode_headers,
    encode_payload,
};

// Input: one byte choosing the record state, then the stored bytes.
fuzz_target!(|data: &[u8]| {
    let Some((&state, bytes)) = data.split_first() else {
        return;
    };
    let state = i64::from(state % 5);
    if let Ok(headers) = decode_headers(bytes) {
        let again = encode_headers(&headers);
        assert_eq!(
            decode_headers(&again).expect("re-encoded headers decode"),
            headers
        );
        // Names are stored lower case; bytes that were already canonical come back unchanged.
        if bytes.len() == again.len() {
            assert_eq!(decode_headers(&again).ok(), decode_headers(bytes).ok());
        }
    }
    if let Ok(completion) = decode_payload(state, bytes) {
        let again = encode_payload(&completion);
        assert_eq!(
            decode_payload(state, &again).as_ref().ok(),
            Some(&completion)
        );
        let (s, status, headers, body) = completion_columns(&completion);
        assert_eq!(s, state);
        let back = completion_from_columns(s, Some(status), Some(headers), Some(body));
        assert_eq!(back.ok(), Some(completion));
    }
    let split = bytes.len() / 2;
    let _ = completion_from_columns(
        state,
        Some(i64::from(bytes.first().copied().unwrap_or(0)) * 4),
        Some(bytes[..split].to_vec()),
        Some(bytes[split..].to_vec()),
    );
});
