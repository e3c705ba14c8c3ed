//! The proxy's `--upstream` (`stormguard_proxy::Upstream`): any string either parses to a
//! `host:port` with a port and no credentials, or is refused with a typed error; an accepted
//! upstream's authority parses back to itself, with or without `http://`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stormguard_proxy::Upstream;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(upstream) = text.parse::<Upstream>() else {
        return;
    };
    let authority = upstream.authority();
    assert!(!authority.is_empty(), "{text:?}");
    assert!(!authority.contains('@'), "{text:?}: credentials accepted");
    assert!(!authority.contains('/'), "{text:?}: a path accepted");
    let authority: http::uri::Authority = authority.parse().expect("an authority");
    assert!(authority.port_u16().is_some(), "{text:?}: no port");
    for again in [authority.to_string(), format!("http://{authority}")] {
        assert_eq!(again.parse::<Upstream>().as_ref(), Ok(&upstream), "{text:?}");
    }
});
