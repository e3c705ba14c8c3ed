//! The `stormguard` binary as a user runs it: output, exit codes, plots, reproducibility.

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

#[path = "support/run.rs"]
mod run;
use run::{stderr, stdout, stormguard};

fn simulate(args: &[&str]) -> Output {
    let mut all = vec!["simulate"];
    all.extend_from_slice(args);
    stormguard(&all)
}

fn json(args: &[&str]) -> Vec<Value> {
    let mut all = args.to_vec();
    all.extend(["--format", "json"]);
    let o = simulate(&all);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("valid JSON");
    v.as_array().expect("an array of rows").clone()
}

fn temp(name: &str) -> PathBuf {
    run::temp_path("cli", name)
}

/// Each `(arguments, flag)` exits with status 2, prints nothing on stdout, and names the flag.
fn refused_naming_the_flag(cases: &[(&[&str], &str)]) {
    for (args, flag) in cases {
        let o = simulate(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(flag),
            "{args:?}: message does not name {flag}: {err}"
        );
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

/// Small runs of every scenario, for the tests that go through all of them.
const SMALL: [&[&str]; 6] = [
    &["storm"],
    &["chain", "--rate", "200"],
    &["budget", "--duration", "2s", "--failures", "random"],
    &["overload", "--duration", "30s"],
    &["occ", "--clients", "10,20", "--runs", "5"],
    &["converge", "--duration", "4s", "--change-at", "2s"],
];

#[test]
fn storm_prints_the_seeds_table() {
    let o = simulate(&["storm"]);
    assert!(o.status.success());
    let out = stdout(&o);
    for line in [
        "fixed",
        "exponential + full jitter",
        "decorrelated jitter",
        "4000",
        "1000",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    assert!(out.contains("15.0 s") && out.contains("4.0 s"), "{out}");
    assert!(stderr(&o).is_empty(), "no progress bar outside a terminal");
}

#[test]
fn storm_json_has_the_documented_keys_and_figures() {
    let rows = json(&["storm"]);
    assert_eq!(rows.len(), 6);
    for row in &rows {
        for key in [
            "scenario",
            "strategy",
            "label",
            "parameters",
            "total_retries",
            "peak_per_bin",
            "peak_at_s",
            "last_retry_s",
        ] {
            assert!(row.get(key).is_some(), "missing {key} in {row}");
        }
        assert_eq!(row["scenario"], "storm");
        assert_eq!(row["parameters"]["clients"], 1000);
        assert_eq!(row["parameters"]["bin"], 0.1);
    }
    let fixed = &rows[0];
    assert_eq!(fixed["strategy"], "fixed");
    assert_eq!(fixed["total_retries"], 4000);
    assert_eq!(fixed["peak_per_bin"], 1000);
    assert_eq!(fixed["last_retry_s"], 4.0);
    let full = &rows[3];
    assert_eq!(full["strategy"], "full");
    let peak = full["peak_per_bin"].as_u64().expect("a number");
    assert!((130..=190).contains(&peak), "{peak}");
}

#[test]
fn every_scenario_prints_parseable_json_with_the_common_keys() {
    for args in SMALL {
        let rows = json(args);
        assert!(!rows.is_empty(), "{args:?}");
        for row in rows {
            assert_eq!(row["scenario"], args[0]);
            for key in ["strategy", "label", "parameters"] {
                assert!(row.get(key).is_some(), "{args:?}: missing {key}");
            }
        }
    }
}

#[test]
fn scenario_figures_reach_the_json() {
    let chain = json(&["chain", "--rate", "100", "--mode", "every-layer,entry-only"]);
    assert_eq!(chain[0]["amplification"], 27.0);
    assert_eq!(chain[1]["amplification"], 3.0);
    let overload = json(&["overload"]);
    assert_eq!(overload[0]["strategy"], "none");
    assert_eq!(overload[0]["recovered"], false);
    assert_eq!(overload[1]["recovered"], true);
    assert_eq!(overload[2]["recovered"], true);
    assert_eq!(overload[0]["series"].as_array().map(Vec::len), Some(60));
    let budget = json(&["budget", "--budget", "seeds,grpc"]);
    let ms = budget[0]["shutoff_ms"].as_f64().expect("a number");
    assert!((17.0..=24.0).contains(&ms), "{ms}");
}

#[test]
fn the_same_seed_prints_the_same_bytes() {
    for args in SMALL {
        for format in ["table", "json"] {
            let mut all = args.to_vec();
            all.extend(["--format", format, "--seed", "7"]);
            let a = simulate(&all);
            let b = simulate(&all);
            assert!(a.status.success());
            assert_eq!(a.stdout, b.stdout, "{all:?}");
        }
    }
}

#[test]
fn another_seed_moves_jittered_figures_within_tolerance() {
    let peaks: Vec<u64> = [1, 2, 3]
        .iter()
        .map(|seed| {
            let rows = json(&["storm", "--strategy", "full", "--seed", &seed.to_string()]);
            rows[0]["peak_per_bin"].as_u64().expect("a number")
        })
        .collect();
    assert!(peaks.iter().all(|p| (130..=190).contains(p)), "{peaks:?}");
    assert!(peaks.windows(2).any(|w| w[0] != w[1]), "{peaks:?}");
    let fixed = json(&["storm", "--strategy", "fixed", "--seed", "5"]);
    assert_eq!(fixed[0]["peak_per_bin"], 1000);
}

#[test]
fn plots_are_valid_svg_and_png_and_reproducible() {
    for (i, args) in SMALL.iter().enumerate() {
        let svg = temp(&format!("plot-{i}.svg"));
        let path = svg.to_str().expect("UTF-8 path");
        let mut all = args.to_vec();
        all.extend(["--plot", path]);
        let o = simulate(&all);
        assert!(o.status.success(), "{all:?}: {}", stderr(&o));
        let text = std::fs::read_to_string(&svg).expect("written");
        let head = text.trim_start();
        assert!(
            head.starts_with("<svg") || head.starts_with("<?xml"),
            "{}",
            &text[..80.min(text.len())]
        );
        assert!(text.trim_end().ends_with("</svg>"));
        assert!(
            text.contains("<text"),
            "labels are drawn with the bundled font"
        );
        let again = simulate(&all);
        assert!(again.status.success());
        assert_eq!(
            std::fs::read_to_string(&svg).expect("written"),
            text,
            "{all:?}"
        );
    }
    let png = temp("storm.png");
    let o = simulate(&["storm", "--plot", png.to_str().expect("UTF-8 path")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&png).expect("written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert!(bytes.len() > 1000);
}

#[test]
fn bad_input_names_the_flag_and_exits_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["storm", "--clients", "0"], "--clients"),
        (&["storm", "--clients", "-5"], "--clients"),
        (&["storm", "--base", "-1s"], "--base"),
        (&["storm", "--base", "1000h"], "--base"),
        (&["storm", "--cap", "250"], "--cap"),
        (&["storm", "--cap", "100ms"], "--cap"),
        (&["storm", "--bin", "10m"], "--bin"),
        (&["storm", "--bin", "0"], "--bin"),
        (&["storm", "--strategy", "fixed,fibonacci"], "--strategy"),
        (&["storm", "--plot", "out.pdf"], "--plot"),
        (&["storm", "--format", "yaml"], "--format"),
        (&["chain", "--layers", "0"], "--layers"),
        (&["chain", "--fail-prob", "2"], "--fail-prob"),
        (&["chain", "--retries", "1,2"], "--retries"),
        (&["budget", "--after", "1.5"], "--after"),
        (&["budget", "--budget", "leaky"], "--budget"),
        (&["budget", "--bin", "10s"], "--bin"),
        (&["overload", "--trigger", "meteor"], "--trigger"),
        (&["overload", "--trigger-at", "1s"], "--trigger-at"),
        (&["overload", "--timeout", "0s"], "--timeout"),
        (&["occ", "--runs", "0"], "--runs"),
        (&["occ", "--clients", "0"], "--clients"),
        (&["converge", "--workers", "0"], "--workers"),
        (&["converge", "--change-at", "30s"], "--change-at"),
        (
            &["converge", "--limit-algorithm", "bbr"],
            "--limit-algorithm",
        ),
    ];
    refused_naming_the_flag(cases);
}

/// Flags that mean what a policy file's field means follow the file's rules, with the same
/// function deciding; flag names say whether they hold a fraction or a percentage.
#[test]
fn flags_follow_the_policy_files_rules_and_name_what_they_hold() {
    let cases: &[(&[&str], &str)] = &[
        // A token ratio above 1 (the file allows 0.001..=1), whichever budgets run.
        (&["budget", "--token-ratio", "5"], "--token-ratio"),
        (
            &["budget", "--budget", "ratio", "--token-ratio", "5"],
            "--token-ratio",
        ),
        (&["overload", "--token-ratio", "5"], "--token-ratio"),
        // `--retry-percent 20` meant 2000 %; the flag is now --retry-ratio, a fraction.
        (&["budget", "--retry-percent", "20"], "--retry-percent"),
        (&["budget", "--retry-ratio", "20"], "--retry-ratio"),
        (&["budget", "--retry-ratio", "1.5"], "--retry-ratio"),
        // `chain --budget-percent 10` was a fraction: 1000 %, no budget at all.
        (&["chain", "--budget-percent", "10"], "--budget-percent"),
        (&["chain", "--retry-ratio", "10"], "--retry-ratio"),
        // A minimum call no shorter than the deadline: no retry can ever fit.
        (
            &["overload", "--min-call", "5s", "--deadline", "1s"],
            "--min-call",
        ),
        (&["overload", "--min-call", "1s"], "--min-call"),
        (&["storm", "--threads", "-1"], "--threads"),
        (&["storm", "--threads", "65"], "--threads"),
    ];
    refused_naming_the_flag(cases);
    let ok = json(&[
        "chain",
        "--rate",
        "100",
        "--mode",
        "budget",
        "--retry-ratio",
        "0.5",
    ]);
    assert_eq!(ok[0]["parameters"]["retry_ratio"], 0.5);
}

/// A plot path that cannot be written is bad input, refused before the simulation runs
/// (exit 2, not an I/O failure after the whole run), with a message for people.
#[test]
fn the_plot_path_is_checked_before_anything_runs() {
    let missing = temp("no-such-dir").join("x");
    for ext in ["svg", "png"] {
        let path = missing.with_extension(ext);
        let o = simulate(&["storm", "--plot", path.to_str().expect("UTF-8 path")]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("--plot"), "{err}");
        assert!(err.contains("No such file or directory"), "{err}");
        for debug in ["IoError", "Os {", "kind:", "drawing failed"] {
            assert!(!err.contains(debug), "debug text in {err}");
        }
        assert!(o.stdout.is_empty());
    }
    let dir = temp("a-directory.svg");
    std::fs::create_dir_all(&dir).expect("dir");
    let o = simulate(&["storm", "--plot", dir.to_str().expect("UTF-8 path")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--plot"));
    // A run refused for another reason leaves no plot file behind.
    let never = temp("never.svg");
    let o = simulate(&[
        "storm",
        "--clients",
        "0",
        "--plot",
        never.to_str().expect("UTF-8"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!never.exists());
}

#[test]
fn help_explains_every_scenario() {
    let o = simulate(&["--help"]);
    assert!(o.status.success());
    let help = stdout(&o);
    for word in [
        "storm", "chain", "budget", "overload", "occ", "converge", "--format", "JSON",
    ] {
        assert!(help.contains(word), "simulate --help lacks {word}");
    }
    for scenario in ["storm", "chain", "budget", "overload", "occ", "converge"] {
        let o = simulate(&[scenario, "--help"]);
        assert!(o.status.success());
        let text = stdout(&o);
        assert!(text.contains("What the figures mean"), "{scenario}");
        assert!(text.contains("JSON keys per row"), "{scenario}");
    }
}
