//! `module-cycles [--files-only | --layers] CRATE_SRC...`: the dependency circles between a
//! crate's files, and between its top-level modules; exits 1 when there is one (with
//! `--files-only`, when there is one between files: the module circles are printed, not
//! counted). `--layers` also prints the top-level modules layer by layer, lowest first (each
//! uses only modules of lower layers): the drawing in `docs/architecture.md` is read from it.
//! `scripts/test.sh` runs it on every crate.
//!
//! The code is read as the compiler reads it (syn and proc-macro2's lexer), so strings, raw
//! strings, character literals, lifetimes, nested block comments and doc comments never hide
//! or invent a path. A file depends on another when its code outside `#[cfg(test)]` items names
//! a path into it: in a `use` tree, in any expression, type, pattern or visibility, or inside a
//! macro's tokens (`format!`, `tracing::info!`, ...), starting at `crate::`, `super::`,
//! `self::`, or a child module's name. A path resolves to the longest module prefix that
//! exists (`crate::db::nodes::list` is `db::nodes`, `crate::db::Db` is `db`). An edge to one's
//! own ancestor (`super::Error`) is the module tree itself and does not count.

mod graph;
mod paths;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let files_only = args.first().is_some_and(|a| a == "--files-only");
    let print_layers = args.first().is_some_and(|a| a == "--layers");
    if files_only || print_layers {
        args.remove(0);
    }
    if args.is_empty() || args.iter().any(|a| a.starts_with('-')) {
        eprintln!(
            "usage: module-cycles [--files-only | --layers] CRATE_SRC_DIR... (e.g. api/src agent/src)"
        );
        return ExitCode::from(2);
    }
    let mut circles = 0;
    for src in &args {
        match check(Path::new(src)) {
            Ok(report) => {
                use std::io::Write as _;
                let mut out = std::io::stdout().lock();
                if write!(out, "{report}").is_err() {
                    return ExitCode::from(2);
                }
                if print_layers {
                    let layers = report.layers.as_deref().unwrap_or_default();
                    for (level, modules) in layers.iter().enumerate().rev() {
                        if writeln!(out, "  layer {level}: {}", modules.join(" ")).is_err() {
                            return ExitCode::from(2);
                        }
                    }
                }
                circles += if files_only {
                    report.file_circles.len()
                } else {
                    report.circles()
                };
            }
            Err(e) => {
                eprintln!("module-cycles: {src}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if circles == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// What one crate's check found.
#[derive(Debug)]
pub(crate) struct Report {
    src: PathBuf,
    files: usize,
    /// Circles between files, each a sorted list of module paths.
    file_circles: Vec<Vec<String>>,
    /// Circles between top-level modules.
    module_circles: Vec<Vec<String>>,
    /// For each module circle, the file dependencies that cross between its members: what a
    /// reader has to move to break it.
    crossings: Vec<Vec<(String, String)>>,
    /// The top-level modules layer by layer, lowest first; `None` when they form a circle.
    layers: Option<Vec<Vec<String>>>,
}

impl Report {
    fn circles(&self) -> usize {
        self.file_circles.len() + self.module_circles.len()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{}: {} files, {} circle(s) between files, {} between modules",
            self.src.display(),
            self.files,
            self.file_circles.len(),
            self.module_circles.len()
        )?;
        for circle in &self.file_circles {
            writeln!(f, "  files: {}", circle.join(" <-> "))?;
        }
        for (circle, crossings) in self.module_circles.iter().zip(&self.crossings) {
            writeln!(f, "  modules: {}", circle.join(" <-> "))?;
            for (from, to) in crossings {
                writeln!(f, "    {from} -> {to}")?;
            }
        }
        Ok(())
    }
}

/// Checks the crate whose sources are under `src`.
pub(crate) fn check(src: &Path) -> Result<Report, String> {
    let files = paths::files(src)?;
    let mut edges = Vec::new();
    for (module, file) in &files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?;
        let named = paths::named(module, &text, &files)
            .map_err(|e| format!("parsing {}: {e}", file.display()))?;
        edges.extend(named.into_iter().map(|target| (module.clone(), target)));
    }
    let modules: Vec<paths::Module> = files.keys().cloned().collect();
    let module_circles = graph::circles(
        &modules.iter().map(graph::top).collect::<Vec<_>>(),
        &edges
            .iter()
            .map(|(from, to)| (graph::top(from), graph::top(to)))
            .collect::<Vec<_>>(),
    );
    let crossings = module_circles
        .iter()
        .map(|circle| graph::crossings(circle, &edges))
        .collect();
    Ok(Report {
        src: src.to_owned(),
        files: files.len(),
        file_circles: graph::circles(&modules, &edges),
        module_circles,
        crossings,
        layers: graph::layers(&modules, &edges),
    })
}

#[cfg(test)]
mod tests;
