//! Running the `stormguard` binary as a user does, for every CLI test file.

// Each test file compiles this module on its own and uses some of it.
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs `stormguard ARGS…` to the end.
pub(crate) fn stormguard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stormguard"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// What the run printed on stdout.
pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("UTF-8")
}

/// What the run printed on stderr.
pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("UTF-8")
}
