//! A network namespace of a test's own (only `lo`, up), entered by the test's thread: every
//! process the thread starts afterwards listens and connects in it, so servers that bind every
//! address (Cluster API's webhook server binds `:9443`) stay off the host's network. Removed
//! when dropped.

use std::path::PathBuf;
use std::process::Command;

/// A named network namespace under `/run/netns`.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// `exk8s-test-<label>-<pid>`, made afresh, `lo` up.
    pub fn new(label: &str) -> Self {
        let name = format!("exk8s-test-{label}-{}", std::process::id());
        if PathBuf::from("/run/netns").join(&name).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
        let ip = |args: &[&str]| {
            let out = Command::new("ip")
                .args(args)
                .output()
                .expect("ip (iproute2)");
            assert!(
                out.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        ip(&["netns", "add", &name]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        Self { name }
    }

    /// Moves the calling thread into the namespace (the processes it starts from now on are
    /// born there; other threads stay where they are).
    pub fn enter(&self) {
        let file = std::fs::File::open(PathBuf::from("/run/netns").join(&self.name)).unwrap();
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&file),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .unwrap();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
