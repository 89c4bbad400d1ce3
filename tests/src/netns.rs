//! Hosts on one machine, each in a network namespace of its own: a node's processes bind the
//! addresses and ports its bundle rendered (an apiserver on `0.0.0.0:6443`, a controller-manager
//! on `127.0.0.1:10257`) without meeting another node's or anything of the machine's. The nodes
//! share a LAN: a bridge in a namespace of its own, a veth pair per node. Nothing is added to
//! the machine's own network namespace; everything is deleted when the [`Lan`] is dropped. A
//! node reaches a service on the machine's loopback (the API) through
//! [`Lan::forward_loopback`].
//! Needs root (CI runs as root) and iproute2.

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
    tag: String,
    switch: String,
    prefix: u8,
    /// Each node's namespace name (nodes may join while others use the LAN).
    nodes: Mutex<Vec<String>>,
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
        let lan = Self {
            tag,
            switch: switch.clone(),
            prefix,
            nodes: Mutex::new(Vec::new()),
        };
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &switch, "link", "set", "br0", "up"]);
        for address in addresses {
            lan.add(address, hosts);
        }
        lan
    }

    /// One more node on the LAN, at `address`, with `hosts` in its `/etc/hosts`; its index.
    pub fn add(&self, address: &str, hosts: &str) -> usize {
        let (tag, switch) = (&self.tag, &self.switch);
        let (i, node) = {
            let mut nodes = self.nodes.lock().unwrap();
            let i = nodes.len();
            let node = format!("{tag}n{i}");
            ip(&["netns", "add", &node]);
            nodes.push(node.clone());
            (i, node)
        };
        let (inside, outside) = (format!("{tag}a{i}"), format!("{tag}b{i}"));
        ip(&[
            "link", "add", &inside, "netns", &node, "type", "veth", "peer", "name", &outside,
            "netns", switch,
        ]);
        ip(&["-n", &node, "link", "set", "lo", "up"]);
        ip(&["-n", &node, "link", "set", &inside, "name", "eth0"]);
        let cidr = format!("{address}/{}", self.prefix);
        ip(&["-n", &node, "addr", "add", &cidr, "dev", "eth0"]);
        ip(&["-n", &node, "link", "set", "eth0", "up"]);
        ip(&["-n", switch, "link", "set", &outside, "master", "br0"]);
        ip(&["-n", switch, "link", "set", &outside, "up"]);
        std::fs::create_dir_all(self.etc(i)).unwrap();
        self.set_hosts(i, hosts);
        i
    }

    /// Rewrites node `i`'s `/etc/hosts` in place (the same file, so processes already running
    /// there see it too): `localhost`, then `hosts`.
    pub fn set_hosts(&self, i: usize, hosts: &str) {
        // Overwritten by one write and then cut to length, never truncated first: a resolver
        // reading it meanwhile must not find it empty (and ask a DNS server there is none of).
        let content = format!("127.0.0.1 localhost\n{hosts}");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.hosts_file(i))
            .unwrap();
        std::io::Write::write_all(&mut file, content.as_bytes()).unwrap();
        file.set_len(content.len() as u64).unwrap();
    }

    /// A TCP listener on `127.0.0.1:port` inside node `i`'s namespace that forwards each
    /// connection to the same port on the machine's loopback: a node's processes reach a
    /// service of the machine (the API) at the address it has there. Stops when dropped.
    pub fn forward_loopback(&self, i: usize, port: u16) -> Forward {
        let netns = PathBuf::from("/run/netns").join(self.name(i));
        // A thread of its own enters the namespace to bind, and ends: the socket stays there,
        // while every other thread (the forwarding ones too) stays in the machine's.
        let listener = std::thread::spawn(move || {
            let ns = std::fs::File::open(&netns).unwrap();
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            TcpListener::bind(("127.0.0.1", port)).unwrap()
        })
        .join()
        .unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let accepting = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((inside, _)) => {
                        std::thread::spawn(move || relay(inside, port));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    Err(e) => panic!("accepting in the namespace: {e}"),
                }
            }
        });
        Forward {
            stop,
            accepting: Some(accepting),
        }
    }

    /// How many nodes the LAN has.
    pub fn count(&self) -> usize {
        self.nodes.lock().unwrap().len()
    }

    /// Node `i`'s namespace name.
    pub fn name(&self, i: usize) -> String {
        self.nodes.lock().unwrap()[i].clone()
    }

    /// Where `ip netns exec` finds node `i`'s own `/etc` files.
    fn etc(&self, i: usize) -> PathBuf {
        PathBuf::from("/etc/netns").join(self.name(i))
    }

    /// Node `i`'s `/etc/hosts`, as `ip netns exec` mounts it.
    pub fn hosts_file(&self, i: usize) -> PathBuf {
        self.etc(i).join("hosts")
    }

    /// `program` to run inside node `i`'s namespace.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name(i)]).arg(program);
        command
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        let nodes = std::mem::take(&mut *self.nodes.lock().unwrap_or_else(|p| p.into_inner()));
        for node in nodes {
            let _ = Command::new("ip").args(["netns", "del", &node]).status();
            let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(node));
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.switch])
            .status();
    }
}

/// A forwarding listener of [`Lan::forward_loopback`]; stops accepting when dropped, and its
/// port is free again once the drop returns (another forward of it may follow at once).
pub struct Forward {
    stop: Arc<AtomicBool>,
    accepting: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
    }
}

/// Copies `inside` to a new connection to the machine's `127.0.0.1:port` and back until either
/// side closes.
fn relay(inside: TcpStream, port: u16) {
    let Ok(outside) = TcpStream::connect(("127.0.0.1", port)) else {
        let _ = inside.shutdown(Shutdown::Both);
        return;
    };
    let (Ok(mut inside_r), Ok(mut outside_r)) = (inside.try_clone(), outside.try_clone()) else {
        return;
    };
    let (mut inside_w, mut outside_w) = (inside, outside);
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut inside_r, &mut outside_w);
        let _ = outside_w.flush();
        let _ = outside_w.shutdown(Shutdown::Write);
    });
    let _ = std::io::copy(&mut outside_r, &mut inside_w);
    let _ = inside_w.shutdown(Shutdown::Write);
    let _ = up.join();
}
