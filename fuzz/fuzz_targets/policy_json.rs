//! The policy file in JSON: any text is a validated file or a typed error, never a panic; a
//! file that loads writes back (as TOML and as JSON) to text that loads to the same file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stormguard::policy::PolicyFile;

fuzz_target!(|text: &str| {
    let Ok(file) = PolicyFile::from_json(text) else {
        return;
    };
    let toml = file.to_toml();
    assert_eq!(
        PolicyFile::from_toml(&toml).as_ref(),
        Ok(&file),
        "{text:?} -> TOML {toml}"
    );
    let json = file.to_json();
    assert_eq!(
        PolicyFile::from_json(&json).as_ref(),
        Ok(&file),
        "{text:?} -> JSON {json}"
    );
});
