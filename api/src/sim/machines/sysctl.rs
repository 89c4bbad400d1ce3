//! A machine's network kernel parameters. nspawn mounts a machine's `/proc/sys` read-only, so
//! its `systemd-sysctl` cannot set what `/etc/sysctl.d` asks of the kernel (the bundle's
//! `90-exk8s-kubernetes.conf`: forwarding, bridged traffic through iptables). The `net.*`
//! parameters belong to the machine's own network namespace — on a VM, to its own kernel — so
//! the provider sets them there from the host, as systemd-sysctl would have, whenever the
//! machine's files change. Every other parameter is the host kernel's and stays as it is; a
//! pattern (`net.ipv4.conf.*.rp_filter`) is left to the machine.

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
