//! The policy file in TOML: any text is a validated file or a typed error, never a panic; a
//! file that loads writes back (as TOML and as JSON) to text that loads to the same file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stormguard::policy::PolicyFile;
use stormguard_fuzz::assert_policy_round_trip;

fuzz_target!(|text: &str| {
    let Ok(file) = PolicyFile::from_toml(text) else {
        return;
    };
    assert_policy_round_trip(text, &file);
});
