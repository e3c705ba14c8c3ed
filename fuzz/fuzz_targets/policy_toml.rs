//! The policy file in TOML: any text is a validated file or a typed error, never a panic; a
//! file that loads writes back (as TOML and as JSON) to text that loads to the same file.
//! The loader reads a file one `[endpoints.…]` table at a time where it can: it must accept
//! exactly what the one-document parse accepts, and read the same file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stormguard::policy::PolicyFile;
use stormguard_fuzz::assert_policy_round_trip;

/// `text` with every `[endpoints.` header after the first line written `[ endpoints.`: the
/// same TOML, which the loader never cuts into pieces. `None` when nothing would be cut.
fn as_one_document(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 16);
    let mut cut = false;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let body = line.trim_start();
        if i > 0 && body.starts_with("[endpoints.") {
            out.push_str(&line[..line.len() - body.len()]);
            out.push_str("[ ");
            out.push_str(&body[1..]);
            cut = true;
        } else {
            out.push_str(line);
        }
    }
    cut.then_some(out)
}

fuzz_target!(|text: &str| {
    let parsed = PolicyFile::from_toml(text);
    if let Some(whole) = as_one_document(text) {
        let one = PolicyFile::from_toml(&whole);
        assert_eq!(
            parsed.as_ref().ok(),
            one.as_ref().ok(),
            "{text:?} read by tables: {parsed:?}, as one document: {one:?}"
        );
    }
    let Ok(file) = parsed else {
        return;
    };
    assert_policy_round_trip(text, &file);
});
