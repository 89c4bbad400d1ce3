//! `exk8s-api`: `main` only runs the CLI and returns its exit code.

/// mimalloc instead of glibc malloc: under load glibc's consolidation and free lists were a
/// fifth of the API's CPU (BENCHMARKS.md, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    exk8s_api::cli::main()
}
