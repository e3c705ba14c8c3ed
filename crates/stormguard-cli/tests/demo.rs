//! `stormguard demo payment-callback` as a user runs it: bad input exits 2, and the crash
//! scenario finds its way back to `stormguard demo payment-callback serve` for the child
//! process it kills.

use std::process::{Command, Output};

fn demo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stormguard"))
        .args(["demo", "payment-callback"])
        .args(args)
        .output()
        .expect("the binary runs")
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
        let o = demo(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains(flag),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
}

#[test]
fn the_crash_scenario_restarts_the_cli_as_its_own_service() {
    let o = demo(&["--quick", "--scenario", "crash"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", text(&o.stderr));
    assert!(out.contains("crash"), "{out}");
    assert!(out.contains("pass"), "{out}");
    assert!(out.contains("SIGKILL"), "{out}");
}
