//! `stormguard demo …`: reference services run under their verification harness.
//!
//! The demos live in their own crates (under `examples/`); this module only hands them the
//! parsed arguments and a [`Launcher`] that leads back here, so the harness can start the
//! service as a child process with `stormguard demo payment-callback serve …`.

use clap::Subcommand;
use stormguard_payment_callback::{DemoArgs, Launcher};

use crate::run::Failure;

/// The demos.
#[derive(Debug, Subcommand)]
pub(crate) enum Demo {
    /// The idempotent payment callback under duplicates, a crash, network faults and a risk
    /// outage (SQLite by default; --database-url for PostgreSQL or MariaDB).
    PaymentCallback(DemoArgs),
}

/// Runs a demo; it prints its own output, so there is nothing left to print.
pub(crate) fn run(demo: Demo) -> Result<String, Failure> {
    match demo {
        Demo::PaymentCallback(args) => {
            let launcher = Launcher::current_exe(&["demo", "payment-callback"])
                .map_err(|e| Failure::Io(format!("cannot find the stormguard executable: {e}")))?;
            stormguard_payment_callback::run(args, launcher)
                .map(|()| String::new())
                .map_err(|e| match e.exit_code() {
                    2 => Failure::Usage(e.to_string()),
                    _ => Failure::Failed(e.to_string()),
                })
        }
    }
}
