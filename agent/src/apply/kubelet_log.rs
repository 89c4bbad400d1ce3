//! What the kubelet last said about a static pod, read from its journal for a failed wait: the
//! wait itself only sees the mirror pod through the node's own apiserver, which refuses
//! connections while its new pod cannot start, so its error says nothing of why (an image the
//! registry does not have, a sandbox that cannot start). The kubelet's last error naming the
//! pod does.

use std::process::Command;
use std::time::Duration;

/// Journal lines read back at most.
const LINES: &str = "5000";
/// Characters of the kubelet's message kept.
const KEPT: usize = 500;

/// The kubelet's last error naming the static pod `pod` (in `kube-system`) logged within the
/// last `within`, if its journal has one.
pub(super) fn last_error(pod: &str, within: Duration) -> Option<String> {
    let out = Command::new("journalctl")
        .args(["--unit", "kubelet.service", "--output", "cat", "--no-pager"])
        .args(["--lines", LINES])
        .arg(format!("--since=-{}s", within.as_secs().saturating_add(5)))
        .output()
        .ok()?;
    last_error_in(&String::from_utf8_lossy(&out.stdout), pod)
}

/// What the pod worker logs when it cannot start a pod's sandbox or containers: the why.
const SYNC_ERROR: &str = "\"Error syncing pod";

/// The message of `journal`'s last klog error line (`E…] message`) naming `pod`, cut to
/// [`KEPT`] characters: the pod worker's last `Error syncing pod` (the image it cannot pull, the
/// sandbox it cannot start) when there is one — later errors naming the pod are mostly the
/// status manager failing to reach the very apiserver that is not starting —, else the last.
fn last_error_in(journal: &str, pod: &str) -> Option<String> {
    let named = format!("pod=\"kube-system/{pod}\"");
    let errors: Vec<&str> = journal
        .lines()
        .filter(|line| line.starts_with('E') && line.contains(&named))
        .filter_map(|line| line.split_once("] ").map(|(_, message)| message))
        .collect();
    errors
        .iter()
        .rev()
        .find(|message| message.starts_with(SYNC_ERROR))
        .or(errors.last())
        .map(|message| message.chars().take(KEPT).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::last_error_in;

    const POD: &str = "kube-apiserver-cp-101.cluster-1.internal";

    #[test]
    fn the_last_error_naming_the_pod_is_its_message() {
        let journal = [
            r#"I1202 10:29:50.1    3170 kubelet.go:3323] "Trying to delete pod" pod="kube-system/kube-apiserver-cp-101.cluster-1.internal""#,
            r#"E1202 10:29:51.2    3170 pod_workers.go:1324] "Error syncing pod, skipping" err="failed to \"StartContainer\" for \"kube-apiserver\" with ErrImagePull: \"failed to pull image\"" pod="kube-system/kube-apiserver-cp-101.cluster-1.internal" podUID="u""#,
            r#"E1202 10:29:52.3    3170 pod_workers.go:1324] "Error syncing pod, skipping" err="failed to \"StartContainer\" for \"kube-apiserver\" with ImagePullBackOff: \"Back-off pulling image \\\"registry.k8s.io/kube-apiserver:v1.36.3\\\"\"" pod="kube-system/kube-apiserver-cp-101.cluster-1.internal" podUID="u""#,
            r#"E1202 10:29:53.4    3170 controller.go:251] "Failed to update lease" err="connection refused""#,
            r#"E1202 10:29:53.5    3170 status_manager.go:1036] "Failed to get status for pod" err="Get \"https://127.0.0.1:7445/api/v1/namespaces/kube-system/pods/kube-apiserver-cp-101\": connection refused" pod="kube-system/kube-apiserver-cp-101.cluster-1.internal""#,
            r#"E1202 10:29:54.5    3170 pod_workers.go:1324] "Error syncing pod, skipping" err="another" pod="kube-system/kube-scheduler-cp-101.cluster-1.internal" podUID="v""#,
        ]
        .join("\n");
        let said = last_error_in(&journal, POD).unwrap();
        assert!(
            said.starts_with(r#""Error syncing pod, skipping" err="failed to \"StartContainer\" for \"kube-apiserver\" with ImagePullBackOff"#),
            "{said}"
        );
        assert!(
            said.contains("registry.k8s.io/kube-apiserver:v1.36.3"),
            "{said}"
        );
        // Nothing about the pod, or only informational lines: nothing to add.
        assert_eq!(
            last_error_in(&journal, "kube-controller-manager-cp-101"),
            None
        );
        assert_eq!(last_error_in(journal.lines().next().unwrap(), POD), None);
        // No pod worker error: the last error naming the pod.
        let status = journal.lines().nth(4).unwrap();
        assert!(
            last_error_in(status, POD)
                .unwrap()
                .starts_with("\"Failed to get status for pod\""),
            "{status}"
        );
        // A long message is cut.
        let long = format!(
            r#"E1 x.go:1] "{}" pod="kube-system/{POD}""#,
            "a".repeat(2000)
        );
        assert_eq!(last_error_in(&long, POD).unwrap().chars().count(), 500);
    }
}
