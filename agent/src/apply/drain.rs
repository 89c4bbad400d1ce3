//! Draining a worker that is being removed, as its control-plane drainer's bundle asks:
//! `kubectl drain` (cordon, then evict every pod through the eviction API, honouring
//! PodDisruptionBudgets; DaemonSet pods stay, emptyDir data goes with the machine), then the
//! Node object is deleted so the cluster forgets the machine. A node the apiserver does not
//! know (it never registered, or an earlier attempt finished) is already drained.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use exk8s_common::names::NodeName;

use crate::log::log_info;

/// One drain: which kubectl, with which credentials, of which node, for how long.
#[derive(Debug, Clone)]
pub struct Drain<'a> {
    pub kubectl: PathBuf,
    pub kubeconfig: PathBuf,
    pub node: &'a NodeName,
    pub timeout: Duration,
}

/// Whether the apiserver knows `node`.
fn registered(drain: &Drain<'_>) -> Result<bool, String> {
    let output = Command::new(&drain.kubectl)
        .args([
            "get",
            "node",
            drain.node.as_str(),
            "--ignore-not-found",
            "-o",
            "name",
        ])
        .env("KUBECONFIG", &drain.kubeconfig)
        .output()
        .map_err(|e| format!("starting {}: {e}", drain.kubectl.display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "{} get node exited with {}: {}",
            drain.kubectl.display(),
            output.status,
            stderr.trim()
        ));
    }
    Ok(!String::from_utf8_lossy(&output.stdout).trim().is_empty())
}

pub(super) fn perform(drain: &Drain<'_>) -> Result<(), String> {
    let name = drain.node.as_str();
    if !registered(drain)? {
        log_info!("node {name} is not registered: nothing to drain");
        return Ok(());
    }
    let env: [(&str, &Path); 1] = [("KUBECONFIG", &drain.kubeconfig)];
    let timeout = format!("--timeout={}s", drain.timeout.as_secs().max(1));
    super::exec::run(
        &drain.kubectl,
        &[
            "drain",
            name,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--force",
            &timeout,
        ],
        &env,
    )?;
    super::exec::run(
        &drain.kubectl,
        &["delete", "node", name, "--ignore-not-found", "--wait=false"],
        &env,
    )?;
    log_info!("node {name} drained and deleted");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// A stand-in for kubectl (the real one is not installable here) that records its
    /// arguments and the kubeconfig it was given, and knows the nodes listed in `known`.
    /// Held by each test for its whole run: a script one test is still writing must not be
    /// open in a child another test forks, or executing it fails with ETXTBSY ("Text file
    /// busy"). These are the only tests of this binary that start processes.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn kubectl(dir: &Path, known: &str) -> PathBuf {
        let path = dir.join("kubectl");
        let script = format!(
            "#!/bin/sh\necho \"$KUBECONFIG $*\" >> {log}\n\
             if [ \"$1\" = get ]; then grep -qx \"$3\" {known} && echo node/$3; fi\nexit 0\n",
            log = dir.join("calls").display(),
            known = dir.join("known").display(),
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("known"), known).unwrap();
        path
    }

    fn calls(dir: &Path) -> Vec<String> {
        std::fs::read_to_string(dir.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_registered_node_is_drained_through_eviction_then_deleted() {
        let _serial = serial();
        let dir = tempfile::tempdir().unwrap();
        let node = NodeName::new("blue-104.cluster-1.internal").unwrap();
        let drain = Drain {
            kubectl: kubectl(dir.path(), "blue-104.cluster-1.internal\n"),
            kubeconfig: "/etc/exk8s/kubeconfig/admin.kubeconfig".into(),
            node: &node,
            timeout: Duration::from_secs(300),
        };
        perform(&drain).unwrap();
        let k = "/etc/exk8s/kubeconfig/admin.kubeconfig";
        assert_eq!(
            calls(dir.path()),
            [
                format!("{k} get node blue-104.cluster-1.internal --ignore-not-found -o name"),
                format!(
                    "{k} drain blue-104.cluster-1.internal --ignore-daemonsets --delete-emptydir-data --force --timeout=300s"
                ),
                format!(
                    "{k} delete node blue-104.cluster-1.internal --ignore-not-found --wait=false"
                ),
            ]
        );
    }

    #[test]
    fn a_node_the_apiserver_does_not_know_is_already_drained() {
        let _serial = serial();
        let dir = tempfile::tempdir().unwrap();
        let node = NodeName::new("blue-105.cluster-1.internal").unwrap();
        let drain = Drain {
            kubectl: kubectl(dir.path(), "someone-else\n"),
            kubeconfig: "/k".into(),
            node: &node,
            timeout: Duration::from_secs(300),
        };
        perform(&drain).unwrap();
        assert_eq!(calls(dir.path()).len(), 1, "only the lookup ran");
    }

    #[test]
    fn a_failing_kubectl_fails_the_drain_with_its_words() {
        let _serial = serial();
        let dir = tempfile::tempdir().unwrap();
        let failing = dir.path().join("kubectl");
        std::fs::write(
            &failing,
            "#!/bin/sh\necho 'connection refused' >&2\nexit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&failing, std::fs::Permissions::from_mode(0o755)).unwrap();
        let node = NodeName::new("blue-106.cluster-1.internal").unwrap();
        let error = perform(&Drain {
            kubectl: failing,
            kubeconfig: "/k".into(),
            node: &node,
            timeout: Duration::from_secs(5),
        })
        .unwrap_err();
        assert!(error.contains("connection refused"), "{error}");
    }
}
