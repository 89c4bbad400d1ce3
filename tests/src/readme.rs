//! The README's quick starts as a test runs them: its fenced code blocks read with a CommonMark
//! parser ([`code_blocks`]), a block cut into the shells its comments name ([`shells`]), each
//! run by bash exiting at its first failure ([`bash`]) in its own process group, stopped with
//! everything it started when dropped ([`Group`]).

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

/// README.md's text.
pub fn text() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap()
}

/// The fenced code blocks of `markdown`, in order.
pub fn code_blocks(markdown: &str) -> Vec<String> {
    let (mut blocks, mut current) = (Vec::new(), None::<String>);
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(_))) => current = Some(String::new()),
            Event::Text(text) => {
                if let Some(block) = current.as_mut() {
                    block.push_str(&text);
                }
            }
            Event::End(TagEnd::CodeBlock) => blocks.extend(current.take()),
            _ => {}
        }
    }
    blocks
}

/// The block's shells: split where a comment line starts `# in a`.
pub fn shells(block: &str) -> Vec<String> {
    let mut shells = vec![String::new()];
    for line in block.lines() {
        if line.starts_with("# in a") {
            shells.push(String::new());
        }
        let shell = shells.last_mut().unwrap();
        shell.push_str(line);
        shell.push('\n');
    }
    shells
}

/// `script` in bash (exiting at the first failure) in `dir` with `HOME` there and no `exk8s`
/// login from the environment, in a process group of its own, its output to `log`.
pub fn bash(dir: &Path, script: &str, log: &Path) -> Command {
    // One open file for both streams: they share its offset, as a terminal would show them.
    let output = std::fs::File::create(log).unwrap();
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("HOME", dir)
        .env_remove("EXK8S_API")
        .env_remove("EXK8S_TOKEN")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(output.try_clone().unwrap())
        .stderr(output);
    command
}

/// A shell and everything it started (its own process group): when dropped, sent `signal`
/// (`INT`: what Ctrl-C sends; `TERM`) and waited for, at most `grace`.
pub struct Group {
    pub child: std::process::Child,
    pub signal: &'static str,
    pub grace: Duration,
}

impl Group {
    /// `command` spawned, stopped with SIGTERM within 15 s when dropped.
    pub fn spawn(command: &mut Command) -> Self {
        Self {
            child: command.spawn().unwrap(),
            signal: "TERM",
            grace: Duration::from_secs(15),
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let signal = format!("-{}", self.signal);
        let _ = Command::new("kill").args([&signal, "--", &group]).status();
        let _ = self.child.wait();
        // What the shell started may stop after it (the dev stack drains for a few seconds).
        let deadline = std::time::Instant::now() + self.grace;
        while std::time::Instant::now() < deadline {
            let alive = Command::new("kill")
                .args(["-0", "--", &group])
                .stderr(Stdio::null())
                .status();
            if !alive.is_ok_and(|s| s.success()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
