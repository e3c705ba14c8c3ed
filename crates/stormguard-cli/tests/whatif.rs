//! `stormguard simulate policy` as a reviewer runs it: two versions of a graph side by side,
//! JSON, a plot, and bad input refused with status 2.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

#[path = "support/run.rs"]
mod run;
use run::{stderr, stdout, stormguard};

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/whatif")
        .join(name)
        .display()
        .to_string()
}

const RUN: [&str; 6] = [
    "--duration",
    "20s",
    "--inject",
    "outage:db@5s+10s",
    "--seed",
    "7",
];

fn side_by_side(extra: &[&str]) -> Output {
    let (new, old) = (fixture("protected.toml"), fixture("plain.toml"));
    let mut args = vec!["simulate", "policy", "--graph", &new, "--against", &old];
    args.extend(RUN);
    args.extend(extra);
    stormguard(&args)
}

#[test]
fn a_db_outage_is_27x_without_budgets_and_about_1_1x_with_them_side_by_side() {
    let o = side_by_side(&["--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let reports: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let db = |i: usize| {
        let report = &reports[i];
        let services = report["services"].as_array().unwrap();
        let db = services
            .iter()
            .find(|s| s["service"] == "db")
            .unwrap()
            .clone();
        (report["version"].as_str().unwrap().to_owned(), db)
    };
    let (new_version, new) = db(0);
    let (old_version, old) = db(1);
    assert_eq!(
        (new_version.as_str(), old_version.as_str()),
        ("graph", "against")
    );
    // Half the run the db is down: 1 request per entry request outside the outage, 27 (old)
    // or about 1.1 (new) inside it. Requests sent in the last second or so of the outage
    // retry into the healthy db after it, so the old run's mean stays under 14.
    let old_amp = old["amplification"].as_f64().unwrap();
    let new_amp = new["amplification"].as_f64().unwrap();
    assert!((12.0..14.0).contains(&old_amp), "{old_amp}");
    assert!((1.0..1.15).contains(&new_amp), "{new_amp}");
    // 1000 entry requests per second, about 27 000 at the db in the outage's busiest second.
    let old_peak = old["peak_per_sec"].as_f64().unwrap();
    assert!((26_000.0..=28_000.0).contains(&old_peak), "{old_peak}");
    assert_eq!(new["recovered"], true);
    assert_eq!(new["offered_series"].as_array().unwrap().len(), 20);
}

#[test]
fn the_table_prints_both_versions_and_the_same_seed_prints_the_same_bytes() {
    let first = side_by_side(&[]);
    assert!(first.status.success(), "{}", stderr(&first));
    let table = stdout(&first);
    assert!(table.contains("graph | against"), "{table}");
    let db = table.lines().find(|l| l.contains(" db ")).unwrap();
    assert!(db.contains("| 27"), "{db}");
    assert_eq!(stdout(&side_by_side(&[])), table);
}

#[test]
fn the_plot_is_written_as_svg() {
    let dir = std::env::temp_dir().join(format!("whatif-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.svg");
    let o = side_by_side(&["--plot", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("outage:db@5s+10s"),
        "{}",
        &svg[..80]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_exits_2_naming_the_problem() {
    let graph = fixture("protected.toml");
    for (args, says) in [
        (vec!["--graph", "missing.toml"], "--graph: missing.toml"),
        (
            vec!["--graph", &graph, "--inject", "outage:nosuch@1s+1s"],
            "no service \"nosuch\"",
        ),
        (
            vec!["--graph", &graph, "--inject", "outage:db@1s"],
            "KIND:SERVICE@START+DURATION",
        ),
        (vec!["--graph", &graph, "--rate", "-5"], "--rate"),
        (
            vec!["--graph", &graph, "--inject", "outage:db@90s+1s"],
            "starts after",
        ),
        (vec!["--graph", &graph, "--plot", "x.pdf"], "--plot"),
    ] {
        let mut full = vec!["simulate", "policy"];
        full.extend(args.iter().copied());
        let o = stormguard(&full);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
}
