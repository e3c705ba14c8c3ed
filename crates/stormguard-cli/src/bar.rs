//! A progress bar on stderr, for long runs watched from a terminal.
//!
//! The bar exists only when stderr is a terminal, and stays hidden for the first second, so
//! short runs, pipes, files and tests never see it, and stdout (the results) is never
//! touched.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use stormguard_sim::progress::Progress;

/// How long a run must last before its bar appears.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// An indicatif bar driven by a scenario's [`Progress`] calls.
pub(crate) struct Bar {
    bar: Option<ProgressBar>,
    started: Instant,
    shown: bool,
}

impl Bar {
    /// A bar for `what`, if stderr is a terminal.
    pub(crate) fn new(what: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {wide_bar} {percent:>3}% eta {eta}",
            ) {
                bar.set_style(style);
            }
            bar.set_prefix(what.to_string());
            bar
        });
        Bar {
            bar,
            started: Instant::now(),
            shown: false,
        }
    }
}

impl Progress for Bar {
    fn start(&mut self, total: u64) {
        self.started = Instant::now();
        if let Some(bar) = &self.bar {
            bar.set_length(total);
        }
    }

    fn set(&mut self, done: u64) {
        let Some(bar) = &self.bar else {
            return;
        };
        bar.set_position(done);
        if !self.shown && self.started.elapsed() >= SHOW_AFTER {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown = true;
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
