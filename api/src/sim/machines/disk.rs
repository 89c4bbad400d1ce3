//! A machine's disk: a copy of the baked node image (reflinked where the file system can), with
//! the machine's own hostname and machine-id, and what this host's kernel makes a machine need
//! that a VM would not ([`host_rewrites`]) — each such change in a file of its own named
//! `exk8s-host-*`, none in a file the bundle writes (the agent would put it back).

use std::path::Path;
use std::process::Command;

use super::MachineError;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> MachineError {
    let what = what.into();
    move |e| MachineError::Io {
        what,
        detail: e.to_string(),
    }
}

fn write(path: &Path, text: &str) -> Result<(), MachineError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
}

/// Makes `disk` from `image` unless it exists (a machine booting again keeps its disk): a copy
/// made beside it and renamed into place, so a half-made copy is never booted. `resolver` is
/// the network's DNS resolver, which the machine's `/etc/resolv.conf` names.
pub(super) fn make(
    image: &Path,
    disk: &Path,
    hostname: &str,
    resolver: &str,
) -> Result<(), MachineError> {
    if disk.exists() {
        return Ok(());
    }
    let partial = disk.with_extension("partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io(format!("removing {}", partial.display())))?;
    }
    let copied = Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(image)
        .arg(&partial)
        .output()
        .map_err(|e| MachineError::Tool {
            tool: "cp",
            detail: e.to_string(),
        })?;
    if !copied.status.success() {
        return Err(MachineError::Command {
            command: format!("cp -a {} {}", image.display(), partial.display()),
            detail: String::from_utf8_lossy(&copied.stderr).trim().to_owned(),
        });
    }
    write(&partial.join("etc/hostname"), &format!("{hostname}\n"))?;
    // The machine resolves its own name without asking DNS, as Debian's installer and
    // cloud-init (`manage_etc_hosts`) arrange on a VM (kubeadm's preflight looks it up).
    let hosts = partial.join("etc/hosts");
    let mut own = std::fs::read_to_string(&hosts).unwrap_or_default();
    if !own.is_empty() && !own.ends_with('\n') {
        own.push('\n');
    }
    write(&hosts, &format!("{own}127.0.1.1 {hostname}\n"))?;
    // The resolver the network gives, as a cloud's DHCP names its subnet's resolver — not
    // whatever the image was built with (debootstrap copies the building host's, an address
    // this network never reaches, where every lookup waits out its timeouts). A file of its
    // own: the image's may be a link, which would lead out of the disk.
    let resolv = partial.join("etc/resolv.conf");
    match std::fs::remove_file(&resolv) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io(format!("removing {}", resolv.display()))(e));
        }
        _ => {}
    }
    write(&resolv, &format!("nameserver {resolver}\n"))?;
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| MachineError::Io {
        what: "making a machine-id".into(),
        detail: e.to_string(),
    })?;
    write(
        &partial.join("etc/machine-id"),
        &format!("{}\n", hex::encode(id)),
    )?;
    host_rewrites(&partial, &Host::read())?;
    std::fs::rename(&partial, disk).map_err(io(format!("renaming {}", partial.display())))
}

/// What this host's kernel gives a machine.
#[derive(Debug, Clone, Copy)]
pub(super) struct Host {
    /// `/sys/fs/cgroup` is cgroup v2, which Kubernetes 1.35's kubelet requires by default.
    cgroup_v2: bool,
    /// CAP_SYS_RESOURCE is in the bounding set: runc may lower a container's `oom_score_adj`.
    sys_resource: bool,
}

impl Host {
    pub(super) fn read() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let bounding = status
            .lines()
            .find_map(|l| l.strip_prefix("CapBnd:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or(0);
        Self {
            cgroup_v2: Path::new("/sys/fs/cgroup/cgroup.controllers").is_file(),
            sys_resource: bounding & (1 << 24) != 0,
        }
    }
}

/// The changes a machine's image needs on this host that a VM's would not, each only when the
/// host needs it.
fn host_rewrites(root: &Path, host: &Host) -> Result<(), MachineError> {
    let kubelet_dropins = root.join("etc/kubernetes/kubelet.conf.d");
    // containerd's image filesystem is a directory of the host's disk, which the kubelet's
    // cAdvisor cannot measure inside a container ("invalid capacity 0 on image filesystem"):
    // its signals would read as no space left and taint the node with disk pressure, so they
    // are off (0%). The node's own file system is the host's disk, shared with every other
    // machine: its free share says nothing about a node's, hence 1 %. For the same reason the
    // image garbage collector waits until that disk is full: a host whose disk looks 91% used
    // (its capacity less what is available) had every kubelet free images every five minutes,
    // the sandbox image with them (Debian 12's containerd 1.6 does not pin it), and a pod
    // started while the registry was away then could not start.
    write(
        &kubelet_dropins.join("90-exk8s-host-disk.conf"),
        "# exk8s dev machine: a directory of the host's disk, shared.\n\
         apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 1%\n  \
         nodefs.inodesFree: 1%\n  imagefs.available: 0%\n  imagefs.inodesFree: 0%\n\
         imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n",
    )?;
    if !host.cgroup_v2 {
        // Kubernetes 1.35's kubelet refuses cgroup v1 unless told otherwise; the bundle's
        // kubelet reads the image's drop-ins (`--config-dir`).
        write(
            &kubelet_dropins.join("90-exk8s-host-cgroup-v1.conf"),
            "# exk8s dev machine: this host is cgroup v1 (hybrid); nodes are cgroup v2.\n\
             apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             failCgroupV1: false\n",
        )?;
    }
    // A machine runs the host's kernel and cannot load modules into it; the image (a root
    // made by debootstrap, no kernel package) has no /lib/modules, which a node's kube-proxy
    // mounts (a hostPath of type Directory): an empty one, as a VM whose kernel has its
    // modules built in has.
    std::fs::create_dir_all(root.join("lib/modules"))
        .map_err(io(format!("creating {}/lib/modules", root.display())))?;
    if !host.sys_resource {
        // Without CAP_SYS_RESOURCE nobody here may lower an `oom_score_adj` (runc sets the
        // sandbox's -998): containerd runs from the bundle's configuration plus
        // `restrict_oom_score_adj`, copied at each start.
        let script = root.join("usr/local/libexec/exk8s-host-containerd-config");
        write(
            &script,
            r#"#!/bin/sh
# exk8s dev machine: no CAP_SYS_RESOURCE on this host.
set -e
sed '/^\[plugins."io.containerd.grpc.v1.cri"\]$/a\  restrict_oom_score_adj = true' \
  /etc/containerd/config.toml > /run/exk8s-host-containerd.toml
grep -q restrict_oom_score_adj /run/exk8s-host-containerd.toml
"#,
        )?;
        let executable =
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
        std::fs::set_permissions(&script, executable)
            .map_err(io(format!("chmod {}", script.display())))?;
        write(
            &root.join("etc/systemd/system/containerd.service.d/90-exk8s-host.conf"),
            "[Service]\nExecStartPre=/usr/local/libexec/exk8s-host-containerd-config\n\
             ExecStart=\nExecStart=/usr/bin/containerd --config /run/exk8s-host-containerd.toml\n",
        )?;
    }
    Ok(())
}
