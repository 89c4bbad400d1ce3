//! `exk8s-api`: `main` only runs the CLI and returns its exit code.

fn main() -> std::process::ExitCode {
    exk8s_api::cli::main()
}
