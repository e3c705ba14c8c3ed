//! Running the `stormguard` binary as a user does, for every CLI test file.

// Each test file compiles this module on its own and uses some of it.
#![allow(dead_code)]

use std::path::PathBuf;
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

/// The JSON array a run that must succeed printed (`--format json`); a failure shows its
/// arguments and stderr.
pub(crate) fn json_rows(args: &[&str]) -> Vec<serde_json::Value> {
    let o = stormguard(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("a JSON array on stdout")
}

/// A path for `name` in this test process's own directory under the system's temp dir
/// (`group` keeps the test files' directories apart).
pub(crate) fn temp_path(group: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("stormguard-{group}-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}
