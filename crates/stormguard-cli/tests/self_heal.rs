//! `stormguard demo self-heal` as a user runs it: bad input is refused before anything
//! starts, with the flag named and exit status 2. (The story itself is tested under paused
//! time beside the demo's code, `src/selfheal/tests.rs`: a run of the binary takes its full
//! duration in real time.)

#[path = "support/run.rs"]
mod run;
use run::{stderr, stormguard, temp_path};

#[test]
fn bad_input_names_the_flag_and_exits_2() {
    let rules = temp_path("self-heal", "rules.toml");
    std::fs::write(&rules, "[[rules]]\nname = \"x\"\nservice = \"web\"\n").expect("write");
    let rules = rules.display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["--clients", "0"], "--clients"),
        (&["--clients", "-1"], "--clients"),
        (&["--rate", "0"], "--rate"),
        (&["--outage-for", "0s"], "--outage-for"),
        (&["--outage-at", "-1s"], "--outage-at"),
        (&["--duration", "30s"], "--duration"),
        (&["--plot", "out.pdf"], "--plot"),
        (&["--format", "yaml"], "--format"),
        (&["--rules", "/nonexistent/rules.toml"], "--rules"),
        (&["--rules", &rules], "missing field `endpoint`"),
    ];
    for (args, flag) in cases {
        let o = stormguard(&[&["demo", "self-heal"], *args].concat());
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: does not name {flag}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}
