//! Hosts on one machine, each in a network namespace of its own: a node's processes bind the
//! addresses and ports its bundle rendered (an apiserver on `0.0.0.0:6443`, a controller-manager
//! on `127.0.0.1:10257`) without meeting another node's or anything of the machine's. The nodes
//! share a LAN: a bridge in a namespace of its own, a veth pair per node. Nothing is added to
//! the machine's own network namespace; everything is deleted when the [`Lan`] is dropped.
//! Needs root (CI runs as root) and iproute2.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Namespaces made by this process, for unique names.
static MADE: AtomicUsize = AtomicUsize::new(0);

/// Runs `ip` with `args`; panics with its output when it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("iproute2's `ip` (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A LAN of nodes, one namespace each.
pub struct Lan {
    switch: String,
    /// Each node's namespace name.
    pub nodes: Vec<String>,
}

impl Lan {
    /// One namespace per address of `addresses` (IPv4, on a `/prefix` network), joined by a
    /// bridge; each has `lo` up and its address on `eth0`. `hosts` lines go into every node's
    /// `/etc/hosts` (as `ip netns exec` sees it).
    pub fn new(addresses: &[&str], prefix: u8, hosts: &str) -> Self {
        let tag = format!(
            "x{}{}",
            std::process::id() % 100_000,
            MADE.fetch_add(1, Ordering::Relaxed)
        );
        let switch = format!("{tag}s");
        ip(&["netns", "add", &switch]);
        let mut lan = Self {
            switch: switch.clone(),
            nodes: Vec::new(),
        };
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &switch, "link", "set", "br0", "up"]);
        for (i, address) in addresses.iter().enumerate() {
            let node = format!("{tag}n{i}");
            ip(&["netns", "add", &node]);
            lan.nodes.push(node.clone());
            let (inside, outside) = (format!("{tag}a{i}"), format!("{tag}b{i}"));
            ip(&[
                "link", "add", &inside, "netns", &node, "type", "veth", "peer", "name", &outside,
                "netns", &switch,
            ]);
            ip(&["-n", &node, "link", "set", "lo", "up"]);
            ip(&["-n", &node, "link", "set", &inside, "name", "eth0"]);
            ip(&[
                "-n",
                &node,
                "addr",
                "add",
                &format!("{address}/{prefix}"),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &node, "link", "set", "eth0", "up"]);
            ip(&["-n", &switch, "link", "set", &outside, "master", "br0"]);
            ip(&["-n", &switch, "link", "set", &outside, "up"]);
            let etc = lan.etc(i);
            std::fs::create_dir_all(&etc).unwrap();
            std::fs::write(etc.join("hosts"), format!("127.0.0.1 localhost\n{hosts}")).unwrap();
        }
        lan
    }

    /// Where `ip netns exec` finds node `i`'s own `/etc` files.
    fn etc(&self, i: usize) -> PathBuf {
        PathBuf::from("/etc/netns").join(&self.nodes[i])
    }

    /// Node `i`'s `/etc/hosts`, as `ip netns exec` mounts it.
    pub fn hosts_file(&self, i: usize) -> PathBuf {
        self.etc(i).join("hosts")
    }

    /// `program` to run inside node `i`'s namespace.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.nodes[i]]).arg(program);
        command
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for (i, node) in self.nodes.iter().enumerate() {
            let _ = Command::new("ip").args(["netns", "del", node]).status();
            let _ = std::fs::remove_dir_all(self.etc(i));
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.switch])
            .status();
    }
}
