//! The machines' LAN: a bridge in a network namespace of its own and, per machine, a namespace
//! with `lo` and `eth0` (a veth on the bridge, the machine's address) and a default route
//! through the subnet's gateway (its first address, on the bridge), as a cloud's subnet has:
//! packets for anywhere else end at the bridge's namespace, which forwards nothing (a network
//! with no way out). Nothing is added to the host's own namespace. A host service reaches the machines through listeners opened inside a
//! machine's namespace ([`listen_in`]): the socket lives there, the tasks serving it here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use super::MachineError;

/// Runs `command` (the program `tool` names): an error names `what` was asked and what the
/// program said.
pub(super) fn run(
    tool: &'static str,
    command: &mut Command,
    what: impl FnOnce() -> String,
) -> Result<(), MachineError> {
    let out = command.output().map_err(|e| MachineError::Tool {
        tool,
        detail: e.to_string(),
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(MachineError::Command {
            command: what(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Runs `ip` with `args`.
pub(super) fn ip(args: &[&str]) -> Result<(), MachineError> {
    run("ip (iproute2)", Command::new("ip").args(args), || {
        format!("ip {}", args.join(" "))
    })
}

/// The LAN of one dev stack: namespaces named `exk8s-<tag>-…`.
#[derive(Debug)]
pub(super) struct Lan {
    tag: String,
    prefix: u8,
}

impl Lan {
    /// A bridge for `/prefix` networks in the namespace `exk8s-<tag>-lan`, made afresh (a
    /// namespace a killed stack left behind is removed first).
    pub(super) fn new(tag: &str, prefix: u8) -> Result<Self, MachineError> {
        let lan = Self {
            tag: tag.to_owned(),
            prefix,
        };
        let switch = lan.switch();
        let _ = ip(&["netns", "del", &switch]);
        ip(&["netns", "add", &switch])?;
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", "br0", "up"])?;
        Ok(lan)
    }

    /// The bridge's namespace (under `/run/netns`), where the subnet's gateway is.
    pub(super) fn switch(&self) -> String {
        format!("exk8s-{}-lan", self.tag)
    }

    /// VM `vm`'s namespace name (under `/run/netns`).
    pub(super) fn netns(&self, vm: i64) -> String {
        format!("exk8s-{}-vm{vm}", self.tag)
    }

    /// VM `vm`'s namespace, at `address` on the bridge, with `extra` addresses on its `lo`
    /// (where the cloud's services answer) and its default route through the subnet's gateway.
    /// A namespace of the same name is replaced. A route a host needs: a program of the host
    /// connecting to a Service's address (the apiserver calling a webhook) is refused "network
    /// is unreachable" before kube-proxy's rules can translate the address, unless some route
    /// covers it.
    pub(super) fn attach(
        &self,
        vm: i64,
        address: &str,
        extra: &[&str],
    ) -> Result<(), MachineError> {
        let (node, switch) = (self.netns(vm), self.switch());
        self.detach(vm);
        ip(&["netns", "add", &node])?;
        // Interface names have at most 15 bytes: the VM id keeps them apart on the bridge.
        let (inside, outside) = (format!("x{vm}i"), format!("x{vm}o"));
        ip(&[
            "link", "add", &inside, "netns", &node, "type", "veth", "peer", "name", &outside,
            "netns", &switch,
        ])?;
        ip(&["-n", &node, "link", "set", "lo", "up"])?;
        for address in extra {
            ip(&["-n", &node, "addr", "add", address, "dev", "lo"])?;
        }
        ip(&["-n", &node, "link", "set", &inside, "name", "eth0"])?;
        let cidr = format!("{address}/{}", self.prefix);
        ip(&["-n", &node, "addr", "add", &cidr, "dev", "eth0"])?;
        ip(&["-n", &node, "link", "set", "eth0", "up"])?;
        ip(&["-n", &switch, "link", "set", &outside, "master", "br0"])?;
        ip(&["-n", &switch, "link", "set", &outside, "up"])?;
        let gateway = gateway(address, self.prefix)?;
        let gateway_cidr = format!("{gateway}/{}", self.prefix);
        ip(&[
            "-n",
            &switch,
            "addr",
            "replace",
            &gateway_cidr,
            "dev",
            "br0",
        ])?;
        ip(&[
            "-n", &node, "route", "add", "default", "via", &gateway, "dev", "eth0",
        ])?;
        Ok(())
    }

    /// The network's DNS resolver for a machine at `address`: its subnet's gateway, where no
    /// resolver listens (a network with no way out has no name to give but the ones the
    /// machines' `/etc/hosts` hold): a lookup is refused at once, as an isolated network's
    /// resolver answers at once, instead of waiting out every timeout for an address nothing
    /// routes to.
    pub(super) fn resolver(&self, address: &str) -> Result<String, MachineError> {
        gateway(address, self.prefix)
    }

    /// Removes VM `vm`'s namespace (its veth goes with it); nothing when there is none.
    pub(super) fn detach(&self, vm: i64) {
        let node = self.netns(vm);
        if PathBuf::from("/run/netns").join(&node).exists() {
            let _ = ip(&["netns", "del", &node]);
        }
    }
}

/// The gateway of the `/prefix` subnet `address` is in: its first address (the compute
/// simulator hands out hosts from .11, .1 to .10 being the cloud's).
fn gateway(address: &str, prefix: u8) -> Result<String, MachineError> {
    let parsed: std::net::Ipv4Addr = address.parse().map_err(|_| MachineError::Io {
        what: format!("the machine address {address}"),
        detail: "not an IPv4 address".into(),
    })?;
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    Ok(std::net::Ipv4Addr::from((u32::from(parsed) & mask) + 1).to_string())
}

impl Lan {
    /// Removes the bridge's namespace (every machine's namespace first, [`Self::detach`]).
    pub(super) fn remove(&self) {
        let switch = self.switch();
        if PathBuf::from("/run/netns").join(&switch).exists() {
            let _ = ip(&["netns", "del", &switch]);
        }
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A TCP listener on `addr` inside the namespace `netns`, for the caller's runtime. A thread of
/// its own enters the namespace to bind and ends: every other thread stays in the host's.
pub(super) fn listen_in(
    netns: &str,
    addr: SocketAddr,
) -> Result<tokio::net::TcpListener, MachineError> {
    let path = PathBuf::from("/run/netns").join(netns);
    let listening = std::thread::spawn(move || -> std::io::Result<std::net::TcpListener> {
        let ns = std::fs::File::open(&path)?;
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&ns),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )?;
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    });
    let bound = listening
        .join()
        .map_err(|_| MachineError::Io {
            what: format!("binding {addr} in {netns}"),
            detail: "the binding thread panicked".into(),
        })?
        .map_err(|e| MachineError::Io {
            what: format!("binding {addr} in {netns}"),
            detail: e.to_string(),
        })?;
    tokio::net::TcpListener::from_std(bound).map_err(|e| MachineError::Io {
        what: format!("binding {addr} in {netns}"),
        detail: e.to_string(),
    })
}

/// Relays every connection `listener` accepts to `127.0.0.1:port` of the host, until aborted.
pub(super) async fn relay(listener: tokio::net::TcpListener, port: u16) {
    loop {
        let Ok((mut inside, _)) = listener.accept().await else {
            // Out of descriptors, for instance: try again in a moment, not in a spin.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        tokio::spawn(async move {
            if let Ok(mut outside) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gateway_is_the_subnets_first_address() {
        assert_eq!(super::gateway("10.240.0.11", 24).unwrap(), "10.240.0.1");
        assert_eq!(super::gateway("10.240.3.200", 20).unwrap(), "10.240.0.1");
        assert_eq!(super::gateway("127.0.19.14", 28).unwrap(), "127.0.19.1");
        assert!(super::gateway("vm-101", 24).is_err());
    }
}
