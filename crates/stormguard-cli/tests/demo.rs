//! `stormguard demo payment-callback` as a user runs it: it runs the example's own
//! `payment-callback` program with the same arguments, bad input exits 2, and the crash
//! scenario restarts that program as its own service.
//!
//! The program is found beside the `stormguard` executable, where a workspace build
//! (`cargo test --workspace`) puts it. When it is not there (`cargo test -p stormguard-cli`
//! alone) these tests print `SKIPPED`, or fail with `STORMGUARD_REQUIRE_PEERS=1` (CI).

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output};

fn demo(args: &[&str]) -> Option<Output> {
    let stormguard = Path::new(env!("CARGO_BIN_EXE_stormguard"));
    let beside =
        stormguard.with_file_name(format!("payment-callback{}", std::env::consts::EXE_SUFFIX));
    if !beside.is_file() {
        let why = format!(
            "{} is not built (run the workspace tests, or cargo build -p stormguard-payment-callback)",
            beside.display()
        );
        if std::env::var("STORMGUARD_REQUIRE_PEERS").as_deref() == Ok("1") {
            panic!("{why}, but STORMGUARD_REQUIRE_PEERS=1");
        }
        let _ = writeln!(std::io::stderr(), "SKIPPED: demo tests: {why}");
        return None;
    }
    Some(
        Command::new(stormguard)
            .args(["demo", "payment-callback"])
            .args(args)
            // Never build from inside a test: the outer cargo holds the build directory.
            .env_remove("CARGO")
            .output()
            .expect("the binary runs"),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn bad_input_exits_2_and_names_the_flag() {
    for (args, flag) in [
        (&["--time-scale", "0"][..], "--time-scale"),
        (
            &["--database-url", "redis://127.0.0.1/"][..],
            "--database-url",
        ),
        (&["--scenario", "meteor"][..], "--scenario"),
        (&["serve", "--listen", "nowhere"][..], "--listen"),
    ] {
        let Some(o) = demo(args) else { return };
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains(flag),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
}

#[test]
fn help_is_the_demo_programs_own() {
    let Some(o) = demo(&["--help"]) else { return };
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("--database-url"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn the_crash_scenario_restarts_its_own_service() {
    let Some(o) = demo(&["--quick", "--scenario", "crash"]) else {
        return;
    };
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", text(&o.stderr));
    assert!(out.contains("crash"), "{out}");
    assert!(out.contains("pass"), "{out}");
    assert!(out.contains("SIGKILL"), "{out}");
}
