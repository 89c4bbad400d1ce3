//! Draining a worker that is being removed, as its control-plane drainer's bundle asks:
//! `kubectl drain` (cordon, then evict every pod through the eviction API, honouring
//! PodDisruptionBudgets; DaemonSet pods stay, emptyDir data goes with the machine), then the
//! Node object is deleted so the cluster forgets the machine. A node the apiserver does not
//! know (it never registered, or an earlier attempt finished) is already drained; one whose
//! kubelet is lost (`Ready` Unknown: a dead machine) has its pods waited for only until five
//! minutes past their deletion time, as Cluster API drains an unreachable node.

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

/// What the apiserver says of the node being drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// It never registered, or an earlier attempt deleted it.
    Absent,
    /// Its kubelet posts its status (`Ready` True or False).
    Reporting,
    /// The node controller lost its kubelet (`Ready` Unknown): a dead machine.
    Unreachable,
}

/// How long past its deletion time a pod of an unreachable node may stay before the drain
/// stops waiting for it (Cluster API's choice for unreachable nodes): its kubelet, gone, would
/// never confirm the deletion, and the drain would otherwise last its whole timeout.
const SKIP_WAIT_UNREACHABLE_SECS: u32 = 300;

/// What the apiserver says of `node`.
fn known(drain: &Drain<'_>) -> Result<Known, String> {
    let output = Command::new(&drain.kubectl)
        .args([
            "get",
            "node",
            drain.node.as_str(),
            "--ignore-not-found",
            "-o",
            r#"jsonpath={.metadata.name} {.status.conditions[?(@.type=="Ready")].status}"#,
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
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut words = stdout.split_whitespace();
    Ok(match (words.next(), words.next()) {
        (None, _) => Known::Absent,
        (Some(_), Some("Unknown")) => Known::Unreachable,
        (Some(_), _) => Known::Reporting,
    })
}

pub(super) fn perform(drain: &Drain<'_>) -> Result<(), String> {
    let name = drain.node.as_str();
    let known = known(drain)?;
    if known == Known::Absent {
        log_info!("node {name} is not registered: nothing to drain");
        return Ok(());
    }
    let env: [(&str, &Path); 1] = [("KUBECONFIG", &drain.kubeconfig)];
    let timeout = format!("--timeout={}s", drain.timeout.as_secs().max(1));
    let mut args = vec![
        "drain".to_owned(),
        name.to_owned(),
        "--ignore-daemonsets".to_owned(),
        "--delete-emptydir-data".to_owned(),
        "--force".to_owned(),
        timeout,
    ];
    if known == Known::Unreachable {
        log_info!(
            "node {name} is unreachable (Ready Unknown): its pods are not waited for past {SKIP_WAIT_UNREACHABLE_SECS}s after their deletion time"
        );
        args.push(format!(
            "--skip-wait-for-delete-timeout={SKIP_WAIT_UNREACHABLE_SECS}"
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    super::exec::run(&drain.kubectl, &args, &env)?;
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

    /// `known`: a line per node the apiserver knows, `<name> <Ready status>`.
    fn kubectl(dir: &Path, known: &str) -> PathBuf {
        let path = dir.join("kubectl");
        let script = format!(
            "#!/bin/sh\necho \"$KUBECONFIG $*\" >> {log}\n\
             if [ \"$1\" = get ]; then grep \"^$3 \" {known}; fi\nexit 0\n",
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
            kubectl: kubectl(dir.path(), "blue-104.cluster-1.internal True\n"),
            kubeconfig: "/etc/exk8s/kubeconfig/admin.kubeconfig".into(),
            node: &node,
            timeout: Duration::from_secs(300),
        };
        perform(&drain).unwrap();
        let k = "/etc/exk8s/kubeconfig/admin.kubeconfig";
        assert_eq!(
            calls(dir.path()),
            [
                format!("{k} get node blue-104.cluster-1.internal --ignore-not-found -o {READY}"),
                format!(
                    "{k} drain blue-104.cluster-1.internal --ignore-daemonsets --delete-emptydir-data --force --timeout=300s"
                ),
                format!(
                    "{k} delete node blue-104.cluster-1.internal --ignore-not-found --wait=false"
                ),
            ]
        );
    }

    /// The lookup's output format, as the stand-in records it.
    const READY: &str =
        r#"jsonpath={.metadata.name} {.status.conditions[?(@.type=="Ready")].status}"#;

    #[test]
    fn an_unreachable_node_is_not_waited_for_past_its_pods_deletion() {
        let _serial = serial();
        let dir = tempfile::tempdir().unwrap();
        let node = NodeName::new("blue-107.cluster-1.internal").unwrap();
        let drain = Drain {
            kubectl: kubectl(dir.path(), "blue-107.cluster-1.internal Unknown\n"),
            kubeconfig: "/k".into(),
            node: &node,
            timeout: Duration::from_secs(600),
        };
        perform(&drain).unwrap();
        assert_eq!(
            calls(dir.path())[1],
            "/k drain blue-107.cluster-1.internal --ignore-daemonsets --delete-emptydir-data --force --timeout=600s --skip-wait-for-delete-timeout=300"
        );
    }

    #[test]
    fn a_node_the_apiserver_does_not_know_is_already_drained() {
        let _serial = serial();
        let dir = tempfile::tempdir().unwrap();
        let node = NodeName::new("blue-105.cluster-1.internal").unwrap();
        let drain = Drain {
            kubectl: kubectl(dir.path(), "someone-else True\n"),
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
