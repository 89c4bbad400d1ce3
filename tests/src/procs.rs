//! Child processes for tests: the workspace's binaries, a guard that kills and reaps, free
//! loopback ports, and polling with a deadline.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Kills and reaps a child process when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// Stops the process the way systemd and the kubelet do: SIGTERM, then SIGKILL once
    /// `grace` has passed without it exiting.
    pub fn terminate(mut self, grace: Duration) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < grace {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Dropping kills and reaps it.
    }
}

/// A loopback port nothing listens on, for a child process to bind.
pub fn free_port() -> u16 {
    // A port from `bind(:0)` lies in the kernel's ephemeral range, where any outgoing
    // connection may take it between this call and the child's own bind — that raced etcd
    // ("address already in use") in CI. Ports below the range are never handed out by the
    // kernel, so only deliberate binds compete: a per-process counter keeps this process's
    // ports distinct and the pid spreads concurrent test binaries apart.
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id() % SPAN * 7;
    for _ in 0..SPAN {
        let port = FIRST + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
        let port = u16::try_from(port).expect("FIRST + SPAN fits in a port");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN)
}

/// Test ports: below Linux's default ephemeral range (32768–60999).
const FIRST: u32 = 20_000;
const SPAN: u32 = 12_000;

/// A binary of this workspace, built by `cargo test --workspace` (or `cargo build`): in
/// `EXK8S_BIN_DIR` when it is set (scripts/test.sh gives the booted clusters a copy of the
/// binaries, which the builds it runs beside them cannot replace), else in the target
/// directory's `debug/`. Panics — never skips — when it is missing.
pub fn binary(name: &str) -> PathBuf {
    let dir = std::env::var_os("EXK8S_BIN_DIR").map_or_else(
        || {
            std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(
                    || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
                    PathBuf::from,
                )
                .join("debug")
        },
        PathBuf::from,
    );
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// `command`'s output, as [`Command::output`] gives it, with the child woken (`SIGCONT`) every
/// second until it ends: `nsenter` stops itself when the program it runs in a machine is
/// stopped, and a machine shutting down stops every process it holds (systemd-shutdown's
/// SIGSTOP before its SIGTERM) — its own child killed there, the stopped `nsenter` would
/// otherwise wait forever.
pub fn output_woken(command: &mut std::process::Command) -> std::process::Output {
    use std::io::Read as _;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let pid = rustix::process::Pid::from_child(&child);
    let (ended, waited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = ended.send(child.wait());
    });
    let status = loop {
        match waited.recv_timeout(Duration::from_secs(1)) {
            Ok(status) => break status.unwrap(),
            Err(_) => {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::CONT);
            }
        }
    };
    std::process::Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
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

/// Sets its flag when dropped — when the scope that holds it ends, by returning or by a panic
/// unwinding through it: threads a test runs until a flag says stop (samplers, syncing loops)
/// stop then too, so a failed check inside `std::thread::scope` fails the test instead of
/// leaving the scope waiting on them forever.
pub struct SetOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The time of day (UTC, as the logs print it) to the millisecond: for samples a test keeps
/// to set beside the logs when a check fails.
pub fn time_of_day() -> String {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let day = since.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day / 3600,
        day / 60 % 60,
        day % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_stops_itself_is_woken_and_its_output_kept() {
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let out = output_woken(
                std::process::Command::new("sh").args(["-c", "kill -STOP $$; echo woken"]),
            );
            let _ = done.send(out);
        });
        // Without the wake-up it never ends (as `std::process::Command::output` would not).
        let out = result
            .recv_timeout(Duration::from_secs(30))
            .expect("the stopped child was never woken");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout, b"woken\n");
    }
}
