//! Runs a parsed command: validate, simulate, render, plot.

use std::fmt;

use serde::Serialize;
use stormguard::graph::CallGraph;
use stormguard_sim::InvalidParam;
use stormguard_sim::scenario::{budget, chain, converge, occ, overload, storm, whatif};

use crate::bar::Bar;
use crate::cli::{Cli, Command, Format, Output, Scenario};
use crate::plot;
use crate::render;

/// Why a command failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Bad input: exit status 2.
    Usage(String),
    /// Writing output failed: exit status 1.
    Io(String),
    /// A demo found a violated invariant or could not run: exit status 1.
    Failed(String),
    /// A demo program exited with this status and has said why itself.
    Exit(u8),
}

impl Failure {
    /// The process exit status.
    pub(crate) fn status(&self) -> u8 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Io(_) | Failure::Failed(_) => 1,
            Failure::Exit(code) => *code,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(m) | Failure::Io(m) | Failure::Failed(m) => f.write_str(m),
            Failure::Exit(code) => write!(f, "the demo exited with status {code}"),
        }
    }
}

impl From<InvalidParam> for Failure {
    fn from(e: InvalidParam) -> Self {
        Failure::Usage(e.to_string())
    }
}

/// Runs `cli` and returns what to print on stdout.
///
/// Every scenario goes the same way: its parameters are checked, then the plot file is
/// created (so a bad `--plot` is refused before a long run, not after it), then the
/// simulation runs and its output is rendered.
pub(crate) fn run(cli: Cli) -> Result<String, Failure> {
    let scenario = match cli.command {
        Command::Simulate { scenario } => scenario,
        Command::Demo { demo } => return crate::demo::run(demo),
        Command::Center(args) => return crate::center::run(args),
        Command::Policy { remote, command } => {
            return crate::governance::run_policy(remote, command);
        }
        Command::Advise { command } => return crate::governance::advise::run(command),
        Command::Proxy { proxy } => return crate::proxy::run(proxy),
    };
    match scenario {
        Scenario::Storm(a) => {
            let cfg = a.config();
            cfg.validate()?;
            let plot = open_plot(&a.out)?;
            let r = storm::run(&cfg, &mut Bar::new("storm"))?;
            finish(
                &a.out,
                plot,
                &r.rows,
                || render::storm(&r),
                || plot::storm(&r),
            )
        }
        Scenario::Chain(a) => {
            let cfg = a.config();
            cfg.validate()?;
            let plot = open_plot(&a.out)?;
            let r = chain::run(&cfg, &mut Bar::new("chain"))?;
            finish(
                &a.out,
                plot,
                &r.rows,
                || render::chain(&r),
                || plot::chain(&r),
            )
        }
        Scenario::Budget(a) => {
            let cfg = a.config();
            cfg.validate()?;
            let plot = open_plot(&a.out)?;
            let r = budget::run(&cfg, &mut Bar::new("budget"))?;
            finish(
                &a.out,
                plot,
                &r.rows,
                || render::budget(&r),
                || plot::budget(&r),
            )
        }
        Scenario::Overload(a) => {
            let cfg = a.config();
            cfg.validate()?;
            let plot = open_plot(&a.out)?;
            let r = overload::run(&cfg, &mut Bar::new("overload"))?;
            finish(
                &a.out,
                plot,
                &r.rows,
                || render::overload(&r),
                || plot::overload(&r),
            )
        }
        Scenario::Occ(a) => {
            let cfg = a.config();
            cfg.validate()?;
            let plot = open_plot(&a.out)?;
            let r = occ::run(&cfg, &mut Bar::new("occ"))?;
            finish(&a.out, plot, &r.rows, || render::occ(&r), || plot::occ(&r))
        }
        Scenario::Policy(a) => policy(&a),
        Scenario::Converge(a) => {
            let cfg = a.config();
            cfg.validate()?;
            let plot = open_plot(&a.out)?;
            let r = converge::run(&cfg, &mut Bar::new("converge"))?;
            finish(
                &a.out,
                plot,
                &r.rows,
                || render::converge(&r),
                || plot::converge(&r),
            )
        }
    }
}

/// `simulate policy`: both graphs are read and every flag checked against them before the
/// plot file is created and anything runs.
fn policy(a: &crate::cli::PolicyArgs) -> Result<String, Failure> {
    let load = |flag: &str, path: &std::path::Path| {
        CallGraph::load(path)
            .map_err(|e| Failure::Usage(format!("invalid value for --{flag}: {e}")))
    };
    let mut graphs = vec![("graph", load("graph", &a.graph)?)];
    if let Some(old) = &a.against {
        graphs.push(("against", load("against", old)?));
    }
    let cfg = a.config();
    for (_, graph) in &graphs {
        cfg.validate(graph)?;
    }
    let plot = open_plot(&a.out)?;
    let reports = graphs
        .iter()
        .map(|(version, graph)| whatif::run(graph, &cfg, version, &mut Bar::new("policy")))
        .collect::<Result<Vec<_>, _>>()?;
    finish(
        &a.out,
        plot,
        &reports,
        || render::whatif(&reports),
        || plot::whatif(&reports),
    )
}

/// Creates the `--plot` file, if one was asked for: a name of an unknown kind, a missing
/// directory or a file that cannot be written is bad input, refused before anything runs.
pub(crate) fn open_plot(out: &Output) -> Result<Option<plot::PlotFile>, Failure> {
    out.plot
        .as_deref()
        .map(plot::PlotFile::create)
        .transpose()
        .map_err(|e| Failure::Usage(format!("invalid value for --plot: {e}")))
}

/// Draws the plot if asked, and renders the rows as a table or JSON.
pub(crate) fn finish<R: Serialize + ?Sized>(
    out: &Output,
    plot: Option<plot::PlotFile>,
    rows: &R,
    table: impl FnOnce() -> String,
    chart: impl FnOnce() -> plot::Figure,
) -> Result<String, Failure> {
    if let Some(file) = plot {
        let path = file.path().display().to_string();
        file.draw(&chart())
            .map_err(|e| Failure::Io(format!("--plot {path}: {e}")))?;
    }
    match out.format {
        Format::Table => Ok(table()),
        Format::Json => serde_json::to_string_pretty(rows)
            .map(|s| s + "\n")
            .map_err(|e| Failure::Io(format!("JSON encoding failed: {e}"))),
    }
}

/// Prints the addresses a server bound (`{"listen": …, …}`) as one JSON line on stdout, the
/// first thing it prints: a caller that asked for port 0 reads where to connect (logs go to
/// stderr).
pub(crate) fn announce(addresses: &serde_json::Value) -> Result<(), Failure> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{addresses}")
        .and_then(|()| out.flush())
        .map_err(|e| Failure::Io(format!("stdout: {e}")))
}
