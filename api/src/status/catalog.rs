//! Every condition a cluster and its nodes report, with each reason it can give: what it means
//! and what to do about it. `docs/reference/conditions.md` is rendered from this catalog
//! ([`page`]); one test keeps that page current, another fails when the status module gives a
//! type or reason the catalog does not list (or the catalog lists one nothing gives).

/// One reason a condition can give.
#[derive(Debug)]
pub struct Reason {
    pub name: &'static str,
    /// What it means.
    pub means: &'static str,
    /// What an operator does about it (empty: nothing to do).
    pub action: &'static str,
}

/// Where a condition is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    /// `GET /clusters/{id}`'s `conditions`.
    Cluster,
    /// Each node's `conditions` in `GET /clusters/{id}`.
    Node,
}

/// One condition type.
#[derive(Debug)]
pub struct ConditionDoc {
    pub type_: &'static str,
    pub on: On,
    /// What it says when True.
    pub says: &'static str,
    pub reasons: &'static [Reason],
}

const fn r(name: &'static str, means: &'static str, action: &'static str) -> Reason {
    Reason {
        name,
        means,
        action,
    }
}

/// What each component condition of a node can say.
const COMPONENT: &[Reason] = &[
    r(
        "Healthy",
        "the node's agent last reported the component healthy",
        "",
    ),
    r(
        "Unhealthy",
        "the node's agent last reported it unhealthy; the message is the agent's",
        "Read the message; on the machine, `journalctl -u` the component's unit (etcd, kubelet) or `crictl logs` its container.",
    ),
    r(
        "NotReported",
        "the agent has not reported it yet (a node still booting, or one whose agent never ran)",
        "If it lasts, look at the node's `phase` and last report (`exk8s nodes CLUSTER`) and at `journalctl -u exk8s-agent` on the machine.",
    ),
];

/// Every condition, cluster-wide first, in the order the API lists them.
pub const CONDITIONS: &[ConditionDoc] = &[
    ConditionDoc {
        type_: "Available",
        on: On::Cluster,
        says: "the control plane serves: etcd has quorum and at least one kube-apiserver is healthy",
        reasons: &[
            r(
                "Available",
                "etcd has quorum and a kube-apiserver is healthy",
                "",
            ),
            r(
                "NotFounded",
                "the cluster is not founded (still being founded, failed, or being deleted)",
                "Read the cluster's `phase` and `error_reason`; a failed founding left nothing behind and can be asked again.",
            ),
            r(
                "EtcdQuorumLost",
                "fewer etcd members report healthy than a quorum",
                "See `EtcdClusterHealthy` for which members; bring the machines back (`HealthCheckSucceeded` on each node) or restore from a snapshot (`exk8s restore`).",
            ),
            r(
                "NoHealthyAPIServer",
                "etcd has quorum but no kube-apiserver reports healthy",
                "See `ControlPlaneComponentsHealthy` and each node's `APIServerPodHealthy`.",
            ),
        ],
    },
    ConditionDoc {
        type_: "EtcdClusterHealthy",
        on: On::Cluster,
        says: "every etcd member reports healthy",
        reasons: &[
            r("Healthy", "every member reports healthy", ""),
            r(
                "MembersUnhealthy",
                "some members are unhealthy, the others still a quorum",
                "The message names them: look at each one's node (`EtcdMemberHealthy`, `HealthCheckSucceeded`); an unhealthy machine is replaced when remediation allows it.",
            ),
            r(
                "QuorumLost",
                "too few members are healthy for a quorum: etcd refuses writes",
                "Bring the named members' machines back; if they are lost, restore from a snapshot (`exk8s restore CLUSTER`).",
            ),
            r(
                "NotReported",
                "no member has reported its health yet",
                "Normal while the cluster boots.",
            ),
        ],
    },
    ConditionDoc {
        type_: "ControlPlaneComponentsHealthy",
        on: On::Cluster,
        says: "every kube-apiserver, kube-controller-manager and kube-scheduler reports healthy",
        reasons: &[
            r(
                "Healthy",
                "every control-plane component reports healthy",
                "",
            ),
            r(
                "Unhealthy",
                "the message names each unhealthy component, its node and what its agent said",
                "Look at that node's pod conditions and, on the machine, `crictl ps -a` and `crictl logs`.",
            ),
            r(
                "NotReported",
                "some components have not reported yet",
                "Normal while nodes boot; if it lasts, see the named nodes' reports.",
            ),
        ],
    },
    ConditionDoc {
        type_: "CertificatesAvailable",
        on: On::Cluster,
        says: "no node certificate has expired (operator kubeconfigs are watched apart)",
        reasons: &[
            r(
                "CertificatesValid",
                "the message names the soonest expiry, more than the warning window away",
                "",
            ),
            r(
                "CertificatesExpiringSoon",
                "a certificate expires within the warning window and its renewal has not succeeded",
                "Renewal is automatic; see why the named node has not applied it (`exk8s nodes CLUSTER`), or renew now: `exk8s renew-certs CLUSTER`.",
            ),
            r(
                "CertificatesExpired",
                "a node certificate has expired: components using it fail",
                "Renew (`exk8s renew-certs CLUSTER`) and make sure the named nodes' agents run and sync.",
            ),
            r(
                "NotYetIssued",
                "no certificate has been issued yet",
                "Normal while the cluster is founded.",
            ),
        ],
    },
    ConditionDoc {
        type_: "MachinesReady",
        on: On::Cluster,
        says: "every machine (control-plane nodes and pool workers not being removed) finished booting and last reported healthy",
        reasons: &[
            r("Ready", "every machine is ready", ""),
            r(
                "NotReady",
                "the message names the machines that are not",
                "Look at each named node's `phase`, last report and `HealthCheckSucceeded`.",
            ),
            r("NoMachines", "the cluster has no machine", ""),
        ],
    },
    ConditionDoc {
        type_: "RollingOut",
        on: On::Cluster,
        says: "control-plane nodes are taking a newer generation (a renewal, a rotation's phase, an upgrade), one at a time",
        reasons: &[
            r(
                "NotRollingOut",
                "every control-plane node is up to date",
                "",
            ),
            r(
                "RollingOut",
                "the message says how many are behind, the version an upgrade requires, the node applying or next, and a stop",
                "Nothing while it moves. When it says `stopped`, the named node's sync failed and the others wait: read its report; it recovers by itself once the node can apply, or PATCH the cluster back to the version the message names to roll back.",
            ),
        ],
    },
    ConditionDoc {
        type_: "ScalingUp",
        on: On::Cluster,
        says: "the control plane grows toward the size asked for",
        reasons: &[
            r("AtDesiredSize", "no member is to be added", ""),
            r("MemberJoining", "a member is joining etcd as a learner", ""),
            r(
                "ReplacementPending",
                "a member is to be replaced; its replacement joins once every other member is healthy and up to date",
                "",
            ),
            r(
                "WaitingForRollout",
                "the next join waits for the member the message names to be healthy and up to date",
                "If it does not move, see that member's report.",
            ),
            r(
                "JoinPending",
                "every member is healthy and up to date: the next join starts at the reconciler's next pass",
                "",
            ),
            r(
                "ChangeStopped",
                "the membership change stopped; the message says why (for example a join that timed out)",
                "Fix the cause, then ask for the size again (`exk8s scale`).",
            ),
        ],
    },
    ConditionDoc {
        type_: "ScalingDown",
        on: On::Cluster,
        says: "the control plane shrinks toward the size asked for",
        reasons: &[
            r("AtDesiredSize", "no member is to be removed", ""),
            r(
                "MemberLeaving",
                "a member is being drained and removed from etcd by the member the message names",
                "",
            ),
            r(
                "WaitingForRollout",
                "the next removal waits for the member the message names to be healthy and up to date",
                "If it does not move, see that member's report.",
            ),
            r(
                "LeavePending",
                "every member is healthy and up to date: the next removal starts at the reconciler's next pass",
                "",
            ),
            r(
                "ChangeStopped",
                "the membership change stopped; the message says why",
                "Fix the cause, then ask for the size again (`exk8s scale`).",
            ),
        ],
    },
    ConditionDoc {
        type_: "CARotating",
        on: On::Cluster,
        says: "a CA rotation runs (membership changes wait for it)",
        reasons: &[
            r("NoRotation", "no CA rotation runs", ""),
            r(
                "WaitingForNode",
                "the rotation's phase waits for the node the message names to apply it",
                "If it lasts, see that node's report; a node that never took a bundle is not waited for.",
            ),
            r(
                "PhaseComplete",
                "every node applied the phase; the next starts at the reconciler's next pass",
                "",
            ),
        ],
    },
    ConditionDoc {
        type_: "ServiceAccountKeyRotating",
        on: On::Cluster,
        says: "the service-account signing key's rotation runs",
        reasons: &[
            r("NoRotation", "no rotation runs", ""),
            r(
                "WaitingForNode",
                "the phase waits for the control-plane node the message names",
                "If it lasts, see that node's report.",
            ),
            r(
                "WaitingForTokenRefresh",
                "every apiserver signs with the new key; the old one stays trusted until the time the message gives, while kubelets refresh their pods' tokens",
                "",
            ),
            r(
                "PhaseComplete",
                "every control-plane node applied the phase; the next starts at the reconciler's next pass",
                "",
            ),
        ],
    },
    ConditionDoc {
        type_: "ServiceAccountKeyFresh",
        on: On::Cluster,
        says: "the service-account signing key is younger than the cluster's maximum age",
        reasons: &[
            r("KeyWithinMaxAge", "the key is within its maximum age", ""),
            r(
                "KeyRotating",
                "the key is past its maximum age and its rotation runs",
                "",
            ),
            r(
                "KeyTooOld",
                "the key is past its maximum age; the message says whether the API rotates it by itself",
                "Rotate it: `exk8s rotate-sa-key CLUSTER` (or let the automatic rotation run once no other change does).",
            ),
        ],
    },
    ConditionDoc {
        type_: "SnapshotsUpToDate",
        on: On::Cluster,
        says: "an etcd snapshot is stored within the schedule",
        reasons: &[
            r(
                "Taken",
                "the last snapshot is within the schedule; the message says when the next is due",
                "",
            ),
            r(
                "ScheduleMissed",
                "a scheduled snapshot is overdue and none is stored since; the message gives the last attempt",
                "Read the last attempt's error (`exk8s snapshots list CLUSTER`): the object store, or the asked member's agent.",
            ),
            r(
                "NotYetTaken",
                "the first scheduled snapshot is not due yet",
                "",
            ),
            r(
                "Manual",
                "no schedule: snapshots are taken only when asked; the message gives the last",
                "Set one if you want them: `exk8s snapshots schedule CLUSTER`.",
            ),
            r(
                "NotScheduled",
                "no schedule and no snapshot yet",
                "Take one (`exk8s snapshots create CLUSTER`) or set a schedule.",
            ),
            r(
                "NotFounded",
                "the cluster is not founded: it has no etcd to snapshot",
                "",
            ),
        ],
    },
    ConditionDoc {
        type_: "RemediationAllowed",
        on: On::Cluster,
        says: "a machine unhealthy past its policy's timeout is replaced, one at a time ([Machine health](../machine-health.md))",
        reasons: &[
            r(
                "Allowed",
                "remediation may replace an unhealthy machine",
                "",
            ),
            r(
                "RemediationOff",
                "the cluster's health policy turns it off",
                "Replace machines yourself (`exk8s members replace`), or turn it on: `PUT /clusters/{id}/health-policy`.",
            ),
            r(
                "TooManyUnhealthy",
                "more machines are unhealthy than `max_unhealthy` allows: something larger than one machine is wrong",
                "Find the common cause (network, the cloud, the API's reach) before replacing anything.",
            ),
            r(
                "QuorumAtRisk",
                "replacing another member would lose etcd's quorum",
                "Bring unhealthy members back first, or restore from a snapshot.",
            ),
            r(
                "RetriesExhausted",
                "the policy's limit of replacements in its period was reached: left alone until an operator looks",
                "Find why machines keep failing; the limit lifts when the period has passed.",
            ),
            r(
                "ChangeInProgress",
                "another change runs (a membership change, an upgrade, a restore, a rotation)",
                "",
            ),
            r(
                "Blocked",
                "refused for a reason this build of the API does not know (written by a newer one)",
                "Read the message.",
            ),
        ],
    },
    ConditionDoc {
        type_: "Deleting",
        on: On::Cluster,
        says: "the cluster is being deleted",
        reasons: &[
            r("NotDeleting", "the cluster is not being deleted", ""),
            r(
                "Deleting",
                "its VMs, security group and DNS records are being released",
                "",
            ),
        ],
    },
    ConditionDoc {
        type_: "EtcdMemberHealthy",
        on: On::Node,
        says: "the node's etcd member reports healthy (control-plane nodes)",
        reasons: COMPONENT,
    },
    ConditionDoc {
        type_: "APIServerPodHealthy",
        on: On::Node,
        says: "the node's kube-apiserver reports healthy (control-plane nodes)",
        reasons: COMPONENT,
    },
    ConditionDoc {
        type_: "ControllerManagerPodHealthy",
        on: On::Node,
        says: "the node's kube-controller-manager reports healthy (control-plane nodes)",
        reasons: COMPONENT,
    },
    ConditionDoc {
        type_: "SchedulerPodHealthy",
        on: On::Node,
        says: "the node's kube-scheduler reports healthy (control-plane nodes)",
        reasons: COMPONENT,
    },
    ConditionDoc {
        type_: "KubeletHealthy",
        on: On::Node,
        says: "the node's kubelet reports healthy",
        reasons: COMPONENT,
    },
    ConditionDoc {
        type_: "HealthCheckSucceeded",
        on: On::Node,
        says: "the machine passes its health checks: its VM runs, its agent keeps asking for updates, its components report healthy",
        reasons: &[
            r("Healthy", "every check passes", ""),
            r(
                "Watching",
                "a check fails, not yet for its policy's timeout; the message says how long until it counts",
                "",
            ),
            r(
                "MachineDeleted",
                "its VM no longer exists",
                "Replaced when `RemediationAllowed` is True; otherwise `exk8s members replace` (control plane) or let the pool make a new one.",
            ),
            r(
                "MachineNotRunning",
                "its VM is stopped or failed",
                "Start it through the cloud, or let remediation replace it.",
            ),
            r(
                "NodeUnreachable",
                "its agent stopped asking for updates",
                "Check the machine's network to the API and `exk8s-agent-sync.timer` on it.",
            ),
            r(
                "UnhealthyNode",
                "a component reports unhealthy; the message names it",
                "See the node's component conditions.",
            ),
            r(
                "NodeStartupTimeout",
                "it was made and never reported healthy",
                "Read its reports and, on the machine, `journalctl -u exk8s-agent`.",
            ),
            r("Leaving", "the machine is being removed", ""),
        ],
    },
];

/// `docs/reference/conditions.md`.
pub fn page() -> String {
    let mut page = String::from(
        "# Conditions reference\n\n\
         Generated from `api/src/status/catalog.rs` (a test keeps this page current). Each\n\
         condition has Cluster API v1beta2's shape: a `type`, a `status` (`True`, `False` or\n\
         `Unknown`), a CamelCase `reason`, a `message` and the time of its last change. The\n\
         cluster's are in `GET /clusters/{id}`'s `conditions`, each node's in its `conditions`\n\
         there; `exk8s clusters get CLUSTER` shows them.\n",
    );
    for (on, title) in [
        (On::Cluster, "The cluster's conditions"),
        (On::Node, "Each node's conditions"),
    ] {
        page.push_str(&format!("\n## {title}\n"));
        for c in CONDITIONS.iter().filter(|c| c.on == on) {
            page.push_str(&format!("\n### `{}`\n\nTrue when {}.\n\n", c.type_, c.says));
            page.push_str("| Reason | Means | What to do |\n|---|---|---|\n");
            for reason in c.reasons {
                page.push_str(&format!(
                    "| `{}` | {} | {} |\n",
                    reason.name, reason.means, reason.action
                ));
            }
        }
    }
    page
}

#[cfg(test)]
mod tests;
