//! The request fingerprint: the canonical JSON form means what serde_json reads, is a fixed
//! point, and a JSON body hashes the same as its canonical form; any request head and body
//! fingerprint without a panic, the same way twice.
#![no_main]

use http::Request;
use libfuzzer_sys::fuzz_target;
use stormguard_idempotency::fingerprint::canonical_json;
use stormguard_idempotency::{DefaultFingerprinter, Fingerprinter};

const CONTENT_TYPES: [&str; 4] = [
    "application/json",
    "application/problem+json; charset=utf-8",
    "text/plain",
    "APPLICATION/JSON",
];

// Input: one byte choosing the content type, the request target up to the first newline,
// then the body.
fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (target, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&b"/"[..], rest),
    };
    let canonical = canonical_json(body);
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) {
        let c = canonical.as_deref().expect("serde_json accepted it");
        let again: serde_json::Value = serde_json::from_slice(c).expect("canonical JSON parses");
        assert_eq!(again, value);
    }
    if let Some(c) = &canonical {
        assert_eq!(canonical_json(c).as_ref(), Some(c), "a fixed point");
    }

    let content_type = CONTENT_TYPES[usize::from(selector % 4)];
    let Ok(request) = Request::builder()
        .method("POST")
        .uri(target)
        .header("content-type", content_type)
        .header("x-v", u16::from(selector).to_string())
        .body(())
    else {
        return;
    };
    let (parts, ()) = request.into_parts();
    let f = DefaultFingerprinter::new().with_header(http::HeaderName::from_static("x-v"));
    let print = f.fingerprint(&parts, body);
    assert_eq!(print, f.fingerprint(&parts, body));
    if let (Some(c), true) = (
        &canonical,
        content_type.to_ascii_lowercase().contains("json"),
    ) {
        assert_eq!(
            print,
            f.fingerprint(&parts, c),
            "JSON is fingerprinted by its canonical form"
        );
    }
});
