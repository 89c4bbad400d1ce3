//! A machine's network kernel parameters. nspawn mounts a machine's `/proc/sys` read-only, so
//! its `systemd-sysctl` cannot set what `/etc/sysctl.d` asks of the kernel (the bundle's
//! `90-exk8s-kubernetes.conf`: forwarding, bridged traffic through iptables) — but for
//! `/proc/sys/net`, made writable when the machine boots (`nspawn.rs`). The `net.*` parameters
//! belong to the machine's own network namespace — on a VM, to its own kernel — so the provider
//! also sets them there from the host, as systemd-sysctl would, whenever the machine's files
//! change: nothing waits on when systemd-sysctl runs. Every other parameter is the host kernel's and stays as it is; a
//! pattern (`net.ipv4.conf.*.rp_filter`) is left to the machine — but for the few the kubelet
//! itself sets when it starts ([`set_kubelet_kernel`]).

use std::path::Path;
use std::process::Command;

use super::MachineError;

/// The `net.*` settings `disk`'s `/etc/sysctl.d/*.conf` ask for, in systemd-sysctl's order
/// (files by name, later lines win), each `key=value`.
pub(super) fn wanted(disk: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(disk.join("etc/sysctl.d")) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .collect();
    files.sort();
    let mut settings: Vec<(String, String)> = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (key, value) in text.lines().filter_map(setting) {
            settings.retain(|(k, _)| *k != key);
            settings.push((key, value));
        }
    }
    settings
        .into_iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect()
}

/// One line of a sysctl.d file as a `net.*` setting: `key = value`, the key's `/` or `.`
/// separators as `.`, a leading `-` (ignore failures) dropped; `None` for anything else.
fn setting(line: &str) -> Option<(String, String)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with(['#', ';']) {
        return None;
    }
    let (key, value) = line.split_once('=')?;
    let key = key.trim().trim_start_matches('-').replace('/', ".");
    let value = value.trim();
    let per_namespace = key.starts_with("net.") && !key.contains(['*', '?', '[']);
    (per_namespace && !value.is_empty()).then(|| (key, value.to_owned()))
}

/// What the kubelet sets of its kernel when it starts (`setupKernelTunables`,
/// `pkg/kubelet/cm/container_manager_linux.go`), under `/proc/sys`. On a VM the kernel is the
/// node's own; a machine here shares the host's and cannot write it (nspawn's `/proc/sys` is
/// read-only), and a kubelet that cannot set one that differs does not start ("Failed to start
/// ContainerManager"). So the provider sets them on the host before it boots a machine, as
/// kind's privileged node containers have their kubelets do.
pub(super) const KUBELET_KERNEL: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// Sets each of [`KUBELET_KERNEL`] under `proc_sys` that differs; what it changed, each
/// `key: old -> new`.
pub(super) fn set_kubelet_kernel(proc_sys: &Path) -> Result<Vec<String>, MachineError> {
    let mut changed = Vec::new();
    for (key, wanted) in KUBELET_KERNEL {
        let path = proc_sys.join(key);
        let io = |e: std::io::Error| MachineError::Io {
            what: format!("the kubelet's kernel parameter {}", path.display()),
            detail: e.to_string(),
        };
        let now = std::fs::read_to_string(&path).map_err(io)?;
        if now.trim() != wanted {
            std::fs::write(&path, format!("{wanted}\n")).map_err(io)?;
            changed.push(format!(
                "{}: {} -> {wanted}",
                key.replace('/', "."),
                now.trim()
            ));
        }
    }
    Ok(changed)
}

/// Host limits every machine's systemd, journald, containerd and kubelet draw on together:
/// inotify instances and watches are counted per user across the host's kernel, and the
/// machines' processes all run as the host's root. At Debian's default (128 instances) a
/// third cluster's machines fail to boot ("Failed to create control group inotify object: Too
/// many open files", systemd exiting as PID 1) — kind's known issue, with the same remedy.
pub(super) const HOST_MINIMUMS: [(&str, u64); 2] = [
    ("fs/inotify/max_user_instances", 8192),
    ("fs/inotify/max_user_watches", 524_288),
];

/// Raises each of [`HOST_MINIMUMS`] under `proc_sys` that is lower (a higher one stays); what
/// it changed, each `key: old -> new`.
pub(super) fn raise_host_limits(proc_sys: &Path) -> Result<Vec<String>, MachineError> {
    let mut changed = Vec::new();
    for (key, minimum) in HOST_MINIMUMS {
        let path = proc_sys.join(key);
        let io = |e: String| MachineError::Io {
            what: format!("the host limit {}", path.display()),
            detail: e,
        };
        let now = std::fs::read_to_string(&path).map_err(|e| io(e.to_string()))?;
        let current: u64 = now
            .trim()
            .parse()
            .map_err(|e| io(format!("{:?} is no number: {e}", now.trim())))?;
        if current < minimum {
            std::fs::write(&path, format!("{minimum}\n")).map_err(|e| io(e.to_string()))?;
            changed.push(format!("{}: {current} -> {minimum}", key.replace('/', ".")));
        }
    }
    Ok(changed)
}

/// Sets `settings` in the namespace `netns` (under `/run/netns`).
pub(super) fn apply(netns: &str, settings: &[String]) -> Result<(), MachineError> {
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["--", "sysctl", "-w"])
        .args(settings);
    super::lan::run("nsenter", &mut command, || {
        format!("sysctl -w {} in {netns}", settings.join(" "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_kernel_parameters_are_set_where_they_differ() {
        let dir = tempfile::tempdir().unwrap();
        for (key, wanted) in KUBELET_KERNEL {
            let path = dir.path().join(key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let value = if key == "kernel/panic" { "1\n" } else { wanted };
            std::fs::write(path, value).unwrap();
        }
        let changed = set_kubelet_kernel(dir.path()).unwrap();
        assert_eq!(changed, ["kernel.panic: 1 -> 10"]);
        let panic = std::fs::read_to_string(dir.path().join("kernel/panic")).unwrap();
        assert_eq!(panic, "10\n");
        assert!(set_kubelet_kernel(dir.path()).unwrap().is_empty());
        let missing = set_kubelet_kernel(&dir.path().join("nowhere")).unwrap_err();
        assert!(
            missing.to_string().contains("vm/overcommit_memory"),
            "{missing}"
        );
    }

    #[test]
    fn host_limits_are_raised_never_lowered() {
        let dir = tempfile::tempdir().unwrap();
        let inotify = dir.path().join("fs/inotify");
        std::fs::create_dir_all(&inotify).unwrap();
        std::fs::write(inotify.join("max_user_instances"), "128\n").unwrap();
        std::fs::write(inotify.join("max_user_watches"), "1048576\n").unwrap();
        let changed = raise_host_limits(dir.path()).unwrap();
        assert_eq!(changed, ["fs.inotify.max_user_instances: 128 -> 8192"]);
        let watches = std::fs::read_to_string(inotify.join("max_user_watches")).unwrap();
        assert_eq!(watches, "1048576\n", "a higher limit stays");
        assert!(raise_host_limits(dir.path()).unwrap().is_empty());
        std::fs::write(inotify.join("max_user_watches"), "lots\n").unwrap();
        let bad = raise_host_limits(dir.path()).unwrap_err().to_string();
        assert!(
            bad.contains("max_user_watches") && bad.contains("\"lots\""),
            "{bad}"
        );
    }

    #[test]
    fn only_a_files_own_net_settings_are_the_namespaces() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("etc/sysctl.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("90-exk8s-kubernetes.conf"),
            "# comment\nnet.ipv4.ip_forward = 1\n; other\nnet/bridge/bridge-nf-call-iptables=1\n",
        )
        .unwrap();
        std::fs::write(
            d.join("10-image.conf"),
            "net.ipv4.ip_forward = 0\nkernel.sysrq = 1\n-net.ipv4.conf.all.rp_filter = 2\n\
             net.ipv4.conf.*.rp_filter = 2\nnet.core.somaxconn =\n",
        )
        .unwrap();
        std::fs::write(d.join("README"), "net.ipv4.ip_forward = 0\n").unwrap();
        assert_eq!(
            wanted(dir.path()),
            [
                "net.ipv4.conf.all.rp_filter=2",
                "net.ipv4.ip_forward=1",
                "net.bridge.bridge-nf-call-iptables=1"
            ]
        );
        assert!(wanted(&dir.path().join("none")).is_empty());
    }
}
