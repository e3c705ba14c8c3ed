//! `payment-callback`: the payment-callback harness (default) or the service (`serve`).
//!
//! The same entry points as `stormguard demo payment-callback`.

use std::process::ExitCode;

use clap::Parser;
use stormguard_payment_callback::{DemoArgs, Launcher, run};

/// The payment-callback reference service and its load and chaos verification.
#[derive(Debug, Parser)]
#[command(name = "payment-callback", version, about)]
struct Cli {
    #[command(flatten)]
    demo: DemoArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let launcher = match Launcher::current_exe(&[]) {
        Ok(launcher) => launcher,
        Err(e) => {
            eprintln!("error: cannot find this program's own executable: {e}");
            return ExitCode::from(1);
        }
    };
    match run(cli.demo, launcher) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
