//! The rollout gate: may a node take its next generation now? A control-plane node only while
//! every other control-plane node (but one being removed) is healthy at what it applied and
//! none is in the middle of an update; a worker always (pools drain before they delete).

use exk8s_common::contract::Role;

use crate::db::nodes::NodeRow;
use crate::db::phase::EtcdMembership;

/// Why a node must wait for its update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Another control-plane node is applying its update.
    AnotherNodeUpdating,
    /// Another control-plane node is not healthy at the generation it applied.
    AnotherNodeUnhealthy { vm_id: i64, phase: String },
    /// The upgrade's preflight etcd snapshot `id` is not stored: no member changes version.
    UpgradeSnapshot { id: i64, wait: SnapshotWait },
}

/// Why the upgrade's preflight snapshot is not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotWait {
    /// `member` is asked to take and upload it.
    Taking { member: String },
    /// It failed (`error` says why): the upgrade stops until it is asked for again.
    Failed { error: String },
    /// Deleted before it was stored.
    Gone,
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AnotherNodeUpdating => {
                f.write_str("another control-plane node is applying its update")
            }
            Self::AnotherNodeUnhealthy { vm_id, phase } => write!(
                f,
                "control-plane node {vm_id} is not healthy (last report: {phase})"
            ),
            Self::UpgradeSnapshot { id, wait } => match wait {
                SnapshotWait::Taking { member } => write!(
                    f,
                    "the upgrade waits for etcd snapshot {id}, which {member} is taking"
                ),
                SnapshotWait::Failed { error } => write!(
                    f,
                    "the upgrade is stopped: its etcd snapshot {id} failed ({error}); PATCH \
                     the version again to take another, or with \"snapshot_first\": false to \
                     go on without one"
                ),
                SnapshotWait::Gone => write!(
                    f,
                    "the upgrade is stopped: its etcd snapshot {id} was deleted before it was \
                     stored; PATCH the version again to take another"
                ),
            },
        }
    }
}

/// May `node` take its next generation now, given every node of its cluster?
pub fn gate(node: &NodeRow, cluster_nodes: &[NodeRow]) -> Result<(), Hold> {
    if node.role != Role::ControlPlane || node.handed_generation >= node.desired_generation {
        return Ok(());
    }
    // A member being removed holds nobody: it may be dead, and its removal is the update.
    let others = cluster_nodes.iter().filter(|n| {
        n.id != node.id
            && n.role == Role::ControlPlane
            && n.etcd_membership != Some(EtcdMembership::Leaving)
    });
    for other in others {
        if other.in_flight() {
            return Err(Hold::AnotherNodeUpdating);
        }
        if !other.phase.healthy() {
            return Err(Hold::AnotherNodeUnhealthy {
                vm_id: other.vm_id,
                phase: other.phase.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use exk8s_common::contract::{BootPhase, ReportState};

    use super::*;
    use crate::lifecycle::NodePhase;

    fn node(id: i64, handed: i64, applied: i64, desired: i64, phase: NodePhase) -> NodeRow {
        NodeRow {
            id,
            cluster_id: 1,
            ordinal: id,
            vm_id: 100 + id,
            node_name: format!("cp-{id}"),
            private_ipv4: "10.0.0.1".into(),
            private_ipv6: None,
            public_ipv4: None,
            is_initial: id == 1,
            serial: 1,
            issuance_allowed: false,
            role: Role::ControlPlane,
            phase,
            desired_generation: desired,
            handed_generation: handed,
            applied_generation: applied,
            node_key: None,
            pool_id: None,
            removal: None,
            removal_since: None,
            drain_by: None,
            drain_generation: None,
            etcd_membership: Some(crate::db::phase::EtcdMembership::Voter),
            replace_since: None,
            handed_version: None,
            kubernetes_version: None,
            last_seen_at: None,
            agent_version: None,
            vm_state: None,
            vm_down_since: None,
            silence_counts_from: None,
            created_at: 0,
        }
    }

    const HEALTHY: NodePhase = NodePhase::Reported {
        phase: BootPhase::Complete,
        state: ReportState::Succeeded,
    };
    const SYNC_FAILED: NodePhase = NodePhase::Reported {
        phase: BootPhase::Sync,
        state: ReportState::Failed,
    };

    #[test]
    fn one_control_plane_node_at_a_time_and_only_beside_healthy_ones() {
        let all = [
            node(1, 1, 1, 2, HEALTHY),
            node(2, 1, 1, 2, HEALTHY),
            node(3, 1, 1, 2, HEALTHY),
        ];
        assert_eq!(gate(&all[0], &all), Ok(()));
        // Node 1 took generation 2 and has not applied it: the others wait.
        let all = [
            node(1, 2, 1, 2, HEALTHY),
            node(2, 1, 1, 2, HEALTHY),
            node(3, 1, 1, 2, HEALTHY),
        ];
        assert_eq!(gate(&all[1], &all), Err(Hold::AnotherNodeUpdating));
        assert_eq!(
            gate(&all[0], &all),
            Ok(()),
            "the node in flight may fetch again"
        );
        // Node 1 failed its sync and restored: the rollout holds until it is healthy.
        let all = [node(1, 2, 1, 2, SYNC_FAILED), node(2, 1, 1, 2, HEALTHY)];
        assert_eq!(gate(&all[1], &all), Err(Hold::AnotherNodeUpdating));
        let all = [node(1, 1, 1, 2, SYNC_FAILED), node(2, 1, 1, 2, HEALTHY)];
        assert!(matches!(
            gate(&all[1], &all),
            Err(Hold::AnotherNodeUnhealthy { vm_id: 101, .. })
        ));
        // Workers are not held by the control plane's rollout.
        let mut worker = node(4, 1, 1, 2, HEALTHY);
        worker.role = Role::Worker;
        assert_eq!(gate(&worker, &all), Ok(()));
    }
}
