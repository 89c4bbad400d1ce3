//! A command-line reference page, generated from the program's own clap definition and never
//! copied by hand: [`markdown`] renders every command and subcommand (depth first, in
//! declaration order) with its description, usage, arguments and options — each option's
//! flags, value, help, default, choices and environment variable. [`check`] compares the page
//! a crate keeps under `docs/reference/` with what its definition renders now: a test in each
//! binary's crate calls it, so a flag changed without its page fails the suite
//! (`EXK8S_BLESS=1` writes the page instead); [`keep`] does the same for any generated page.

use std::fmt::Write as _;
use std::path::Path;

use clap::{Arg, ArgAction, Command};

/// The reference page of `command` (the program's top-level command).
pub fn markdown(command: Command) -> String {
    let mut command = command;
    command.build();
    let name = command.get_name().to_owned();
    let mut page = format!(
        "# `{name}` reference\n\n\
         Generated from `{name}`'s own command-line definition (`cargo test` checks it is \
         current; `EXK8S_BLESS=1 cargo test` rewrites it). `{name} help <command>` shows the \
         same.\n"
    );
    render(&command, &name, true, &mut page);
    page
}

/// Fails, saying how to mend it, when `page` (relative to the workspace's root, which is
/// `manifest_dir`'s parent) is not what `command` renders; writes it when `EXK8S_BLESS=1`.
pub fn check(command: Command, manifest_dir: &str, page: &str) -> Result<(), String> {
    keep(manifest_dir, page, &markdown(command))
}

/// Fails, saying how to mend it, when the kept `page` (relative to the workspace's root, which
/// is `manifest_dir`'s parent) is not `rendered`; writes it when `EXK8S_BLESS=1`. For any
/// generated page: the CLI's, the HTTP API's, the metrics'.
pub fn keep(manifest_dir: &str, page: &str, rendered: &str) -> Result<(), String> {
    let path = Path::new(manifest_dir).join("..").join(page);
    if std::env::var_os("EXK8S_BLESS").is_some_and(|v| v == "1") {
        return std::fs::write(&path, rendered).map_err(|e| format!("{page}: {e}"));
    }
    let kept = std::fs::read_to_string(&path).map_err(|e| {
        format!("{page}: {e} (`EXK8S_BLESS=1 cargo test` for this crate writes it)")
    })?;
    if kept == rendered {
        return Ok(());
    }
    let first = kept
        .lines()
        .zip(rendered.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| kept.lines().count().min(rendered.lines().count()));
    Err(format!(
        "{page} is not what the code generates now (first difference at line {}); \
         run `EXK8S_BLESS=1 cargo test` for this crate and commit the page",
        first + 1
    ))
}

/// `command` (reached as `path`) and every visible subcommand below it; the options every
/// command takes are shown at the top only.
fn render(command: &Command, path: &str, top: bool, page: &mut String) {
    let _ = write!(page, "\n## `{path}`\n\n");
    if let Some(about) = command.get_long_about().or_else(|| command.get_about()) {
        let _ = write!(page, "{about}\n\n");
    }
    let usage = command.clone().render_usage().to_string();
    let usage = usage.trim_start_matches("Usage:").trim();
    let _ = write!(page, "```text\n{usage}\n```\n");
    let (positionals, options): (Vec<&Arg>, Vec<&Arg>) = command
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !is_builtin(a) && (top || !a.is_global_set()))
        .partition(|a| a.is_positional());
    for (title, args) in [("Arguments", positionals), ("Options", options)] {
        if args.is_empty() {
            continue;
        }
        let _ = write!(page, "\n{title}:\n\n");
        for arg in args {
            let _ = writeln!(page, "- {}", describe(arg));
        }
    }
    let subcommands: Vec<&Command> = command
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .collect();
    if !subcommands.is_empty() {
        page.push_str("\nCommands:\n\n");
        for sub in &subcommands {
            let about = sub.get_about().map(ToString::to_string).unwrap_or_default();
            let _ = writeln!(page, "- `{}` — {about}", sub.get_name());
        }
    }
    for sub in subcommands {
        render(sub, &format!("{path} {}", sub.get_name()), false, page);
    }
}

/// clap's own `--help` and `--version`.
fn is_builtin(arg: &Arg) -> bool {
    matches!(
        arg.get_action(),
        ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
    )
}

/// One argument's line: how it is written, then its help and what clap knows of its values.
fn describe(arg: &Arg) -> String {
    // clap shows the id where no value name was given.
    let value = if arg.get_action().takes_values() {
        arg.get_value_names().map_or_else(
            || format!("<{}>", arg.get_id()),
            |names| {
                names
                    .iter()
                    .map(|n| format!("<{n}>"))
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        )
    } else {
        String::new()
    };
    let mut spelled = if arg.is_positional() {
        value
    } else {
        let mut flags: Vec<String> = Vec::new();
        if let Some(short) = arg.get_short() {
            flags.push(format!("-{short}"));
        }
        if let Some(long) = arg.get_long() {
            flags.push(format!("--{long}"));
        }
        let mut spelled = flags.join(", ");
        if !value.is_empty() {
            spelled = format!("{spelled} {value}");
        }
        spelled
    };
    if arg.is_required_set() && !arg.is_positional() {
        spelled.push_str(" (required)");
    }
    let mut line = format!("`{spelled}`");
    if let Some(help) = arg.get_long_help().or_else(|| arg.get_help()) {
        let help = help.to_string().replace('\n', " ");
        let _ = write!(line, " — {help}");
    }
    let mut notes = Vec::new();
    let choices: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !choices.is_empty() && !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse)
    {
        notes.push(format!("one of {}", choices.join(", ")));
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| format!("`{}`", v.to_string_lossy()))
        .collect();
    if !defaults.is_empty() && !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse)
    {
        notes.push(format!("default {}", defaults.join(", ")));
    }
    if let Some(env) = arg.get_env() {
        notes.push(format!("env `{}`", env.to_string_lossy()));
    }
    if arg.is_global_set() {
        notes.push("every command takes it".to_owned());
    }
    if !notes.is_empty() {
        let _ = write!(line, " ({})", notes.join("; "));
    }
    line
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test: failures should stop it loudly")]

    use super::*;

    fn sample() -> Command {
        Command::new("tool")
            .about("Does things")
            .arg(
                Arg::new("api")
                    .long("api")
                    .env("TOOL_API")
                    .global(true)
                    .help("Where the API is"),
            )
            .arg(Arg::new("secret").long("secret").hide(true))
            .subcommand(
                Command::new("make")
                    .about("Makes one")
                    .arg(Arg::new("name").required(true).help("Its name"))
                    .arg(
                        Arg::new("count")
                            .short('c')
                            .long("count")
                            .default_value("1")
                            .help("How many"),
                    )
                    .arg(
                        Arg::new("wait")
                            .long("wait")
                            .action(ArgAction::SetTrue)
                            .help("Wait for it"),
                    ),
            )
            .subcommand(Command::new("hidden").hide(true))
    }

    /// Every visible command, argument and option is on the page with what clap knows of it;
    /// hidden ones, `help` and `--version` are not.
    #[test]
    fn the_page_shows_every_visible_command_and_flag() {
        let page = markdown(sample());
        for expected in [
            "# `tool` reference",
            "## `tool`\n\nDoes things",
            "- `make` — Makes one",
            "## `tool make`",
            "- `<name>` — Its name",
            "- `-c, --count <count>` — How many (default `1`)",
            "- `--wait` — Wait for it",
            "- `--api <api>` — Where the API is (env `TOOL_API`; every command takes it)",
            "- `<name>` — Its name",
        ] {
            assert!(page.contains(expected), "{expected:?} in\n{page}");
        }
        for absent in ["secret", "hidden", "## `tool help`", "--help"] {
            assert!(!page.contains(absent), "{absent:?} in\n{page}");
        }
        assert_eq!(
            page.matches("--api").count(),
            1,
            "shown at the top only:\n{page}"
        );
    }

    /// A kept page that differs is refused with where and how to mend it; the same page passes.
    #[test]
    fn a_stale_page_is_refused() {
        let dir = std::env::temp_dir().join(format!("exk8s-cli-reference-{}", std::process::id()));
        let docs = dir.join("docs");
        std::fs::create_dir_all(&docs).unwrap();
        let manifest = dir.join("crate");
        std::fs::create_dir_all(&manifest).unwrap();
        let page = docs.join("tool.md");
        std::fs::write(&page, markdown(sample()).replace("How many", "How few")).unwrap();
        let manifest = manifest.to_str().unwrap();
        let err = check(sample(), manifest, "docs/tool.md").unwrap_err();
        assert!(
            err.contains("EXK8S_BLESS=1") && err.contains("line"),
            "{err}"
        );
        std::fs::write(&page, markdown(sample())).unwrap();
        assert_eq!(check(sample(), manifest, "docs/tool.md"), Ok(()));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
