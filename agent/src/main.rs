//! `exk8s-agent`, the static binary baked into VM images that fetches, verifies and applies its
//! machine's signed bootstrap bundle. Only `--version` exists so far; the boot path is the
//! agent issue's work.

use std::process::ExitCode;

fn main() -> ExitCode {
    let arg = std::env::args().nth(1);
    match arg.as_deref() {
        Some("--version") | Some("-V") => {
            #[allow(clippy::print_stdout, reason = "the version is the command's output")]
            {
                println!("exk8s-agent {}", env!("CARGO_PKG_VERSION"));
            }
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!(
                "exk8s-agent {}: not implemented yet (see README.md)",
                env!("CARGO_PKG_VERSION")
            );
            ExitCode::from(2)
        }
    }
}
