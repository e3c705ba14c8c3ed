//! Progress reporting, for front ends that show a progress bar.
//!
//! The simulator knows how far a run has got; only the front end knows whether anyone is
//! watching (a terminal) and how to draw. Scenarios call [`Progress::set`] every few thousand
//! units of work, never per event, so a no-op [`NoProgress`] costs nothing measurable.

/// Receives a scenario's progress.
pub trait Progress {
    /// The run has `total` units of work (clients, runs or simulated milliseconds).
    fn start(&mut self, total: u64) {
        let _ = total;
    }

    /// `done` units of `total` are finished.
    fn set(&mut self, done: u64) {
        let _ = done;
    }

    /// The run is over.
    fn finish(&mut self) {}
}

/// Reports nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}
