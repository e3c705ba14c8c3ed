//! The proxy's `--fault-abort RATE:STATUS|reset` and `--fault-delay RATE:DURATION`
//! (`stormguard_proxy::fault_spec`): any string parses or is refused with a typed error; an
//! accepted rate is a number from 0 to 1, an accepted status an error status; an abort writes
//! back to text that parses to the same setting.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stormguard::duration::format_duration;
use stormguard::fault::{Abort, Latency};
use stormguard_proxy::fault_spec::{parse_abort, parse_delay};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok((rate, abort)) = parse_abort(text) {
        assert!((0.0..=1.0).contains(&rate), "{text:?}: rate {rate}");
        let what = match abort {
            Abort::Status { status, retry_after } => {
                assert!((400..=599).contains(&status), "{text:?}: status {status}");
                assert_eq!(retry_after, None);
                status.to_string()
            }
            Abort::Reset => "reset".to_owned(),
        };
        assert_eq!(parse_abort(&format!("{rate}:{what}")), Ok((rate, abort)), "{text:?}");
    }
    if let Ok((rate, latency)) = parse_delay(text) {
        assert!((0.0..=1.0).contains(&rate), "{text:?}: rate {rate}");
        let Latency::Fixed(delay) = latency else {
            panic!("{text:?}: {latency:?} is not a fixed delay");
        };
        let again = format!("{rate}:{}", format_duration(delay));
        assert_eq!(parse_delay(&again), Ok((rate, latency)), "{text:?}");
    }
});
