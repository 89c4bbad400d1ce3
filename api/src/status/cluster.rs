//! The cluster's own conditions, in Cluster API v1beta2's shape: `CertificatesAvailable` (from the
//! certificate inventory) and `MachinesReady` (every machine — control-plane nodes and pool
//! workers not on their way out — finished booting and last reported healthy) and
//! `ScalingUp`/`ScalingDown` (the control plane is changing to the size asked for) and
//! `Deleting`; and the control plane's replica counts in Cluster API's sense.

use super::{Condition, Status};
use crate::db::nodes::NodeRow;

/// `MachinesReady`; `since` is when a machine last reported (or the cluster was made).
pub fn machines(nodes: &[NodeRow], since: i64) -> Condition {
    let machines: Vec<&NodeRow> = nodes.iter().filter(|n| n.removal.is_none()).collect();
    let not_ready: Vec<&str> = machines
        .iter()
        .filter(|n| !n.phase.healthy())
        .map(|n| n.node_name.as_str())
        .collect();
    let (status, reason, message) = if machines.is_empty() {
        (
            Status::Unknown,
            "NoMachines",
            "the cluster has no machine".to_owned(),
        )
    } else if not_ready.is_empty() {
        (
            Status::True,
            "Ready",
            format!("all {} machines are ready", machines.len()),
        )
    } else {
        let shown: Vec<&str> = not_ready.iter().take(5).copied().collect();
        let more = not_ready.len().saturating_sub(shown.len());
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        (
            Status::False,
            "NotReady",
            format!(
                "{} of {} machines are not ready: {}{tail}",
                not_ready.len(),
                machines.len(),
                shown.join(", ")
            ),
        )
    };
    Condition {
        type_: "MachinesReady",
        status,
        reason,
        message,
        since,
    }
}

/// `ScalingUp` and `ScalingDown`: True while the control plane grows or shrinks to the size
/// asked for, with the step in progress.
pub fn scaling(
    nodes: &[NodeRow],
    desired: Option<i64>,
    error: Option<&str>,
    since: i64,
) -> [Condition; 2] {
    use crate::db::phase::EtcdMembership;
    let control_plane = || {
        nodes
            .iter()
            .filter(|n| n.role == exk8s_common::contract::Role::ControlPlane)
    };
    let with = |m: EtcdMembership| control_plane().find(move |n| n.etcd_membership == Some(m));
    let voters = control_plane()
        .filter(|n| n.etcd_membership == Some(EtcdMembership::Voter))
        .count();
    let voters = i64::try_from(voters).unwrap_or(i64::MAX);
    // What a membership change really waits for: the first member not healthy or not up to
    // date, named with what it is at.
    let waiting_on = || {
        control_plane()
            .find(|n| !n.phase.healthy() || !n.up_to_date())
            .map(|n| {
                format!(
                    "{} is healthy and up to date (it is {}, at generation {} of {})",
                    n.node_name, n.phase, n.applied_generation, n.desired_generation
                )
            })
    };
    let settled = || match error {
        Some(e) => (Status::False, "ChangeStopped", e.to_owned()),
        None => (
            Status::False,
            "AtDesiredSize",
            format!("{voters} voting members"),
        ),
    };
    let up = match (desired, with(EtcdMembership::Joining)) {
        (_, Some(node)) => (
            Status::True,
            "MemberJoining",
            format!(
                "{} is joining etcd ({}); {voters} voting",
                node.node_name, node.phase
            ),
        ),
        (_, None) if control_plane().any(|n| n.replace_since.is_some()) => (
            Status::True,
            "ReplacementPending",
            format!(
                "{} is to be replaced: its replacement joins (or, when it is down, follows its removal) once every other member is healthy and up to date",
                control_plane()
                    .find(|n| n.replace_since.is_some())
                    .map_or("a member", |n| n.node_name.as_str())
            ),
        ),
        (Some(asked), None) if asked > voters => match waiting_on() {
            Some(why) => (
                Status::True,
                "WaitingForRollout",
                format!("{voters} of {asked} members; the next joins once {why}"),
            ),
            None => (
                Status::True,
                "JoinPending",
                format!(
                    "{voters} of {asked} members; every member is healthy and up to date, the next join starts at the reconciler's next pass"
                ),
            ),
        },
        _ => settled(),
    };
    let down = match (desired, with(EtcdMembership::Leaving)) {
        (_, Some(node)) => (
            Status::True,
            "MemberLeaving",
            format!(
                "{} is being drained and removed from etcd by {}",
                node.node_name,
                control_plane()
                    .find(|n| Some(n.id) == node.drain_by)
                    .map_or("another member", |n| n.node_name.as_str())
            ),
        ),
        (Some(asked), None) if asked < voters => match waiting_on() {
            Some(why) => (
                Status::True,
                "WaitingForRollout",
                format!("{voters} members, {asked} asked; the next leaves once {why}"),
            ),
            None => (
                Status::True,
                "LeavePending",
                format!(
                    "{voters} members, {asked} asked; every member is healthy and up to date, the next leaves at the reconciler's next pass"
                ),
            ),
        },
        _ => settled(),
    };
    let condition = |type_, (status, reason, message): (Status, &'static str, String)| Condition {
        type_,
        status,
        reason,
        message,
        since,
    };
    [condition("ScalingUp", up), condition("ScalingDown", down)]
}

/// A CA rotation in progress, as `CARotating` describes it.
#[derive(Debug, Clone, Copy)]
pub struct Rotating<'a> {
    /// `cluster`, `etcd` or `front_proxy`.
    pub ca: &'a str,
    pub phase: &'a str,
    pub updated_at: i64,
    /// The node the phase waits for, and where it is.
    pub waiting_for: Option<&'a str>,
}

/// `CARotating`: true while a CA rotation runs (membership changes wait for it), saying its
/// phase and the node it waits for.
pub fn ca_rotation(rotation: Option<&Rotating<'_>>, since: i64) -> Condition {
    let (status, reason, message, since) = match rotation {
        None => (
            Status::False,
            "NoRotation",
            "no CA rotation is in progress".to_owned(),
            since,
        ),
        Some(r) => (
            Status::True,
            match r.waiting_for {
                Some(_) => "WaitingForNode",
                None => "PhaseComplete",
            },
            match &r.waiting_for {
                Some(node) => format!(
                    "the {} CA's rotation is in phase {}; it waits for {node}; membership changes wait for the rotation",
                    r.ca, r.phase
                ),
                None => format!(
                    "the {} CA's rotation is in phase {}; every node that took a bundle applied it, the next phase starts at the reconciler's next pass",
                    r.ca, r.phase
                ),
            },
            r.updated_at,
        ),
    };
    Condition {
        type_: "CARotating",
        status,
        reason,
        message,
        since,
    }
}

/// `Deleting`: true from the moment a deletion was accepted (`since`: the cluster's last change).
pub fn deleting(phase: crate::db::phase::ClusterPhase, since: i64) -> Condition {
    let (status, reason, message) = if phase == crate::db::phase::ClusterPhase::Deleting {
        (
            Status::True,
            "Deleting",
            "the cluster is being deleted: its VMs, security group and DNS records are released",
        )
    } else {
        (
            Status::False,
            "NotDeleting",
            "the cluster is not being deleted",
        )
    };
    Condition {
        type_: "Deleting",
        status,
        reason,
        message: message.into(),
        since,
    }
}

/// The control plane's machines counted as Cluster API's KubeadmControlPlane counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicas {
    /// Control-plane machines (leaving ones included, until they are gone).
    pub replicas: i64,
    /// Those whose agent last reported healthy.
    pub ready: i64,
    /// Those running their newest generation.
    pub up_to_date: i64,
    /// One of them finished its boot: the control plane came up at least once.
    pub initialized: bool,
}

/// Whether a pool's worker runs what the pool asks of it: its desired generation, of the pool's
/// release `release` (a worker of another release is replaced, not updated, so its generation
/// alone would call it up to date while its pool's version changes).
pub fn pool_node_up_to_date(node: &NodeRow, release: &str) -> bool {
    node.up_to_date() && node.kubernetes_version.as_deref() == Some(release)
}

/// A worker pool's `[replicas, ready, up to date]`: its nodes not being removed, those healthy,
/// and those healthy on their desired generation of the pool's release `release`.
pub fn pool_replicas<'a>(nodes: impl Iterator<Item = &'a NodeRow>, release: &str) -> [i64; 3] {
    let active: Vec<&NodeRow> = nodes.filter(|n| n.removal.is_none()).collect();
    let count = |keep: &dyn Fn(&NodeRow) -> bool| {
        i64::try_from(active.iter().filter(|n| keep(n)).count()).unwrap_or(i64::MAX)
    };
    [
        count(&|_| true),
        count(&|n| n.phase.healthy()),
        count(&|n| n.phase.healthy() && pool_node_up_to_date(n, release)),
    ]
}

pub fn replicas(nodes: &[NodeRow]) -> Replicas {
    let control_plane: Vec<&NodeRow> = nodes
        .iter()
        .filter(|n| n.role == exk8s_common::contract::Role::ControlPlane)
        .collect();
    let count = |keep: &dyn Fn(&NodeRow) -> bool| {
        i64::try_from(control_plane.iter().filter(|n| keep(n)).count()).unwrap_or(i64::MAX)
    };
    Replicas {
        replicas: count(&|_| true),
        ready: count(&|n| n.phase.healthy()),
        up_to_date: count(&|n| n.up_to_date()),
        initialized: control_plane.iter().any(|n| n.phase.completed()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::phase::ClusterPhase;

    #[test]
    fn deleting_is_true_only_while_the_cluster_is_deleted() {
        let gone = deleting(ClusterPhase::Deleting, 1_700_000_000);
        assert_eq!((gone.status, gone.reason), (Status::True, "Deleting"));
        assert_eq!(gone.since, 1_700_000_000);
        for phase in [
            ClusterPhase::Provisioning,
            ClusterPhase::Founded,
            ClusterPhase::Compensating,
            ClusterPhase::Failed,
        ] {
            assert_eq!(deleting(phase, 0).status, Status::False, "{phase:?}");
        }
    }

    #[test]
    fn a_pools_worker_of_another_release_is_not_up_to_date() {
        use crate::upgrade::state::tests::node;
        // Mid-replacement after the pool's version moved to v1.36.3: two workers of v1.35.3 at
        // their desired generation (they are replaced, not updated), one of v1.36.3, and one
        // still booting (no release reported yet).
        let mut workers = [
            node(1, "v1.35.3", [3, 3, 3]),
            node(2, "v1.35.3", [3, 3, 3]),
            node(3, "v1.36.3", [1, 1, 1]),
            node(4, "v1.36.3", [1, 0, 1]),
        ];
        workers[3].kubernetes_version = None;
        workers[3].phase = crate::lifecycle::NodePhase::Pending;
        assert_eq!(pool_replicas(workers.iter(), "v1.36.3"), [4, 3, 1]);
        let up: Vec<bool> = workers
            .iter()
            .map(|n| pool_node_up_to_date(n, "v1.36.3"))
            .collect();
        assert_eq!(up, [false, false, true, false]);
        // Once every worker runs the pool's release, all of them are.
        assert_eq!(pool_replicas(workers[..3].iter(), "v1.35.3"), [3, 3, 2]);
    }
}
