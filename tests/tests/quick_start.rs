//! The README's quick start on the simulated stack works as written: its code block is read
//! from README.md with a CommonMark parser and run, shell by shell as the block's comments
//! say — the dev stack in the first, the founding with `--wait` in the second, and, once the
//! second printed "founded", the agent of VM 101 in the third — with this workspace's built
//! binaries standing in for `target/release/` (`cargo build --release` builds the same
//! programs) and one substitution: the dev stack listens on a free port instead of 8080
//! (`EXK8S_LISTEN`, and the same port in the commands' URLs), so the test never collides with
//! anything on the machine. The third shell must succeed and show what a real node would have
//! done; the second must return once the node is ready.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use exk8s_tests::procs::{binary, free_port, wait_until};
use exk8s_tests::readme::{self, Group, code_blocks, shells};

/// `script` in bash in `dir`, the dev stack on `port`, its output to `log`.
fn bash(dir: &Path, port: u16, script: &str, log: &Path) -> Command {
    let mut command = readme::bash(dir, script, log);
    command.env("EXK8S_LISTEN", format!("127.0.0.1:{port}"));
    command
}

#[test]
fn the_readmes_simulated_quick_start_works_as_written() {
    let block = code_blocks(&readme::text())
        .into_iter()
        .find(|b| b.contains("exk8s-api dev") && !b.contains("dev-cluster.sh"))
        .expect("the simulated stack's quick start");
    let port = free_port();
    let block = block.replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
    let shells = shells(&block);
    assert_eq!(shells.len(), 3, "three shells: {shells:?}");

    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // `target/release/` here holds the workspace's built programs.
    let release = dir.join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    for program in ["exk8s-api", "exk8s", "exk8s-agent"] {
        std::os::unix::fs::symlink(binary(program), release.join(program)).unwrap();
    }

    let _stack = Group::spawn(&mut bash(dir, port, &shells[0], &dir.join("shell-1.log")));
    let operator_token = dir.join("exk8s-dev/operator.token");
    wait_until("the dev stack", Duration::from_secs(60), || {
        operator_token.is_file() && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });

    // What the README says to wait for before the third shell: the quoted words after
    // `once the second printed` (a bare "founded" would match "it is being founded", printed
    // before the VM exists).
    let quoted = block
        .split_once("once the second printed \"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(words, _)| words.to_owned())
        .expect("the README names what the second shell prints before the third starts");
    let second_log = dir.join("shell-2.log");
    let mut second = Group::spawn(&mut bash(dir, port, &shells[1], &second_log));
    wait_until(
        &format!("the second shell's {quoted:?}"),
        Duration::from_secs(60),
        || {
            assert!(
                second.child.try_wait().unwrap().is_none(),
                "the second shell ended early: {}",
                std::fs::read_to_string(&second_log).unwrap()
            );
            std::fs::read_to_string(&second_log)
                .unwrap()
                .contains(&quoted)
        },
    );

    let third_log = dir.join("shell-3.log");
    let third = bash(dir, port, &shells[2], &third_log).status().unwrap();
    let third_out = std::fs::read_to_string(&third_log).unwrap();
    assert!(third.success(), "the third shell failed: {third_out}");
    assert!(
        third_out.contains("phase complete: succeeded") && third_out.contains("apt-get install"),
        "{third_out}"
    );

    wait_until(
        "the second shell's return",
        Duration::from_secs(120),
        || second.child.try_wait().unwrap().is_some(),
    );
    let second_out = std::fs::read_to_string(&second_log).unwrap();
    assert!(second.child.wait().unwrap().success(), "{second_out}");
    assert!(second_out.contains("logged in"), "{second_out}");
}
