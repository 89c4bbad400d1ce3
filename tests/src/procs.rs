//! Child processes for tests: the workspace's binaries, a guard that kills and reaps, free
//! loopback ports, and polling with a deadline.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

/// Kills and reaps a child process when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A binary of this workspace, built by `cargo test --workspace` (or `cargo build`). Panics —
/// never skips — when it is missing.
pub fn binary(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    let path = target.join("debug").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// Polls `check` every 100 ms until it holds; panics after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
