//! `exk8s-agent`: `main` only runs the CLI and returns its exit code (see `--help`).

fn main() -> std::process::ExitCode {
    exk8s_agent::cli::main()
}
