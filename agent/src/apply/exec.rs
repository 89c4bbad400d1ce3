//! Running a host program: its error keeps the exit status and the end of its stderr.

use std::path::Path;
use std::process::Command;

/// Runs a command; on failure the error keeps its exit status and stderr.
pub(super) fn run(program: &Path, args: &[&str], envs: &[(&str, &Path)]) -> Result<(), String> {
    let mut command = Command::new(program);
    command.args(args);
    for (key, value) in envs {
        command.env(key, value);
    }
    let output = command
        .output()
        .map_err(|e| format!("starting {}: {e}", program.display()))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: String = stderr
        .chars()
        .rev()
        .take(2000)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(format!(
        "{} exited with {}: {}",
        program.display(),
        output.status,
        tail.trim()
    ))
}
