//! Holding tokio's paused clock still while tests talk over real sockets.
//!
//! With time paused, tokio advances the clock by itself whenever the runtime has nothing to
//! run ("auto-advance"), straight to the next pending timer. Over real sockets the runtime also
//! has nothing to run while bytes are in flight between a write and the peer's readiness, so
//! an auto-advance could land in the middle of an exchange: the clock would jump to the next
//! pending timer (a request's deadline, say) and the request would time out. Whether that
//! happens depends on how the kernel schedules loopback delivery, so it is not deterministic.
//! A test holding the clock ([`ClockHold`]) moves it only with `tokio::time::advance`, at a
//! point it has reached ("the handler is asleep"); no time passes during I/O, and every value
//! can be compared exactly.
//!
//! Shared by the test files that need it (`#[path]`), in this crate and in the examples.

use std::time::Duration;

/// Real time after which a held test that got no answer fails instead of hanging.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// Keeps tokio's paused clock from auto-advancing while it lives: tokio does not auto-advance
/// while a `spawn_blocking` task runs (`tokio::time::pause`, "Preventing auto-advance"). The
/// blocking task waits until the hold is dropped, or gives up after [`PATIENCE`] of real time,
/// which [`ClockHold::within`] turns into a test failure.
pub(crate) struct ClockHold {
    _release: std::sync::mpsc::Sender<()>,
    patience: tokio::task::JoinHandle<()>,
}

impl ClockHold {
    /// Holds the clock of the current (paused, current-thread) runtime.
    pub(crate) fn new() -> ClockHold {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let patience = tokio::task::spawn_blocking(move || {
            // Returns when the sender is dropped (the hold ends), or after PATIENCE.
            let _ = released.recv_timeout(PATIENCE);
        });
        ClockHold {
            _release: release,
            patience,
        }
    }

    /// Runs `future` to its end, or fails the test after [`PATIENCE`] of real time.
    pub(crate) async fn within<F: Future>(&mut self, future: F) -> F::Output {
        tokio::select! {
            biased;
            out = future => out,
            _ = &mut self.patience => panic!("no answer within {PATIENCE:?} of real time"),
        }
    }
}
