//! A rendered systemd unit as the harness reads it: its `ExecStart` words, the environment its
//! `EnvironmentFile=` lines set, and the one rewrite of a rendered argument (host paths rebased
//! into the node's root). Below every harness that starts what a unit names.

use std::path::Path;

/// The one rewrite of a rendered argument: an absolute host path (`--flag=/etc/...`, or a bare
/// `/path` argument) is rebased into `root`, since the node's files live there and not in `/`.
/// Nothing else changes: addresses and ports are the rendered ones (each node has its own
/// network namespace), and every other flag is passed as rendered.
pub fn rewrite(root: &Path, arg: &str) -> String {
    let rebase = |value: &str| match value.strip_prefix('/') {
        Some(relative) => root.join(relative).display().to_string(),
        None => value.to_owned(),
    };
    match arg.split_once('=') {
        Some((flag, value)) if flag.starts_with("--") => format!("{flag}={}", rebase(value)),
        _ => rebase(arg),
    }
}

/// `unit`'s `ExecStart` split into its program and arguments, as rendered.
pub fn exec_start(unit: &str) -> Vec<String> {
    let joined = unit.replace("\\\n", " ");
    let exec = joined
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("the unit has ExecStart");
    exec.split_whitespace().map(str::to_owned).collect()
}

/// What `unit`'s `EnvironmentFile=` lines set, read from `root` as systemd reads them (`KEY=VALUE`
/// lines; `#` comments and blank lines skipped).
pub fn unit_environment(root: &Path, unit: &str) -> Vec<(String, String)> {
    unit.lines()
        .filter_map(|l| l.strip_prefix("EnvironmentFile="))
        .flat_map(|file| {
            let path = rewrite(root, file.trim_start_matches('-'));
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            text.lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                .map(|l| {
                    let (key, value) = l.split_once('=').expect("KEY=VALUE");
                    (key.to_owned(), value.to_owned())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}
