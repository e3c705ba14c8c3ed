//! The policy center client's server-sent event parser (`stormguard_tower::client::center::
//! SseParser`), fed bytes from the network: any bytes are events or a typed error, never a
//! panic and never an event over the limit; and the events do not depend on where the
//! stream was cut into chunks (the first byte picks the cut).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stormguard_tower::client::center::{SseError, SseEvent, SseParser};

const LIMIT: usize = 256;

/// Every event of `chunks` fed in order, or the first error.
fn parse(chunks: &[&[u8]]) -> Result<Vec<SseEvent>, SseError> {
    let mut parser = SseParser::new(LIMIT);
    let mut events = Vec::new();
    for chunk in chunks {
        events.extend(parser.push(chunk)?);
    }
    Ok(events)
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let whole = parse(&[stream]);
    let at = usize::from(cut) % (stream.len() + 1);
    let (a, b) = stream.split_at(at);
    let parts = parse(&[a, b]);
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    let one_by_one = parse(&bytes);
    match (&whole, &parts, &one_by_one) {
        (Ok(w), Ok(p), Ok(o)) => {
            assert_eq!(w, p, "cut at {at}");
            assert_eq!(w, o, "byte by byte");
            for event in w {
                assert!(event.data.len() <= LIMIT, "an event over the limit");
            }
        }
        (Err(w), Err(p), Err(o)) => {
            assert_eq!(w, p, "cut at {at}");
            assert_eq!(w, o, "byte by byte");
        }
        _ => panic!("cut at {at}: whole {whole:?}, in two {parts:?}, byte by byte {one_by_one:?}"),
    }
});
