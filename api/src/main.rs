//! The `exk8s-api` command. The service is not built yet: this entry point only reports its
//! version so the workspace, packaging and CI have a real binary to carry.

use std::process::ExitCode;

fn main() -> ExitCode {
    let arg = std::env::args().nth(1);
    match arg.as_deref() {
        Some("--version") | Some("-V") => {
            #[allow(clippy::print_stdout, reason = "the version is the command's output")]
            {
                println!("exk8s-api {}", env!("CARGO_PKG_VERSION"));
            }
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!(
                "exk8s-api {}: the API service is not implemented yet (see README.md)",
                env!("CARGO_PKG_VERSION")
            );
            ExitCode::from(2)
        }
    }
}
